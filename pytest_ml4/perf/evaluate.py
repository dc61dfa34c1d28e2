"""Judge a finished sweep against the target's gates and baseline, and write its plots and summary.

Core code shared by the perf suite and the benchmark scripts (no pytest).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ml4.perf import gates as g
from pytest_ml4.perf.baseline import Baseline, Deviation, compare
from pytest_ml4.perf.figures import PointFigures
from pytest_ml4.perf.plots import write_plots
from pytest_ml4.perf.roofline import Roofline, roofline
from pytest_ml4.perf.summary import deviation_dicts, gate_dicts, update_summary
from pytest_ml4.perf.sweep import PROBES_BESIDE, PointResult, SweepSettings
from pytest_ml4.target.model import Target


@dataclass
class SweepVerdict:
    gates: list[g.GateResult]
    deviations: list[Deviation]
    knee: int | None
    roofline: Roofline | None  # None: the target gives no memory bandwidth
    full_run: bool
    baseline_path: str | None = None

    def by_gate(self, prefix: str) -> list[g.GateResult]:
        return [r for r in self.gates if r.gate == prefix or r.gate.startswith(prefix + ":")]

    @property
    def failures(self) -> list[g.GateResult]:
        return g.failures(self.gates)

    @property
    def passed(self) -> bool:
        return not self.failures


def figures_of(points: Sequence[PointResult]) -> list[PointFigures]:
    return [p.point for p in points if p.point is not None]


def baseline_knee(baseline: Baseline, limit_s: float) -> int | None:
    for c in sorted(baseline.points):
        if baseline.points[c].get("ttft_p99_s", 0.0) > limit_s:
            return c
    return None


def knee_bound(target: Target, baseline: Baseline | None, limit_s: float) -> int | None:
    """The concurrency the knee must not precede: the later of the target's stated bound and the baseline's knee."""
    bounds = [b for b in (target.gates.knee_not_before,
                          baseline_knee(baseline, limit_s) if baseline is not None else None) if b is not None]
    return max(bounds) if bounds else None


def evaluate_sweep(target: Target, settings: SweepSettings, points: Sequence[PointResult],
                   baseline: Baseline | None = None, compare_fail: Mapping[str, float] | None = None) -> SweepVerdict:
    figs = figures_of(points)
    results: list[g.GateResult] = []
    for p in points:
        results.append(g.GateResult("run", p.concurrency, p.ok, "usable aiperf run" if p.ok
                                    else "; ".join(p.problems)))
    beside = {p.concurrency: int(p.extra.get(PROBES_BESIDE, 0)) for p in points}
    for f in figs:
        results += g.point_gates(f, target)
        results.append(g.saturation_gate(f, target.engine.max_num_seqs, beside.get(f.concurrency, 0)))
    limit = target.gates.ttft_p99_knee_s
    not_before = knee_bound(target, baseline, limit)
    results.append(g.knee_gate(figs, limit, not_before))
    deviations: list[Deviation] = []
    full = False
    if baseline is not None:
        full = baseline.same_conditions(settings.osl, settings.duration_s)
        deviations = compare(figs, baseline, full_run=full, tolerances=compare_fail)
        results += g.baseline_gates(deviations)
    c1 = next((f for f in figs if f.concurrency == 1), None)
    roof = roofline(target, c1.tok_s_user if c1 else None, 1 if c1 else None)
    return SweepVerdict(gates=results, deviations=deviations, knee=g.latency_knee(figs, limit), roofline=roof,
                        full_run=full, baseline_path=str(baseline.path) if baseline and baseline.path else None)


def _rel(path: str | Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


@dataclass
class SweepOutputs:
    plots: list[Path] = field(default_factory=list)
    summary: Path | None = None


def _point_dicts(points: Sequence[PointResult], run_dir: Path) -> list[dict[str, Any]]:
    return [{**(p.figures or {"concurrency": p.concurrency}), "ok": p.ok, "problems": p.problems,
             "artifact_dir": _rel(p.out_dir, run_dir)} for p in points]


def write_interrupted_sweep(run_dir: Path, target: Target, settings: SweepSettings, points: Sequence[PointResult],
                            simulated: bool, interrupted_at: int) -> Path:
    """The ``sweep`` section of a sweep stopped by Ctrl-C: the finished points, no gates, never a pass."""
    section: dict[str, Any] = {
        "settings": settings.as_dict(),
        "points": _point_dicts(points, run_dir),
        "interrupted_at_concurrency": interrupted_at,
        "gates": [],
        "passed": False,
    }
    return update_summary(run_dir, target.name, simulated, "sweep", section)


def write_sweep_outputs(run_dir: Path, target: Target, settings: SweepSettings, points: Sequence[PointResult],
                        verdict: SweepVerdict, baseline: Baseline | None, simulated: bool,
                        out_dir: Path | None = None) -> SweepOutputs:
    """Plots (baseline overlaid) into ``out_dir`` (default ``run_dir/perf``) and the ``sweep`` summary section."""
    folder = out_dir or run_dir / "perf"
    title = f"{target.name}{' (simulated)' if simulated else ''}, ISL {settings.isl} OSL {settings.osl}"
    plots = write_plots(figures_of(points), folder, title, baseline, settings.conditions())
    section: dict[str, Any] = {
        "settings": settings.as_dict(),
        "points": _point_dicts(points, run_dir),
        "knee_concurrency": verdict.knee,
        "knee_ttft_p99_s": target.gates.ttft_p99_knee_s,
        "gates": gate_dicts(verdict.gates),
        "conditions": settings.conditions(),
        "baseline": None if baseline is None else {"path": verdict.baseline_path, "full_run": verdict.full_run,
                                                   "conditions": dict(baseline.conditions),
                                                   "provenance": baseline.provenance.as_dict(),
                                                   "deviations": deviation_dicts(verdict.deviations)},
        "roofline": verdict.roofline.as_dict() if verdict.roofline else None,
        "plots": [_rel(p, run_dir) for p in plots],
        "passed": verdict.passed,
    }
    summary = update_summary(run_dir, target.name, simulated, "sweep", section)
    return SweepOutputs(plots=plots, summary=summary)


def write_trace_outputs(run_dir: Path, target: Target, trace: Path, rows: int, warmup: int, point: PointResult,
                        gate_results: Sequence[g.GateResult], simulated: bool) -> Path:
    section = {
        "settings": {"trace": str(trace), "rows": rows, "warmup_requests": warmup, "concurrency": point.concurrency},
        "point": {**(point.figures or {}), "ok": point.ok, "problems": point.problems,
                  "artifact_dir": _rel(point.out_dir, run_dir), **point.extra},
        "gates": gate_dicts(gate_results),
        "passed": point.ok and not g.failures(gate_results),
    }
    return update_summary(run_dir, target.name, simulated, "trace", section)
