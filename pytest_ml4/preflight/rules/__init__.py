"""The preflight rules, every one registered in :data:`RULES` (id -> :class:`Rule`) when this package is imported.

Every rule is declared with :func:`~pytest_ml4.preflight.rules.registry.rule` in one of the modules of this
package. A rule has an id, a severity, a one-line message, the fix, and ``source``: the seed line or reference
fact it encodes (``seeds/000`` = the RTX PRO write-up, ``seeds/002`` = the Dynamo recipe).
"""

from __future__ import annotations

# Importing the modules registers their rules (in import order).
from pytest_ml4.preflight.rules import (  # noqa: F401
    dynamo,
    engine,
    perf,
    proxy,
    secrets,
    target,
)
from pytest_ml4.preflight.rules.registry import RULES, rule

__all__ = ["RULES", "rule"]
