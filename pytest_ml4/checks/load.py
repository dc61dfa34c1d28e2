"""Correctness under load: the functional probes sent beside each load phase answered as the single-request suites
require (:mod:`pytest_ml4.perf.probes` sends and judges them with those suites' own verdicts; this module reports
the first violation with the phase, its load, the probe and the answer's transcript). Nothing here needs pytest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pytest_ml4.checks.chat import attach
from pytest_ml4.checks.codes import fail
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.perf.probes import PhaseProbes, first_violation


def assert_answers_correct_under_load(kind: str, found: Sequence[PhaseProbes], folders: Sequence[Path | str],
                                      why_unprobed: str | None = None) -> int:
    """Every probe answer of the ``kind`` phases passed its verdict; fails (``load.answer_wrong``) naming the phase,
    its load, the probe and the first violation, its transcript attached. Not judged when no probe was answered
    (the probes were off, aiperf never profiled, or the runs went elsewhere: ``why_unprobed``). Returns the probes
    judged."""
    sent = sum(len(p.results) for p in found)
    if not sent:
        reasons = [f"{p.label}: {p.not_probed}" for p in found if p.not_probed]
        not_judged(f"{kind}: no probe answered beside the load ("
                   + ("; ".join(reasons) or why_unprobed or f"no probe findings in {', '.join(map(str, folders))}")
                   + ")")
    first = first_violation(found)
    if first is not None:
        if first.transcript is not None and first.transcript.is_file():
            attach(first.transcript, f"probe transcript: {first.result.probe}")
        wrong = sum(len(p.violations) for p in found)
        fail("load.answer_wrong", f"{first.describe()} ({wrong} of {sent} probe answers under {kind} load failed; "
                                  f"transcript {first.transcript})")
    for p in found:
        print(p.describe())
    return sent
