"""Matplotlib PNG plots of a sweep, with the stored baseline overlaid (dashed) where it is comparable.

* ``throughput.png``: aggregate output tok/s and per-user tok/s vs concurrency;
* ``ttft.png``: TTFT p50/p99 vs concurrency (log scale: past the knee it is queueing, minutes);
* ``itl.png``: ITL p50/p99 vs concurrency.

A baseline line is drawn only for a figure the baseline can be compared on (:class:`BaselineOverlay`): every figure
when the run's ISL, OSL and duration are the baseline's, otherwise only the figures the gate compares across run
lengths (``short_run_metrics``). Its legend entry always names the baseline's conditions; a panel whose baseline is
left out says why. ``plots.json`` beside the PNGs records each panel's legend and notes as drawn (read by tests
and reviewers without looking at pixels).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_ml4.perf.baseline import Baseline
from pytest_ml4.perf.figures import PointFigures
from pytest_ml4.target.baselines import conditions_differ

#: The run conditions a perf figure depends on (what ``Baseline.same_conditions`` and the legend look at).
RUN_CONDITION_KEYS = ("isl", "osl", "duration_s")
SIDECAR = "plots.json"


def conditions_text(cond: Mapping[str, Any]) -> str:
    """``"ISL 512, OSL 4096, 300 s per point"``."""
    dur = cond.get("duration_s")
    return f"ISL {cond.get('isl')}, OSL {cond.get('osl')}, " + (f"{dur:g} s per point" if dur is not None
                                                                  else "duration ?")


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend, imported on the first drawing: importing it costs ~0.4 s of
    CPU, paid otherwise by every run that loads the plugin (a smoke gate, each kill-matrix run) and draws nothing."""
    import matplotlib

    matplotlib.use("Agg")  # no display in CI; must precede pyplot
    import matplotlib.pyplot as plt

    return plt


