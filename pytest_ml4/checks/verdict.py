"""A check that could not judge says so: ``raise NotJudged("why")`` instead of passing or skipping.

Every check of a run ends one of four ways: **passed**, **failed**, **not judged** (it applies to the deployment
but its evidence was missing: :class:`NotJudged`, whose reason says why and how to make it judgeable) or **does
not apply** (decided before any request, from the target: :data:`DOES_NOT_APPLY_PREFIX`). Neither of the last two
is ever a pass. A run with a not-judged check exits :data:`EXIT_NOT_JUDGED` unless the user allowed it
(``--ml4-allow-not-judged``); a failure wins (exit 1).

A gating check whose evidence is missing (no baseline for this deployment, no worker metrics URL, a header the
ingress strips) must never read as passed. Core code raises :class:`NotJudged`, which needs no pytest; the plugin
reports such a check with the outcome ``not_judged`` (shown by pytest as a skip whose reason starts with
:data:`NOT_JUDGED_PREFIX`), and ``summary.json`` counts it apart from passes and plain skips.
"""

from __future__ import annotations

from typing import NoReturn

#: How a not-judged check's reason starts wherever it is shown (console, JUnit, Allure, summary.json).
NOT_JUDGED_PREFIX = "not judged: "
#: How the reason of a check that does not apply to the target starts (a skip decided at collection).
DOES_NOT_APPLY_PREFIX = "does not apply: "
#: The run's exit status when no check failed but one was not judged. pytest uses 0-5 (``pytest.ExitCode``); a
#: release must not be signed over a gate that was not judged, so this is not 0, and it is not 1 (a failure).
EXIT_NOT_JUDGED = 6


class NotJudged(Exception):
    """The check ran but its evidence was missing; ``reason`` names what was missing and its likely cause."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return NOT_JUDGED_PREFIX + self.reason


def not_judged(reason: str) -> NoReturn:
    """Stop the check as not judged (see :class:`NotJudged`)."""
    raise NotJudged(reason)
