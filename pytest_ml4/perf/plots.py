"""Matplotlib PNG plots of a sweep, with the stored baseline overlaid (dashed).

* ``throughput.png``: aggregate output tok/s and per-user tok/s vs concurrency;
* ``ttft.png``: TTFT p50/p99 vs concurrency (log scale: past the knee it is queueing, minutes);
* ``itl.png``: ITL p50/p99 vs concurrency.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display in CI; must precede pyplot
import matplotlib.pyplot as plt

from pytest_ml4.perf.figures import PointFigures


def _series(points: Sequence[PointFigures], name: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for p in sorted(points, key=lambda f: f.concurrency):
        v = p.get(name)
        if v is not None:
            xs.append(p.concurrency)
            ys.append(v)
    return xs, ys


def _baseline_series(baseline: Mapping[int, Mapping[str, float]] | None, name: str) -> tuple[list[int], list[float]]:
    if not baseline:
        return [], []
    pts = sorted((c, row[name]) for c, row in baseline.items() if name in row)
    return [c for c, _ in pts], [v for _, v in pts]


def _panel(ax, points, baseline, names: Sequence[tuple[str, str]], ylabel: str, log_y: bool = False) -> None:
    plotted: list[float] = []
    for name, label in names:
        xs, ys = _series(points, name)
        plotted += [y for y in ys if y is not None]
        line, = ax.plot(xs, ys, marker="o", label=label)
        bx, by = _baseline_series(baseline, name)
        if bx:
            ax.plot(bx, by, linestyle="--", marker="x", color=line.get_color(), alpha=0.7,
                    label=f"{label} (baseline)")
    ax.set_xscale("log", base=2)
    # A sweep whose every request failed has no positive figure: a log axis would abort the sweep's outputs
    # (matplotlib "Data cannot be log-scaled"), and the checks that judge those failures would never run.
    if log_y and any(y > 0 for y in plotted):
        ax.set_yscale("log")
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def write_plots(points: Sequence[PointFigures], out_dir: Path, title: str,
                baseline: Mapping[int, Mapping[str, float]] | None = None) -> list[Path]:
    """Write the three PNGs into ``out_dir`` and return their paths."""
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
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
        for ax, (names, ylabel, log_y) in zip(axes[0], panels):
            _panel(ax, points, baseline, names, ylabel, log_y)
        fig.suptitle(f"{title}: {heading}")
        fig.tight_layout()
        path = out_dir / filename
        # Write then rename: xdist workers sharing a sweep may both draw it; readers never see half a PNG.
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.png")
        fig.savefig(tmp, dpi=90)
        plt.close(fig)
        os.replace(tmp, path)
        paths.append(path)
    return paths
