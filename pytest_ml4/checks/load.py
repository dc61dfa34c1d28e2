"""Correctness under load: the functional probes sent beside each load phase answered as the single-request suites
require (:mod:`pytest_ml4.perf.probes` sends and judges them with those suites' own verdicts; this module reports
the first violation with the phase, its load, the probe and the answer's transcript). Nothing here needs pytest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pytest_ml4.checks.chat import attach
from pytest_ml4.checks.codes import fail, fails_with
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.perf.probes import LoadAnswers, PhaseProbes, first_violation


def assert_answers_correct_under_load(kind: str, found: Sequence[PhaseProbes], folders: Sequence[Path | str],
                                      why_unprobed: str | None = None,
                                      load: Sequence[LoadAnswers] = ()) -> int:
    """Every probe answer of the ``kind`` phases passed its verdict; fails (``load.answer_wrong``) naming the phase,
    its load, the probe and the first violation, its transcript attached. Then the load's own answers
    (:func:`assert_load_answers_consistent`). Not judged when no probe was answered (the probes were off, aiperf
    never profiled, or the runs went elsewhere: ``why_unprobed``). Returns the probes judged."""
    sent = sum(len(p.judged) for p in found)   # a probe cut off by the phase's end is not judged
    _fail_on_first_probe_violation(kind, found, sent)
    assert_load_answers_consistent(load)
    if not sent:
        reasons = [f"{p.label}: {p.not_probed}" for p in found if p.not_probed]
        not_judged(f"{kind}: no probe answered beside the load ("
                   + ("; ".join(reasons) or why_unprobed or f"no probe findings in {', '.join(map(str, folders))}")
                   + ")")
    for p in found:
        print(p.describe())
    return sent


@fails_with("load.answer_wrong",
            "a functional probe sent beside a load phase got an answer that fails the single-request suites' verdict")
def _fail_on_first_probe_violation(kind: str, found: Sequence[PhaseProbes], sent: int) -> None:
    first = first_violation(found)
    if first is None:
        return
    if first.transcript is not None and first.transcript.is_file():
        attach(first.transcript, f"probe transcript: {first.result.probe}")
    wrong = sum(len(p.violations) for p in found)
    fail("load.answer_wrong", f"{first.describe()} ({wrong} of {sent} probe answers under {kind} load failed; "
                              f"transcript {first.transcript})")


@fails_with("load.reasoning_missing",
            "where the load's workload reasons, some of its answers (aiperf's per-request usage) report no reasoning "
            "tokens")
@fails_with("load.usage_inconsistent",
            "a load answer's usage does not add up (reasoning over completion tokens, prompt + completion != total)")
@fails_with("load.error_in_200",
            "load answers were HTTP 200 but ended without their usage (aiperf --use-server-token-count): an error "
            "body inside the 200 or a cut stream, which aiperf 0.13 counts as a success without recording the body")
def assert_load_answers_consistent(answers: Sequence[LoadAnswers]) -> None:
    """The load's own answers (aiperf's per-request usage): where the workload reasons, every answer reports its
    reasoning tokens (an answer without them had its reasoning left in content or dropped, ``load.reasoning_missing``);
    every answer's usage adds up (``load.usage_inconsistent``); no 200 ended without its usage (``load.error_in_200``).

    aiperf 0.13 does not record the body of a 200, nor an error event inside one (the request stays a success, its
    ``error_summary`` empty): the error body is judged by what it leaves in the record, an answer without the usage
    every finished answer carries under ``--use-server-token-count`` (:func:`~pytest_ml4.perf.probes.load_answers`)."""
    for a in answers:
        if a.unfinished:
            fail("load.error_in_200", f"{a.label}: {len(a.unfinished)} of {a.answered} load answers were HTTP 200 "
                                      f"that ended without their usage (first: request {a.unfinished[0]}): an error "
                                      f"body inside the 200 or a cut stream, which aiperf counts as a success")
        if a.reasons and a.unreasoned:
            fail("load.reasoning_missing", f"{a.label}: {len(a.unreasoned)} of {a.answered} load answers report no "
                                           f"reasoning tokens while {len(a.reasoned)} do (first: request "
                                           f"{a.unreasoned[0]}): the reasoning was not separated under load")
        if a.usage_wrong:
            fail("load.usage_inconsistent", f"{a.label}: {len(a.usage_wrong)} of {a.answered} load answers report "
                                            f"usage that does not add up, first {a.usage_wrong[0]}")
