"""Stable verdict codes: every failing verdict raises :class:`Violation` with a code beside its message.

A code (``tools.no_call``, ``kv.pool_short``) names WHAT property was violated; the message says the detail and is
free to change. Tests (the kill matrix) and tools read the code, people read the message.

A code is declared on the function that raises it: ``@fails_with("tools.no_call", "a tool call was due and none
came back")`` records the code, the one line on the property it stands for, and the function as the place it is
raised from, so the place cannot drift from the code. Another function raising a code declared elsewhere says so
with ``@fails_with("tools.no_call")``; a code's meaning is given once. The registry (:func:`known_codes`,
:func:`declared_origins`) imports every module of the package and of its suites to collect the declarations, so it
is complete before any test runs; an undeclared code is a programming error, raised as :class:`ValueError` where the
violation is built, so a typo cannot pass silently.

The plugin records each violation's code and origin in the JUnit report, and the kill matrix refuses a kill whose
check raised the right code from another place (a request helper's catch-all, a guard that fires before the
property is judged).

A :class:`Violation` is an :class:`AssertionError`, so it reads in pytest exactly like a failed ``assert``; its
``str`` is ``[code] message``.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import pkgutil
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pytest_ml4.locations import PACKAGE_PARENT, SUITES_PACKAGE, suites_dir

#: The package whose every module may declare codes; its suites (:func:`pytest_ml4.locations.suites_dir`) too.
DECLARING_PACKAGE = "pytest_ml4"
#: Modules the registry never imports: a ``__main__`` runs a program, a suites folder's conftest is pytest's.
NOT_IMPORTED = ("__main__", "conftest")
#: What a code looks like: ``<area>.<property>``, lowercase (a kill matrix's string of another form is a regex).
CODE_FORM = re.compile(r"[a-z0-9_]+(?:\.[a-z0-9_]+)+")

Raiser = TypeVar("Raiser", bound=Callable[..., Any])


class DeclarationError(ValueError):
    """A code not of the form ``<area>.<property>``, given two meanings, or raised where none is given."""


@dataclass(frozen=True)
class Declaration:
    """One ``@fails_with``: ``function`` (its :attr:`origin`, declared at :attr:`place`) fails with ``code``."""

    code: str
    #: The one line on the property the code stands for; empty where the meaning is given at another raiser.
    what: str
    #: ``module.function`` as :attr:`Violation.origin` names the raiser; a suite's is ``*test_x.function``: pytest
    #: imports a suite under a name of its choosing (``test_x`` from its rootdir, ``suites.test_x``).
    origin: str
    #: ``path:line`` of the declaration, for messages.
    place: str


@dataclass(frozen=True)
class Code:
    """A declared code: what it stands for, the origins allowed to raise it and where each is declared."""

    what: str
    origins: tuple[str, ...]
    places: tuple[str, ...]


def origin_of(function: Callable[..., Any]) -> str:
    """The origin :class:`Violation` will record for a violation ``function`` raises (the frame's code name)."""
    module, name = function.__module__, function.__code__.co_name
    if module.startswith(f"{DECLARING_PACKAGE}.") and not module.startswith(f"{SUITES_PACKAGE}."):
        return f"{module}.{name}"
    return f"*{module.rpartition('.')[2]}.{name}"


def _place(function: Callable[..., Any]) -> str:
    path = Path(function.__code__.co_filename)
    shown = path.relative_to(PACKAGE_PARENT) if path.is_relative_to(PACKAGE_PARENT) else path
    return f"{shown}:{function.__code__.co_firstlineno}"


def declaration(code: str, what: str, function: Callable[..., Any]) -> Declaration:
    """``function`` fails with ``code`` (``what``: its meaning, or empty where another raiser gives it)."""
    place = _place(function)
    if not CODE_FORM.fullmatch(code):
        raise DeclarationError(f"{place}: verdict code {code!r} is not <area>.<property> in lowercase")
    return Declaration(code, " ".join(what.split()), origin_of(function), place)


#: Every declaration made so far, each once: a module imported twice (by pytest and by the registry under another
#: name) or a copy of a suite declares the same code, meaning and origin again.
_DECLARED: dict[tuple[str, str, str], Declaration] = {}


def fails_with(code: str, what: str = "") -> Callable[[Raiser], Raiser]:
    """Declare that the decorated function raises ``code``; ``what`` is the one line on the property it stands
    for, given at one raiser of the code (the others name the code alone). Put it directly above the ``def``."""
    def declare(function: Raiser) -> Raiser:
        made = declaration(code, what, function)
        _DECLARED.setdefault((made.code, made.what, made.origin), made)
        return function
    return declare


def registry(declarations: Iterable[Declaration]) -> dict[str, Code]:
    """code -> :class:`Code`; :class:`DeclarationError` (one line naming the places) for a code given two
    meanings, or raised where no declaration gives it one."""
    declarations = list(declarations)
    meanings: dict[str, Declaration] = {}
    for made in declarations:
        first = meanings.setdefault(made.code, made) if made.what else made
        if first is not made and (first.what, first.origin) != (made.what, made.origin):
            raise DeclarationError(f"verdict code {made.code!r} is declared twice, at {first.place} ({first.origin}) "
                                   f"and at {made.place} ({made.origin}): give its meaning once, mark the other "
                                   f"raiser @fails_with({made.code!r})")
    raisers: dict[str, dict[str, str]] = {}
    for made in declarations:
        if made.code not in meanings:
            raise DeclarationError(f"{made.place}: {made.origin} fails with {made.code!r}, but no @fails_with gives "
                                   f"that code its meaning")
        raisers.setdefault(made.code, {}).setdefault(made.origin, made.place)
    return {code: Code(meanings[code].what, tuple(places), tuple(places.values()))
            for code, places in sorted(raisers.items())}


def _raise(name: str) -> NoReturn:
    raise ImportError(f"cannot import {name} to collect its verdict codes")


def _import_suites() -> None:
    """Import every suite pytest has not imported yet, by file (a source tree on ``PYTHONPATH`` has no
    ``pytest_ml4.suites`` to import from)."""
    folder = suites_dir()
    if folder is None:
        return
    loaded = {Path(file).resolve() for module in list(sys.modules.values())
              if isinstance(file := getattr(module, "__file__", None), str)}
    for found in pkgutil.iter_modules([str(folder)]):
        path = (folder / f"{found.name}.py").resolve()
        if found.name in NOT_IMPORTED or found.ispkg or path in loaded:
            continue
        name = f"{SUITES_PACKAGE}.{found.name}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            _raise(str(path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a dataclass in the suite looks its module up while the module runs
        spec.loader.exec_module(module)


@cache
def _import_declaring_modules() -> None:
    """Import every module that may declare a code: the registry is complete without running a test."""
    package = importlib.import_module(DECLARING_PACKAGE)
    for found in pkgutil.walk_packages(package.__path__, f"{DECLARING_PACKAGE}.", onerror=_raise):
        if found.name.rpartition(".")[2] not in NOT_IMPORTED:
            importlib.import_module(found.name)
    _import_suites()


@cache
def _registry_of(declarations: tuple[Declaration, ...]) -> dict[str, Code]:
    return registry(declarations)


def _registry() -> dict[str, Code]:
    _import_declaring_modules()
    return _registry_of(tuple(_DECLARED.values()))


def known_codes() -> dict[str, str]:
    """code -> what it stands for, from every declaration in the package and its suites."""
    return {code: declared.what for code, declared in _registry().items()}


def declared_origins(code: str) -> tuple[str, ...]:
    """The ``module.function`` patterns allowed to raise ``code`` (empty: not declared)."""
    declared = _registry().get(code)
    return declared.origins if declared else ()


def declared_places(code: str) -> tuple[str, ...]:
    """Where ``code`` is declared (``path:line``), one place per origin."""
    declared = _registry().get(code)
    return declared.places if declared else ()


def origin_allowed(code: str, origin: str) -> bool:
    """Whether ``origin`` (a :attr:`Violation.origin`) is a function declared to raise ``code``."""
    return any(fnmatch.fnmatchcase(origin, pattern) for pattern in declared_origins(code))


def _declared(code: str) -> bool:
    """Whether ``code`` is declared: first among the modules imported so far (the raiser's module is), else in the
    whole registry, whose first build imports every declaring module."""
    return any(made.code == code and made.what for made in list(_DECLARED.values())) or code in known_codes()


def _origin(depth: int) -> str:
    """``module.function`` of the frame that raised the violation: a code raised from a place the registry does
    not expect is visible to whoever checks it."""
    frame = sys._getframe(depth)  # the cheapest way to name the raising function
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"


class Violation(AssertionError):
    """A check's verdict failed: ``code`` is stable (declared with :func:`fails_with`), ``message`` is for
    people."""

    def __init__(self, code: str, message: str, *, origin: str | None = None, _depth: int = 2) -> None:
        if not _declared(code):
            raise ValueError(f"verdict code {code!r} is not declared: no @fails_with({code!r}, ...) in "
                             f"{DECLARING_PACKAGE} or its suites")
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