def write_png(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` and close it. Written then renamed: xdist workers sharing a run may both draw it;
    readers never see half a PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.png")
    fig.savefig(tmp, dpi=90)
    pyplot().close(fig)
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class BaselineOverlay:
    """Which baseline figures a plot may draw, and how it labels and explains them."""

    points: Mapping[int, Mapping[str, float]]
    conditions: str                        # the baseline's, for every legend entry
    drawn: frozenset[str]                  # figures drawn
    why_not: str = ""                      # note on a panel whose figures are left out
    compared_note: str = ""                # added to labels drawn across conditions

    def label(self, figure_label: str) -> str:
        return f"{figure_label} (baseline:\n{self.conditions}{self.compared_note})"


def overlay_for(baseline: Baseline, run: Mapping[str, Any]) -> BaselineOverlay:
    """The overlay of ``baseline`` on a run measured under ``run`` (isl, osl, duration_s)."""
    stored = {k: baseline.conditions.get(k) for k in RUN_CONDITION_KEYS}
    text = conditions_text(stored)
    figures = {name for row in baseline.points.values() for name in row}
    differ = conditions_differ(stored, run, RUN_CONDITION_KEYS)
    if not differ:
        return BaselineOverlay(baseline.points, text, frozenset(figures))
    compared = frozenset(m for m in baseline.short_run_metrics if m in baseline.tolerances)
    why = (f"baseline ({text}) not drawn: measured under other conditions than this run ({conditions_text(run)}); "
           + (f"the gate compares only {', '.join(sorted(compared))}" if compared else "the gate compares nothing"))
    return BaselineOverlay(baseline.points, text, compared, why, "; per-token rate, compared")


def _series(points: Sequence[PointFigures], name: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for p in sorted(points, key=lambda f: f.concurrency):
        v = p.get(name)
        if v is not None:
            xs.append(p.concurrency)
            ys.append(v)
    return xs, ys


def _baseline_series(overlay: BaselineOverlay | None, name: str) -> tuple[list[int], list[float]]:
    if overlay is None or name not in overlay.drawn:
        return [], []
    pts = sorted((c, row[name]) for c, row in overlay.points.items() if name in row)
    return [c for c, _ in pts], [v for _, v in pts]


def _panel(ax, points, overlay: BaselineOverlay | None, names: Sequence[tuple[str, str]], ylabel: str,
           log_y: bool = False) -> dict[str, Any]:
    plotted: list[float] = []
    left_out = False
    for name, label in names:
        xs, ys = _series(points, name)
        plotted += [y for y in ys if y is not None]
        line, = ax.plot(xs, ys, marker="o", label=label)
        bx, by = _baseline_series(overlay, name)
        if bx:
            ax.plot(bx, by, linestyle="--", marker="x", color=line.get_color(), alpha=0.7,
                    label=overlay.label(label))
        elif overlay is not None and any(name in row for row in overlay.points.values()):
            left_out = True
    if left_out and overlay is not None and overlay.why_not:
        ax.text(0.01, 0.01, overlay.why_not, transform=ax.transAxes, fontsize=6, va="bottom", wrap=True,
                bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
    ax.set_xscale("log", base=2)
    # A sweep whose every request failed has no positive figure: a log axis would abort the sweep's outputs
    # (matplotlib "Data cannot be log-scaled"), and the checks that judge those failures would never run.
    if log_y and any(y > 0 for y in plotted):
        ax.set_yscale("log")
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    legend = ax.legend(fontsize=7)
    # What the picture shows, read back from its artists (the sidecar must not claim what was not drawn).
    return {"ylabel": ylabel, "legend": [t.get_text() for t in legend.get_texts()],
            "notes": [t.get_text() for t in ax.texts]}


def write_plots(points: Sequence[PointFigures], out_dir: Path, title: str, baseline: Baseline | None = None,
                run_conditions: Mapping[str, Any] | None = None) -> list[Path]:
    """Write the three PNGs (and ``plots.json``) into ``out_dir`` and return the PNGs' paths. ``run_conditions``
    (isl, osl, duration_s) decide which baseline figures are drawn (:func:`overlay_for`)."""
    overlay = overlay_for(baseline, run_conditions or {}) if baseline is not None else None
    sidecar: dict[str, Any] = {"run_conditions": dict(run_conditions or {}), "plots": {},
                               "baseline": None if baseline is None else {
                                   "path": str(baseline.path) if baseline.path else baseline.name,
                                   "conditions": dict(baseline.conditions), "provenance": baseline.provenance.as_dict(),
                                   "drawn": sorted(overlay.drawn) if overlay else [],
                                   "why_not": overlay.why_not if overlay else ""}}
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = [
        ("throughput.png", "Throughput vs concurrency", [
            ([("out_tok_s", "aggregate out tok/s")], "aggregate tok/s", False),
            ([("tok_s_user", "per-user tok/s"), ("tok_s_user_p50", "per-user tok/s p50")], "tok/s/user", False)]),
        ("ttft.png", "TTFT vs concurrency", [
            ([("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99")], "seconds", True)]),
        ("itl.png", "ITL vs concurrency", [
            ([("itl_p50_ms", "ITL p50"), ("itl_p99_ms", "ITL p99")], "ms", False)]),
    ]
    paths = []
    for filename, heading, panels in specs:
        fig, axes = pyplot().subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
        sidecar["plots"][filename] = [_panel(ax, points, overlay, names, ylabel, log_y)
                                      for ax, (names, ylabel, log_y) in zip(axes[0], panels)]
        fig.suptitle(f"{title}: {heading}")
        fig.tight_layout()
        paths.append(write_png(fig, out_dir / filename))
    tmp = out_dir / f".{SIDECAR}.{os.getpid()}"
    tmp.write_text(json.dumps(sidecar, indent=1, default=str) + "\n")
    os.replace(tmp, out_dir / SIDECAR)
    return paths
