"""The agentic trace replay: the target's mooncake trace on its fixed schedule after a warmup, gated like a sweep
point (errors, and seed 002's Dynamo gate), its figures written to ``perf-summary.json``.

The short (CI) profile replays the first rows with the schedule compressed and outputs capped (the summary says
so). :func:`replay_agentic_trace` runs and records it; :func:`pytest_ml4.checks.perf.assert_trace_replayed` judges.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ml4.perf.evaluate import write_trace_outputs
from pytest_ml4.perf.gates import GateResult, dynamo_gates, error_gate
from pytest_ml4.perf.runner import trace_rows
from pytest_ml4.perf.sweep import (
    PointResult,
    SweepSettings,
    cached_json,
    run_trace,
    short_trace,
)
from pytest_ml4.target.model import Target

#: Trace rows the short (CI) profile replays.
TRACE_SHORT_ROWS = 16


class TraceMissing(Exception):
    """The target names no trace, or its file is not there: one line saying which."""


@dataclass
class TraceReplay:
    """One replay: the aiperf point, the rows it had to complete, and the gate results on its figures."""

    point: PointResult
    rows: int
    gates: list[GateResult] = field(default_factory=list)


def replay_agentic_trace(target: Target, client: Any, run_dir: Path, settings: SweepSettings,
                         write: Callable[[str], None] | None, simulated: bool) -> TraceReplay:
    """Replay the target's trace at the sweep's highest concurrency; the outputs are written whatever the outcome."""
    if not target.perf.trace:
        raise TraceMissing(f"target {target.name} names no perf.trace for the agentic replay")
    trace = target.resolve(target.perf.trace)
    if not trace.is_file():
        raise TraceMissing(f"trace not found: {trace} (generate it with scripts/make_trace.py)")
    out = run_dir / "perf" / "trace"
    if settings.short:
        replay = out / "trace-short.jsonl"
        rows = short_trace(trace, replay, rows=TRACE_SHORT_ROWS)
    else:
        replay, rows = trace, trace_rows(trace)
    warmup = target.perf.warmup_requests
    # Once per run folder: the replay's check and the probes' check beside it both read this run.
    point = PointResult(**cached_json(out / "run.json", lambda: run_trace(
        target, client, replay, out / "run", concurrency=max(settings.concurrencies), warmup_requests=warmup,
        write=write).as_dict()))
    gates = ([error_gate(point.point, target.gates.request_error_rate_max), *dynamo_gates(point.point, target)]
             if point.point is not None else [])
    write_trace_outputs(run_dir, target, replay, rows, warmup, point, gates, simulated)
    return TraceReplay(point, rows, gates)
