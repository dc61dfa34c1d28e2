"""A check that could not judge says so: ``raise NotJudged("why")`` instead of passing or skipping.

A gating check whose evidence is missing (no baseline for this deployment, no worker metrics URL, a header the
ingress strips) must never read as passed. Core code raises :class:`NotJudged`, which needs no pytest; the plugin
reports such a check with the outcome ``not_judged`` (shown by pytest as a skip whose reason starts with
:data:`NOT_JUDGED_PREFIX`), and ``summary.json`` counts it apart from passes and plain skips.
"""

from __future__ import annotations

from typing import NoReturn

#: How a not-judged check's reason starts wherever it is shown (console, JUnit, Allure, summary.json).
NOT_JUDGED_PREFIX = "not judged: "


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
