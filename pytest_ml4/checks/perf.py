"""Perf verdicts: every gate result of a sweep, a trace replay or a workload passed.

The gate results themselves (figure, limit and where the limit comes from) are computed in the core
(:mod:`pytest_ml4.perf.gates`, ``perf.goodput``, ``perf.capacity``) because the perf summary and the plots tabulate
them whether they pass or not; this module only judges them. Nothing here needs pytest.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_ml4.checks.codes import fail, fails_with, require
from pytest_ml4.perf.gates import GateResult, failures
from pytest_ml4.perf.trace import TraceReplay


@fails_with("perf.no_figures", "no sweep point produced figures: the gate judged nothing")
@fails_with("perf.error_rate", "requests failed beyond the target's error-rate limit")
@fails_with("perf.dynamo_gate", "decode tok/s/user P50 or TTFT P50 misses Dynamo's gate")
@fails_with("perf.dynamo_gate_undefined", "the target defines no Dynamo gate to judge")
@fails_with("perf.saturation",
            "decode concurrency does not saturate at max_num_seqs (or does not run together below it)")
@fails_with("perf.saturation_unread", "the decode concurrency of a point could not be read")
@fails_with("perf.baseline_regression", "a sweep figure regressed beyond its tolerance against the stored baseline")
def assert_gates_pass(results: Sequence[GateResult], none: str | None = None,
                      none_code: str = "perf.no_figures") -> None:
    """Every result passed, the message listing each failed one under the first one's code; ``none``: the message
    (``none_code`` the code) when there is no result at all (a gate that judged nothing is not a pass)."""
    if none is not None:
        require(results, none_code, none)
    failed = failures(results)
    if failed:
        fail(failed[0].code, "\n".join(str(r) for r in failed))


@fails_with("perf.no_figures")
@fails_with("perf.request_errors", "a sweep point had failed requests beyond gates.request_error_rate_max")
def assert_no_request_errors(results: Sequence[GateResult]) -> None:
    """The error-rate gate judged at least one point, and every point passed it."""
    require(results, "perf.no_figures", "no point produced figures")
    failed = failures(results)
    require(not failed, "perf.request_errors", lambda: "\n".join(str(r) for r in failed))


@fails_with("perf.knee", "the latency knee comes before the target's bound or the baseline's knee")
@fails_with("perf.knee_unbounded", "no bound to judge the latency knee by (gates.knee_not_before or a baseline)")
@fails_with("perf.goodput", "the share of requests meeting every SLO at the production rate is under the floor")
@fails_with("perf.capacity", "the declared capacity misses the goodput floor")
def assert_gate_passed(gate: GateResult) -> None:
    require(gate.passed, gate.code, lambda: str(gate))


@fails_with("perf.trace_unusable", "the trace replay is not a usable aiperf run")
@fails_with("perf.trace_incomplete", "trace rows did not complete in the measured window")
@fails_with("perf.trace_no_warmup", "the trace replay had no warmup phase")
@fails_with("perf.trace_off_schedule", "the trace was not replayed on its fixed schedule")
def assert_trace_replayed(replay: TraceReplay) -> None:
    """The replay ran (aiperf's problems otherwise), completed every row in the measured window after a warmup, on
    the trace's fixed schedule, and passed its gates."""
    point = replay.point
    require(point.ok, "perf.trace_unusable", lambda: "; ".join(point.problems))
    ex = point.export()
    require(ex.request_count == replay.rows, "perf.trace_incomplete",
            lambda: f"{ex.request_count} of {replay.rows} trace rows completed in the measured window")
    require(ex.warmup_metrics, "perf.trace_no_warmup", "no warmup phase: the measured window must follow a warmup")
    require(point.extra.get("replay_sched_lag_p99") is not None, "perf.trace_off_schedule",
            "not replayed on the trace's fixed schedule")
    assert_gates_pass(replay.gates)
