"""Nightly regression: compare the latest run with the previous one and with the stored baseline.

Inputs are the runs' ``summary.json`` files (:mod:`pytest_ml4.report.summary`) under one reports root and the
perf baseline (:class:`pytest_ml4.perf.baseline.Baseline`, by default the target's ``perf.baseline``). A perf
figure regresses when it is worse than the reference by more than the tolerance (relative; which direction is
worse is the store's table, :data:`pytest_ml4.target.baselines.DIRECTION`). A check or gate that passed in the previous
run and fails now is a regression too. :func:`trend_png` draws the key perf figures over all stored runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_ml4.accuracy.gate import CONDITION_KEYS
from pytest_ml4.perf.baseline import Baseline
from pytest_ml4.report.summary import perf_points
from pytest_ml4.target.baselines import (
    DIRECTION,
    conditions_differ,
    direction,
    refusal_line,
)

#: The figures compared and drawn: those with a better direction (the seed results table's columns plus the error
#: rate). Other numbers in a perf summary (request counts, run durations, decode-concurrency maxima) describe the
#: run, not the deployment, and are not judged.
KEY_FIGURES = tuple(DIRECTION)
#: Metrics drawn in the trend, by preference (first matching regex per panel).
TREND_PATTERNS = (r"(?i)ttft.*p50|p50.*ttft", r"(?i)per_user|tok_s_user",
                  r"(?i)itl.*p50|p50.*itl", r"(?i)^(out(put)?_)?(throughput|tok_s|tokens_per_s)")


@dataclass(frozen=True)
class Row:
    """One compared figure."""

    scope: str            # "vs previous" | "vs baseline"
    subject: str          # "c16 ttft_p50_s", "check tests/...", "gate suite: smoke"
    reference: float | str | None
    latest: float | str | None
    change: str
    regressed: bool


@dataclass
class Comparison:
    """All rows of a comparison and the runs it looked at."""

    latest: str
    previous: str | None
    baseline: str | None
    tolerance: float
    rows: list[Row]

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.regressed]


def judge(metric: str, reference: float, latest: float, tolerance: float) -> tuple[str, bool]:
    """(change text, regressed?) for one figure."""
    sign = direction(metric)
    if reference == 0:
        worse = (sign < 0 and latest > 0) or (sign > 0 and latest < 0)
        return ("=" if latest == 0 else f"{latest:+.4g} abs"), worse
    rel = (latest - reference) / abs(reference)
    worse = (sign < 0 and rel > tolerance) or (sign > 0 and rel < -tolerance)
    return f"{rel:+.1%}", worse


def compare_perf(scope: str, reference: Mapping[int, Mapping[str, float]],
                 latest: Mapping[int, Mapping[str, float]], tolerance: float,
                 baseline: Baseline | None = None, figures: Sequence[str] = KEY_FIGURES) -> list[Row]:
    """Rows for every (concurrency, key figure) present in both."""
    rows = []
    for conc in sorted(set(reference) & set(latest)):
        for metric in [f for f in figures if f in reference[conc] and f in latest[conc]]:
            if baseline is not None and not baseline.comparable(metric, conc):
                continue
            tol = baseline.tolerance(metric, tolerance) if baseline is not None else tolerance
            ref, new = reference[conc][metric], latest[conc][metric]
            change, worse = judge(metric, ref, new, tol)
            rows.append(Row(scope, f"c{conc} {metric}", ref, new, change, worse))
    return rows


def compare_verdicts(previous: Mapping[str, Any], latest: Mapping[str, Any]) -> list[Row]:
    """Checks and gates that passed in the previous run and fail now (newly passing ones are listed too)."""
    rows = []
    prev_checks = {c["nodeid"]: c["outcome"] for c in previous.get("checks", [])}
    for check in latest.get("checks", []):
        before = prev_checks.get(check["nodeid"])
        if before is not None and before != check["outcome"] and "skipped" not in (before, check["outcome"]):
            bad = before == "passed" and check["outcome"] in ("failed", "broken")
            rows.append(Row("vs previous", f"check {check['nodeid']}", before, check["outcome"],
                            "now failing" if bad else "changed", bad))
    prev_gates = {g["name"]: g["passed"] for g in previous.get("gates", [])}
    for gate in latest.get("gates", []):
        before = prev_gates.get(gate["name"])
        if before is True and gate["passed"] is False:
            rows.append(Row("vs previous", f"gate {gate['name']}", "passed", "failed", "now failing", True))
    return rows


def compare_accuracy(scope: str, reference: Mapping[str, Any] | None,
                     latest: Mapping[str, Any] | None) -> list[Row]:
    """Per-category BFCL accuracy of two runs (``summary.json`` "accuracy"): a regression is the accuracy gate's
    own rule (a drop beyond the latest run's tolerance that is significant at its alpha), not a percentage."""
    from pytest_ml4.accuracy.gate import CategoryScore, compare

    if not reference or not latest:
        return []

    def scores(doc: Mapping[str, Any]) -> dict[str, CategoryScore]:
        return {c: CategoryScore(c, int(f["n"]), int(f["passed"])) for c, f in (doc.get("categories") or {}).items()}

    differ = conditions_differ(reference.get("conditions") or {}, latest.get("conditions") or {}, CONDITION_KEYS)
    if differ and reference.get("conditions") and latest.get("conditions"):
        return [Row(scope, "accuracy", None, None, refusal_line("accuracy", "the reference run", differ), False)]
    ref, new = scores(reference), scores(latest)
    settings = latest.get("settings") or {}
    dropped = {d.category for d in compare(new, ref, float(settings.get("tolerance", 0.05)),
                                           float(settings.get("alpha", 0.05)))}
    return [Row(scope, f"accuracy {c} (n={new[c].n} vs {ref[c].n})", ref[c].accuracy, new[c].accuracy,
                f"{(new[c].accuracy - ref[c].accuracy) * 100:+.1f} pts", c in dropped)
            for c in new if c in ref and new[c].n and ref[c].n]


def compare_runs(runs: Sequence[Mapping[str, Any]], baseline: Baseline | None, tolerance: float) -> Comparison:
    """Compare the last run with the one before it and with the baseline."""
    if not runs:
        raise ValueError("no stored runs to compare")
    latest = runs[-1]
    latest_perf = perf_points(latest)
    settings = latest.get("perf_settings") or {}
    rows: list[Row] = []
    previous = runs[-2] if len(runs) > 1 else None
    if previous is not None:
        prev_settings = previous.get("perf_settings") or {}
        if _comparable_settings(prev_settings, settings):
            rows += compare_perf("vs previous", perf_points(previous), latest_perf, tolerance)
        else:
            differ = conditions_differ(prev_settings, settings, _SETTING_KEYS)
            rows.append(Row("vs previous", "perf settings", _settings_text(prev_settings),
                            _settings_text(settings), refusal_line("perf figures", "the previous run", differ),
                            False))
        rows += compare_verdicts(previous, latest)
        rows += compare_accuracy("vs previous", previous.get("accuracy"), latest.get("accuracy"))
    if baseline is not None:
        rows += compare_with_baseline(baseline, latest_perf, settings, tolerance)
    return Comparison(latest["run_id"], previous["run_id"] if previous else None,
                      _where(baseline) if baseline is not None else None, tolerance, rows)


_SETTING_KEYS = ("isl", "osl", "duration_s", "short", "min_tokens")
#: The run conditions a perf baseline's figures depend on (as ``pytest_ml4/data/baselines/<target>.json`` states them).
_BASELINE_KEYS = ("isl", "osl", "duration_s")


def compare_with_baseline(baseline: Baseline, latest: Mapping[int, Mapping[str, float]],
                          settings: Mapping[str, Any], tolerance: float) -> list[Row]:
    """The latest run's figures against the stored baseline: every key figure under the baseline's conditions;
    under other ones only those it lists as comparable across run lengths (``short_run_metrics``), or one row
    refusing the comparison when it lists none (or the run or baseline does not say what it was measured under)."""
    differ = conditions_differ(baseline.conditions, settings, _BASELINE_KEYS)
    if not differ:
        return compare_perf("vs baseline", baseline.points, latest, tolerance, baseline, KEY_FIGURES)
    if not baseline.short_run_metrics or not baseline.conditions or not settings:
        return [Row("vs baseline", "perf", None, None, refusal_line("perf figures", _where(baseline), differ),
                    False)]
    figures = tuple(f for f in KEY_FIGURES if f in baseline.short_run_metrics)
    return compare_perf("vs baseline", baseline.points, latest, tolerance, baseline, figures)


def _where(baseline: Baseline) -> str:
    return str(baseline.path) if baseline.path is not None else baseline.name


def _comparable_settings(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two sweeps are comparable when their load shape matches (or when either run did not record it)."""
    return not a or not b or all(a.get(k) == b.get(k) for k in _SETTING_KEYS)


def _settings_text(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={settings[k]}" for k in _SETTING_KEYS if k in settings) or "-"


def format_table(comp: Comparison) -> str:
    """A plain-text table for the console / CI log."""
    head = [f"latest run: {comp.latest}", f"previous run: {comp.previous or '(none)'}",
            f"baseline: {comp.baseline or '(none)'}", f"tolerance: {comp.tolerance:.0%}"]
    cols = ("scope", "figure", "reference", "latest", "change", "verdict")
    body = [(r.scope, r.subject, _fmt(r.reference), _fmt(r.latest), r.change,
             "REGRESSION" if r.regressed else "ok") for r in comp.rows]
    if not body:
        why = "no previous run of this target" if comp.previous is None else "the previous run has no figures in common"
        return "\n".join(head + [f"nothing to compare: {why}, and no perf figures to hold against a baseline"])
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *body)]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in (cols, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    tail = f"{len(comp.regressions)} regression(s) beyond tolerance" if comp.regressions else "no regressions"
    return "\n".join(head + [""] + lines + ["", tail])


def _fmt(v: float | str | None) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def trend_metrics(runs: Sequence[Mapping[str, Any]], limit: int = 4) -> list[str]:
    """The key perf figures to draw: one per :data:`TREND_PATTERNS` entry found in the runs."""
    names = [m for m in KEY_FIGURES if any(m in figs for doc in runs for figs in perf_points(doc).values())]
    chosen: list[str] = []
    for pattern in TREND_PATTERNS:
        match = next((n for n in names if re.search(pattern, n) and n not in chosen), None)
        if match:
            chosen.append(match)
    return chosen[:limit]


def trend_png(runs: Sequence[Mapping[str, Any]], out: Path, baseline: Baseline | None = None) -> Path | None:
    """Draw the key perf figures per concurrency over the stored runs; None when no run has perf figures."""
    metrics = trend_metrics(runs)
    if not metrics:
        return None
    from pytest_ml4.perf.plots import pyplot

    plt = pyplot()

    labels = [f"#{i} " + str(d.get("started") or d["run_id"])[:16].replace("T", " ") for i, d in enumerate(runs, 1)]
    # A short run is compared with the baseline on its short-run figures only; draw the baseline only there.
    short = bool((runs[-1].get("perf_settings") or {}).get("short"))
    fig, axes = plt.subplots(len(metrics), 1, figsize=(10, 3.2 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics):
        concs = sorted({c for d in runs for c, figs in perf_points(d).items() if metric in figs})
        for conc in concs:
            ys = [perf_points(d).get(conc, {}).get(metric) for d in runs]
            line = ax.plot(range(len(runs)), [float("nan") if y is None else y for y in ys], marker="o",
                           label=f"c{conc}")[0]
            base = baseline.points.get(conc, {}) if baseline is not None else {}
            drawable = baseline is not None and baseline.comparable(metric, conc) and not (
                short and baseline.short_run_metrics and metric not in baseline.short_run_metrics)
            if metric in base and drawable:
                ax.axhline(base[metric], color=line.get_color(), linestyle="--", linewidth=0.8)
        better = {-1: "lower is better", 1: "higher is better"}.get(direction(metric), "")
        ax.set_title(f"{metric} ({better})" if better else metric)
        ax.set_xticks(range(len(runs)), labels, rotation=20, fontsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=min(len(concs), 7))
    fig.suptitle(f"{runs[-1].get('target')}: key perf figures over {len(runs)} runs (dashed: baseline)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
