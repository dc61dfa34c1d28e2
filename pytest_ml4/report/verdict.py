"""The verdict at a glance: one line per area (suite) and one overall, the same wherever it is shown.

The console's last lines, ``summary.json``'s ``verdict`` block, ``ml4-report verdict [RUN]`` and the CI recipes'
job summary all come from :func:`run_verdict` over the run's checks, so they cannot disagree. An area is

* ``FAIL``: one of its checks failed or broke (the first one's message),
* ``NOT JUDGED``: none failed, one applies but could not be judged (its reason says how to make it judgeable),
* ``PASS``: none failed or went unjudged and at least one passed,
* ``DOES NOT APPLY``: every check of it was decided at collection not to apply to the target (the first reason),
* ``SKIPPED``: nothing ran for another reason (a plain skip: the first reason).

The overall verdict is the worst area's, except that a run which did not finish (interrupted, a usage or internal
error: its exit status says so) has ``NO VERDICT``; a ``PASS`` needs at least one passed check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pytest_ml4.checks.verdict import (
    DOES_NOT_APPLY_PREFIX,
    EXIT_NOT_JUDGED,
    NOT_JUDGED_PREFIX,
)
from pytest_ml4.report.labels import load_suites

PASS, FAIL, NOT_JUDGED, DOES_NOT_APPLY, SKIPPED, NO_VERDICT = (
    "PASS", "FAIL", "NOT JUDGED", "DOES NOT APPLY", "SKIPPED", "NO VERDICT")
#: Check outcome (summary.json) -> the area verdict it pulls towards; the first row present decides the area.
PRECEDENCE: tuple[tuple[tuple[str, ...], str], ...] = (
    (("failed", "broken"), FAIL),
    (("not_judged",), NOT_JUDGED),
    (("passed",), PASS),
    (("does_not_apply",), DOES_NOT_APPLY),
    (("skipped",), SKIPPED),
)
#: A suite gate of ``summary.json`` from its area verdict: its outcome, and ``passed`` (True only for a pass).
GATE_OUTCOMES = {FAIL: "failed", NOT_JUDGED: "not_judged", PASS: "passed", DOES_NOT_APPLY: "does_not_apply",
                 SKIPPED: "skipped"}
GATE_PASSED = {FAIL: False, PASS: True}
#: pytest exit statuses of a run that judged what it selected: 0 (passed), 1 (a check failed), 5 (nothing
#: selected) and :data:`EXIT_NOT_JUDGED`. Anything else (2 interrupted, 3 internal error, 4 usage) has no verdict.
FINISHED_EXITS = (0, 1, 5, EXIT_NOT_JUDGED)
#: Where the reason of a check with this outcome comes from: its message, without the outcome's own prefix.
_PREFIXES = {"not_judged": NOT_JUDGED_PREFIX, "does_not_apply": DOES_NOT_APPLY_PREFIX}


@dataclass(frozen=True)
class AreaVerdict:
    area: str
    verdict: str
    reason: str
    counts: dict[str, int]


@dataclass(frozen=True)
class RunVerdict:
    overall: str
    reason: str
    exit_status: int
    areas: list[AreaVerdict]

    def as_dict(self) -> dict[str, Any]:
        return {"overall": self.overall, "reason": self.reason, "exit_status": self.exit_status,
                "areas": [asdict(a) for a in self.areas]}


def _message(check: Mapping[str, Any]) -> str:
    """A check's message without the prefix of its outcome (``not judged: ``, ``does not apply: ``)."""
    message = str(check.get("message") or "").removeprefix("Skipped: ")
    return message.removeprefix(_PREFIXES.get(check.get("outcome", ""), "")).strip()


def _reason(check: Mapping[str, Any]) -> str:
    """One line: the check's name and the first line of its message."""
    name = str(check.get("nodeid", "")).rsplit("::", 1)[-1]
    message = _message(check)
    return f"{name}: {message.splitlines()[0]}" if message else name


def _area_order(areas: Iterable[str]) -> list[str]:
    known = [s for s in load_suites() if s != "default"]
    return sorted(areas, key=lambda a: (known.index(a) if a in known else len(known), a))


def area_verdict(area: str, checks: Sequence[Mapping[str, Any]]) -> AreaVerdict:
    counts = Counter(str(c.get("outcome")) for c in checks)
    for outcomes, verdict in PRECEDENCE:
        first = next((c for c in checks if c.get("outcome") in outcomes), None)
        if first is None:
            continue
        if verdict == PASS:
            others = {k: v for k, v in counts.items() if k != "passed"}
            reason = f"{counts['passed']} passed" + "".join(f", {v} {k.replace('_', ' ')}"
                                                            for k, v in sorted(others.items()))
        else:
            reason = _reason(first) + (f" (+{counts[first['outcome']] - 1} more)"
                                       if counts[first["outcome"]] > 1 else "")
        return AreaVerdict(area, verdict, reason, dict(counts))
    return AreaVerdict(area, SKIPPED, "no check", dict(counts))


def run_verdict(checks: Sequence[Mapping[str, Any]], exit_status: int) -> RunVerdict:
    """The per-area and overall verdict of a run's checks (``summary.json``'s ``checks``) and its exit status."""
    by_area: dict[str, list[Mapping[str, Any]]] = {}
    for c in checks:
        by_area.setdefault(str(c.get("suite") or "default"), []).append(c)
    areas = [area_verdict(a, by_area[a]) for a in _area_order(by_area)]
    counts = Counter(str(c.get("outcome")) for c in checks)
    if exit_status not in FINISHED_EXITS:
        return RunVerdict(NO_VERDICT, f"the run did not finish (exit {exit_status}): nothing to sign",
                          exit_status, areas)
    worst = next((v for _, v in PRECEDENCE if any(a.verdict == v for a in areas)), None)
    if worst is None or worst in (DOES_NOT_APPLY, SKIPPED):
        return RunVerdict(NO_VERDICT, "no check was judged", exit_status, areas)
    reasons = {
        FAIL: f"{counts['failed'] + counts['broken']} check(s) failed",
        NOT_JUDGED: (f"{counts['not_judged']} check(s) not judged: not a sign-off"
                     + ("" if exit_status == EXIT_NOT_JUDGED else " (allowed by --ml4-allow-not-judged)")),
        PASS: f"{counts['passed']} check(s) passed, none failed or went unjudged",
    }
    return RunVerdict(worst, reasons[worst], exit_status, areas)


def verdict_lines(verdict: RunVerdict) -> list[str]:
    """The lines shown at the end of the console, by ``ml4-report verdict`` and in CI job summaries."""
    width = max([len(a.area) for a in verdict.areas] + [len("overall")])
    lines = [f"{a.area:<{width}}  {a.verdict:<14}  {a.reason}" for a in verdict.areas]
    lines.append(f"{'overall':<{width}}  {verdict.overall:<14}  {verdict.reason} (exit {verdict.exit_status})")
    return lines


def skip_reasons(checks: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """Every check that did not run to a verdict, by outcome: ``{"not_judged": [{"nodeid", "reason"}], ...}``."""
    out: dict[str, list[dict[str, str]]] = {"not_judged": [], "does_not_apply": [], "skipped": []}
    for c in checks:
        if c.get("outcome") in out:
            out[str(c["outcome"])].append({"nodeid": str(c.get("nodeid")), "reason": _message(c)})
    return out
