"""The preflight rule registry: :func:`rule` declares a check function as a rule and lands it in :data:`RULES`.

Apart from the package's ``__init__`` (which imports every rule module so that all rules are registered) so that
the rule modules import the registry and not the package that imports them.
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
