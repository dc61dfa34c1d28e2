"""The preflight rule registry.

Every rule is declared with :func:`rule` in one of the modules of this package and lands in :data:`RULES`
(id -> :class:`Rule`).  A rule has an id, a severity, a one-line message, the fix, and ``source``: the seed
line or reference fact it encodes (``seeds/000`` = the RTX PRO write-up, ``seeds/002`` = the Dynamo recipe).
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_ml4.preflight.model import CheckFn, Rule, Severity

RULES: dict[str, Rule] = {}


def rule(id: str, severity: Severity, message: str, fix: str, source: str,
         kinds: tuple[str, ...]) -> Callable[[CheckFn], CheckFn]:
    """Register the decorated check function as rule ``id``."""
    def register(fn: CheckFn) -> CheckFn:
        if id in RULES:
            raise ValueError(f"duplicate preflight rule id {id}")
        RULES[id] = Rule(id=id, severity=severity, message=message, fix=fix, source=source, kinds=kinds, check=fn)
        return fn
    return register


def _load() -> None:
    # Importing the modules registers their rules (in import order).
    from pytest_ml4.preflight.rules import (
        dynamo,  # noqa: F401
        engine,  # noqa: F401
        perf,  # noqa: F401
        proxy,  # noqa: F401
        secrets,  # noqa: F401
        target,  # noqa: F401
    )


_load()

__all__ = ["RULES", "rule"]
