"""Stored perf baselines (``pytest_ml4/data/baselines/*.json``) and regression comparison.

A baseline holds, per concurrency, the figures of :class:`pytest_ml4.perf.figures.PointFigures` plus the
conditions it was measured under and a relative tolerance per figure. Comparison is direction-aware (throughput
lower is worse, latency higher is worse) and in the spirit of pytest-benchmark's ``--benchmark-compare-fail``:
``parse_compare_fail("itl_p50_ms:10%,tok_s_user:5%")`` gives thresholds that fail a run on a regression larger than
the given percentage. A short run (other OSL or duration than the baseline's) is compared only on the figures that
do not depend on the run length (``short_run_metrics``: per-token rates).

A printed table can contradict itself. At concurrency 1 a duration run is one request after another, so a row's
TTFT and ITL fix how many requests fit in the window (aiperf stops issuing at ``duration_s`` and drops a request
still running after ``grace_s``), and from that the aggregate throughput and the decode concurrency
(:func:`sequential_run`). Where a c1 figure differs from what the row's own TTFT and ITL imply by more than its
tolerance, comparisons use the implied value and say so (:meth:`Baseline.reference`); the printed value stays in the
file. Seed 000's c1 row is such a case: 7 requests at 67.9 tok/s with decode concurrency 1.0 cannot all hold.

The file is the one baseline format (:mod:`pytest_ml4.target.baselines`), kind ``perf``: ``figures`` is a list of points
``{"concurrency": int, figure: number, ...}``, ``tolerances`` the relative tolerance per figure, and two comparison
settings: ``value_max_concurrency`` (figure prefix -> the highest concurrency at which its value is comparable; TTFT
past the knee is queueing) and ``short_run_metrics``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pytest_ml4.perf.figures import PointFigures
from pytest_ml4.target.baselines import (
    DIRECTION,
    BaselineFile,
    BaselineRefused,
    Provenance,
    baseline_target,
    direction,
    read_baseline,
    write_baseline,
)

#: The c1 figures that follow from TTFT, ITL and the run window (see :func:`sequential_run`).
SEQUENTIAL_FIGURES = ("out_tok_s", "decode_conc_avg")


class BaselineError(ValueError):
    """A ``--perf-compare-fail`` expression that names no known figure or limit."""


class PerfPoint(BaseModel):
    """One stored point: its concurrency and its figures (:class:`~pytest_ml4.perf.figures.PointFigures`' names)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    concurrency: int

    def figures(self) -> dict[str, float]:
        """The point's numeric figures (a text or flag a recording kept beside them is not a figure)."""
        return {k: float(v) for k, v in (self.model_extra or {}).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}


class PerfBaselineFile(BaselineFile):
    """A perf baseline file: a list of points and the two comparison settings."""

    figures: list[PerfPoint]
    #: figure prefix -> highest concurrency at which its value is comparable.
    value_max_concurrency: dict[str, int] = Field(default_factory=dict)
    #: Figures that stay comparable when a run is short.
    short_run_metrics: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Baseline:
    """Reference perf figures per concurrency: the one perf baseline, read by the sweep's gate, its plots and
    ``ml4-report compare``."""

    name: str
    points: Mapping[int, Mapping[str, float]]
    tolerances: Mapping[str, float]
    provenance: Provenance
    conditions: Mapping[str, Any] = field(default_factory=dict)
    #: figure prefix -> highest concurrency at which its value is comparable (TTFT past the knee is queueing and
    #: depends on the run's length: compared by shape elsewhere).
    value_max_concurrency: Mapping[str, int] = field(default_factory=dict)
    #: Figures that stay comparable when a run is short (small OSL, seconds per point).
    short_run_metrics: tuple[str, ...] = ()
    path: Path | None = None

    @classmethod
    def load(cls, path: str | Path) -> Baseline:
        """Read a perf baseline; :class:`BaselineRefused` (one line naming the file) when it cannot serve."""
        stored = read_baseline(path, "perf", PerfBaselineFile)
        where = Path(path)
        undirected = sorted(set(stored.tolerances) - set(DIRECTION))
        if undirected:
            raise BaselineRefused(f"perf baseline {where}: tolerances for figures with no better direction: "
                                  f"{', '.join(undirected)} (known: {', '.join(sorted(DIRECTION))})")
        return cls(name=baseline_target(stored, where), points={pt.concurrency: pt.figures() for pt in stored.figures},
                   tolerances=stored.tolerances, conditions=stored.conditions, provenance=stored.provenance.view(),
                   value_max_concurrency=stored.value_max_concurrency,
                   short_run_metrics=tuple(stored.short_run_metrics), path=where)

    def tolerance(self, figure: str, default: float) -> float:
        return float(self.tolerances.get(figure, default))

    def comparable(self, figure: str, concurrency: int) -> bool:
        """Whether the figure's value at this concurrency may be compared (``value_max_concurrency``)."""
        return all(concurrency <= c for prefix, c in self.value_max_concurrency.items() if figure.startswith(prefix))

    def same_conditions(self, osl: int | None, duration_s: float | None) -> bool:
        """Whether a run is comparable figure by figure (same OSL and window as the baseline)."""
        return osl == self.conditions.get("osl") and duration_s == self.conditions.get("duration_s")

    def comparable_figures(self, concurrency: int, full_run: bool) -> list[str]:
        names = list(self.tolerances) if full_run else [m for m in self.short_run_metrics if m in self.tolerances]
        return [n for n in names if n in self.points.get(concurrency, {}) and self.comparable(n, concurrency)]

    def implied(self, concurrency: int) -> SequentialRun | None:
        """What the row's own TTFT p50 and ITL p50 imply for a c1 run under the baseline's conditions."""
        row = self.points.get(concurrency, {})
        cond = self.conditions
        needed = (row.get("ttft_p50_s"), row.get("itl_p50_ms"), cond.get("osl"), cond.get("duration_s"))
        if concurrency != 1 or any(v is None for v in needed):
            return None
        return sequential_run(row["ttft_p50_s"], row["itl_p50_ms"], int(cond["osl"]), float(cond["duration_s"]),
                              float(cond.get("grace_s", 30.0)))

    def reference(self, concurrency: int, figure: str) -> tuple[float, str]:
        """The value to compare a measured figure with, and a note when it is not the printed one.

        Raises KeyError when the baseline has no such figure at that concurrency.
        """
        printed = self.points[concurrency][figure]
        run = self.implied(concurrency) if figure in SEQUENTIAL_FIGURES else None
        if run is None:
            return printed, ""
        value = run.out_tok_s if figure == "out_tok_s" else run.decode_conc_avg
        if not value or abs(printed - value) / value <= self.tolerances.get(figure, 0.0) + 1e-9:
            return printed, ""
        return value, (f"printed {printed:.4g} contradicts the row's own TTFT p50 and ITL p50, which give "
                       f"{run.describe()}; compared with {value:.4g}")


@dataclass(frozen=True)
class SequentialRun:
    """A concurrency-1 aiperf duration run of fixed-length requests, worked out from one request's timing."""

    requests: int              # completed inside duration + grace
    window_s: float            # aiperf's phase window: last completion, or duration + grace if one was dropped
    out_tok_s: float           # output_token_throughput = completed tokens / window
    decode_conc_avg: float     # effective_decode_concurrency avg = time spent decoding / window
    request_s: float

    def describe(self) -> str:
        return (f"{self.requests} requests of {self.request_s:.1f} s in a {self.window_s:.0f} s window, "
                f"{self.out_tok_s:.1f} tok/s and decode concurrency {self.decode_conc_avg:.2f}")


def sequential_run(ttft_s: float, itl_ms: float, osl: int, duration_s: float, grace_s: float) -> SequentialRun:
    """Requests back to back: each takes TTFT + (OSL - 1) x ITL (aiperf's ITL definition).

    aiperf issues a new request while the clock is under ``duration_s`` and drops one still running at
    ``duration_s + grace_s``; a dropped request ends the window there, otherwise the last completion does. The
    sweep-line averages are taken over that window (aiperf ``metrics/accumulator.py``), which is what the
    simulator's c1 run reproduces.
    """
    decode_s = (osl - 1) * itl_ms / 1000.0
    request_s = ttft_s + decode_s
    if request_s <= 0 or duration_s <= 0:
        raise ValueError(f"a c1 run needs a positive request time and duration (got {request_s} s, {duration_s} s)")
    limit = duration_s + grace_s
    started = math.ceil(duration_s / request_s)          # starts at 0, T, 2T, ... while under duration_s
    done = min(started, int(limit // request_s))
    window = limit if done < started else done * request_s
    return SequentialRun(requests=done, window_s=window, out_tok_s=done * osl / window,
                         decode_conc_avg=done * decode_s / window, request_s=request_s)


@dataclass(frozen=True)
class Deviation:
    """One figure against the baseline."""

    concurrency: int
    figure: str
    measured: float
    baseline: float
    limit: float                # allowed relative change in the bad direction (0.1 = 10 %)
    note: str = ""              # why ``baseline`` is not the printed figure (Baseline.reference)

    @property
    def change(self) -> float:
        """Signed relative change, measured vs baseline."""
        return (self.measured - self.baseline) / self.baseline if self.baseline else 0.0

    @property
    def regression(self) -> float:
        """How much worse (positive) or better (negative) than the baseline, relative."""
        return -self.change * direction(self.figure)

    @property
    def within_band(self) -> bool:
        """Within ±limit either way (calibration: the simulator must match, not merely beat, the seed)."""
        return abs(self.change) <= self.limit + 1e-9

    @property
    def regressed(self) -> bool:
        return self.regression > self.limit + 1e-9

    def describe(self) -> str:
        return (f"c{self.concurrency} {self.figure}: {self.measured:.4g} vs baseline {self.baseline:.4g} "
                f"({self.change:+.1%}, limit {self.limit:.0%})" + (f" [{self.note}]" if self.note else ""))


def compare(points: Iterable[PointFigures], baseline: Baseline, *, full_run: bool,
            tolerances: Mapping[str, float] | None = None) -> list[Deviation]:
    """Deviations of every comparable figure; ``tolerances`` overrides the baseline's."""
    tol = dict(baseline.tolerances)
    if tolerances:
        tol.update(tolerances)
    out: list[Deviation] = []
    for fig in points:
        ref = baseline.points.get(fig.concurrency)
        if ref is None:
            continue
        names = baseline.comparable_figures(fig.concurrency, full_run)
        names += [n for n in (tolerances or {}) if n not in names and n in ref]
        for name in names:
            measured = fig.get(name)
            if measured is None or name not in tol:
                continue
            value, note = baseline.reference(fig.concurrency, name)
            out.append(Deviation(fig.concurrency, name, measured, value, tol[name], note))
    return out


_FAIL_EXPR = re.compile(r"^\s*([a-z0-9_]+)\s*:\s*([0-9.]+)\s*%\s*$")


def parse_compare_fail(expr: str | Sequence[str] | None) -> dict[str, float]:
    """``"itl_p50_ms:10%,tok_s_user:5%"`` -> ``{"itl_p50_ms": 0.10, "tok_s_user": 0.05}``."""
    if not expr:
        return {}
    items = expr.split(",") if isinstance(expr, str) else [e for x in expr for e in x.split(",")]
    out: dict[str, float] = {}
    for item in items:
        if not item.strip():
            continue
        m = _FAIL_EXPR.match(item)
        if not m or m.group(1) not in DIRECTION:
            raise BaselineError(f"bad --perf-compare-fail item '{item}': use FIGURE:N% with FIGURE one of "
                                f"{', '.join(sorted(DIRECTION))}")
        out[m.group(1)] = float(m.group(2)) / 100.0
    return out


def save_baseline(path: str | Path, name: str, points: Iterable[PointFigures], conditions: Mapping[str, Any],
                  tolerances: Mapping[str, float], provenance: Mapping[str, Any]) -> Path:
    """Write a sweep as a baseline file (``--perf-save``)."""
    keep = ("requests", "out_tok_s", "tok_s_user", "tok_s_user_p50", "ttft_p50_s", "ttft_p99_s", "itl_p50_ms",
            "itl_p99_ms", "decode_conc_avg", "reasoning_share")
    rows = []
    for fig in points:
        row: dict[str, Any] = {"concurrency": fig.concurrency}
        row.update({k: round(v, 4) for k in keep if (v := fig.get(k)) is not None})
        rows.append(row)
    return write_baseline(path, "perf", name, provenance, conditions, tolerances, rows,
                          short_run_metrics=["tok_s_user", "itl_p50_ms"])
