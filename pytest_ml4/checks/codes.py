"""Stable verdict codes: every failing verdict raises :class:`Violation` with a code beside its message.

A code (``tools.no_call``, ``kv.pool_short``) names WHAT property was violated; the message says the detail and is
free to change. Tests (the kill matrix) and tools read the code, people read the message. Codes are declared in
``pytest_ml4/data/verdicts/codes.yaml`` (code -> one line on the property it stands for): an undeclared code is a
programming error, raised as :class:`ValueError` where the violation is built, so a typo cannot pass silently.

A code may also say where it is raised: ``code: {what: <one line>, from: [<module.function>, ...]}`` (``*`` as a
wildcard). The plugin records each violation's code and origin in the JUnit report, and the kill matrix refuses a
kill whose check raised the right code from another place (a request helper's catch-all, a guard that fires
before the property is judged). A plain ``code: description`` line declares the code without judging its origin.

A :class:`Violation` is an :class:`AssertionError`, so it reads in pytest exactly like a failed ``assert``; its
``str`` is ``[code] message``.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import NoReturn

import yaml

CODES_FILE = Path(__file__).resolve().parent.parent / "data" / "verdicts" / "codes.yaml"


@cache
def _declarations() -> dict[str, tuple[str, tuple[str, ...]]]:
    """code -> (what it stands for, the ``module.function`` patterns allowed to raise it), from ``codes.yaml``."""
    data = yaml.safe_load(CODES_FILE.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise TypeError(f"{CODES_FILE}: expected a mapping code -> description")
    return {str(code): _declaration(str(code), raw) for code, raw in data.items()}


def _declaration(code: str, raw: object) -> tuple[str, tuple[str, ...]]:
    if not isinstance(raw, dict):
        return str(raw), ()
    unknown = sorted(set(raw) - {"what", "from"})
    if unknown or "what" not in raw:
        raise TypeError(f"{CODES_FILE}: {code}: expected a description or {{what, from}}, got keys {sorted(raw)}")
    origins = raw.get("from") or []
    return str(raw["what"]), tuple(map(str, [origins] if isinstance(origins, str) else origins))


def known_codes() -> dict[str, str]:
    """code -> what it stands for, from ``codes.yaml``."""
    return {code: what for code, (what, _) in _declarations().items()}


def declared_origins(code: str) -> tuple[str, ...]:
    """The ``module.function`` patterns codes.yaml allows to raise ``code`` (empty: not declared, not judged)."""
    return _declarations().get(code, ("", ()))[1]


def origin_allowed(code: str, origin: str) -> bool:
    """Whether ``origin`` (a :attr:`Violation.origin`) is a place codes.yaml allows to raise ``code``."""
    allowed = declared_origins(code)
    return not allowed or any(fnmatch.fnmatchcase(origin, pattern) for pattern in allowed)


def _origin(depth: int) -> str:
    """``module.function`` of the frame that raised the violation: a code raised from a place the registry does
    not expect is visible to whoever checks it."""
    frame = sys._getframe(depth)  # the cheapest way to name the raising function
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"


class Violation(AssertionError):
    """A check's verdict failed: ``code`` is stable (codes.yaml), ``message`` is for people."""

    def __init__(self, code: str, message: str, *, origin: str | None = None, _depth: int = 2) -> None:
        if code not in known_codes():
            raise ValueError(f"verdict code {code!r} is not declared in {CODES_FILE}")
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message
        self.origin = origin or _origin(_depth)


def fail(code: str, message: str) -> NoReturn:
    """Fail the check with ``code`` (see :class:`Violation`)."""
    raise Violation(code, message, _depth=3)


def require(condition: object, code: str, message: str | Callable[[], str]) -> None:
    """Fail with ``code`` unless ``condition`` holds; a callable message is built only on failure."""
    if not condition:
        raise Violation(code, message() if callable(message) else message, _depth=3)
