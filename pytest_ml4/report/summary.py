"""The machine-readable run summary (``<run_dir>/summary.json``) that nightly comparisons read.

One JSON per run: when it ran, the target, simulated or live, versions (engine, suite, git sha), the verdict per
check and per suite, gates (suite verdicts plus the perf engineer's gates), and perf figures per concurrency
read from ``<run_dir>/perf-summary.json`` when the perf suite wrote one.

``perf-summary.json`` is the perf suite's file (schema ``ml4-perf-summary/1``, :mod:`pytest_ml4.perf.summary`):
``{"sweep": {"points": [{"concurrency": 16, <figure>: number|null, ...}], "gates": [{"gate", "concurrency",
"passed", "detail"}], "baseline": {...}}, "trace": {"point": {...}, "gates": [...]}}``. Points are also accepted
at the top level (``"points"`` as a list, or a mapping ``{"16": {...}}``), which is what older summaries use. Every numeric field of a point is a figure; nulls (absent metrics) are left out.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_ml4.report.redact import redact
from pytest_ml4.report.verdict import (
    GATE_OUTCOMES,
    GATE_PASSED,
    RunVerdict,
    area_verdict,
    run_verdict,
    skip_reasons,
    verdict_lines,
)

SCHEMA_VERSION = 1
PERF_SUMMARY_NAME = "perf-summary.json"
SUMMARY_NAME = "summary.json"
#: A gating check that ran but could not judge (:class:`pytest_ml4.checks.verdict.NotJudged`): never a pass.
NOT_JUDGED = "not_judged"
#: A check that does not apply to the target (decided at collection, with its reason): never a pass either.
DOES_NOT_APPLY = "does_not_apply"
OUTCOMES = ("passed", "failed", "broken", "skipped", NOT_JUDGED, DOES_NOT_APPLY)


@dataclass
class CheckRecord:
    """The verdict of one check (test item) of the run."""

    nodeid: str
    title: str
    suite: str
    outcome: str = "passed"      # passed | failed | broken | skipped | not_judged | does_not_apply
    duration_s: float = 0.0
    message: str = ""
    categories: list[str] = field(default_factory=list)
    #: Figures the check compared with a stored value, each with the conditions it was measured under
    #: (``record_property(name, {"value": ..., "conditions": {...}})``).
    figures: dict[str, Any] = field(default_factory=dict)


def perf_points(data: Mapping[str, Any]) -> dict[int, dict[str, float]]:
    """Numeric perf figures per concurrency from a perf summary in any of the accepted shapes."""
    raw: Any = None
    sweep = data.get("sweep")
    if isinstance(sweep, Mapping) and "points" in sweep:
        raw = sweep["points"]
    else:
        for key in ("points", "per_concurrency", "concurrency", "perf"):
            if key in data:
                raw = data[key]
                break
    out: dict[int, dict[str, float]] = {}
    if isinstance(raw, Mapping):
        items: Iterable[tuple[Any, Any]] = raw.items()
    elif isinstance(raw, list):
        items = ((p.get("concurrency"), p) for p in raw if isinstance(p, Mapping))
    else:
        return out
    for conc, point in items:
        try:
            c = int(conc)
        except (TypeError, ValueError):
            continue
        out[c] = {k: float(v) for k, v in point.items()
                  if k != "concurrency" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return out


def _perf_gates(section: str, gates: Any) -> list[dict[str, Any]]:
    out = []
    for g in gates if isinstance(gates, list) else []:
        if not isinstance(g, Mapping) or "passed" not in g:
            continue
        name = str(g.get("gate") or g.get("name"))
        conc = g.get("concurrency")
        out.append({"name": f"{section}: {name}" + (f" @c{conc}" if conc is not None else ""),
                    "passed": bool(g["passed"]), "detail": g.get("detail", ""), "source": "perf"})
    return out


def read_perf_summary(run_dir: Path) -> dict[str, Any]:
    """Perf figures per concurrency, the trace replay's figures, perf gates and baseline deviations of a run.

    Empty values when the perf suite did not run (no ``perf-summary.json``).
    """
    path = run_dir / PERF_SUMMARY_NAME
    out: dict[str, Any] = {"points": {}, "trace": {}, "gates": [], "baseline": None, "settings": {}}
    if not path.is_file():
        return out
    data = json.loads(path.read_text(encoding="utf-8"))
    out["points"] = perf_points(data)
    sweep = data.get("sweep") if isinstance(data.get("sweep"), Mapping) else {}
    trace = data.get("trace") if isinstance(data.get("trace"), Mapping) else {}
    out["gates"] = _perf_gates("perf sweep", sweep.get("gates")) + _perf_gates("perf trace", trace.get("gates"))
    out["gates"] += _perf_gates("perf", data.get("gates"))  # top-level gates of the simple form
    point = trace.get("point")
    if isinstance(point, Mapping):
        out["trace"] = {k: float(v) for k, v in point.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out["baseline"] = sweep.get("baseline")
    settings = sweep.get("settings")
    out["settings"] = dict(settings) if isinstance(settings, Mapping) else {}
    return out


ACCURACY_SUMMARY_NAME = "accuracy-summary.json"  # written by pytest_ml4.plugin.accuracy


def read_accuracy_summary(run_dir: Path) -> dict[str, Any] | None:
    """The accuracy suite's per-category figures, baseline and drops; None when it did not run."""
    path = run_dir / ACCURACY_SUMMARY_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _accuracy_gates(acc: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if not acc or not acc.get("baseline"):
        return []
    dropped = set(acc.get("drop_categories") or [])
    return [{"name": f"accuracy: {cat}", "passed": cat not in dropped, "value": fig.get("accuracy"),
             "source": "accuracy"} for cat, fig in (acc.get("categories") or {}).items()]


def suite_gates(checks: Iterable[CheckRecord]) -> list[dict[str, Any]]:
    """One gate per suite, its area verdict (:func:`pytest_ml4.report.verdict.area_verdict`): ``passed`` True only
    for a pass, False for a failure, None (never true) when not judged, not applying or skipped."""
    by_suite: dict[str, list[dict[str, Any]]] = {}
    for c in checks:
        by_suite.setdefault(c.suite, []).append(asdict(c))
    gates = []
    for suite, records in sorted(by_suite.items()):
        verdict = area_verdict(suite, records)
        gates.append({"name": f"suite: {suite}", "passed": GATE_PASSED.get(verdict.verdict),
                      "outcome": GATE_OUTCOMES[verdict.verdict], "value": verdict.counts, "source": "checks"})
    return gates


def build_summary(*, run_dir: Path, target: str | None, simulated: bool, faults: Iterable[str],
                  versions: Mapping[str, str], checks: list[CheckRecord], started: float, finished: float,
                  exit_status: int, interrupted: bool | None = None) -> dict[str, Any]:
    """The summary document (plain JSON types). ``interrupted`` defaults to "pytest's exit status says so"; a
    session that never finished starting (a failure, a signal) says True itself."""
    perf = read_perf_summary(run_dir)
    accuracy = read_accuracy_summary(run_dir)
    counts = Counter(c.outcome for c in checks)
    records = [asdict(c) for c in checks]
    suites: dict[str, dict[str, int]] = {}
    for c in checks:
        suites.setdefault(c.suite, {o: 0 for o in OUTCOMES})[c.outcome] += 1
    doc = {
        "schema": SCHEMA_VERSION,
        "run_id": run_dir.name,
        "started": _iso(started),
        "finished": _iso(finished),
        "duration_s": round(finished - started, 3),
        "target": target,
        "simulated": simulated,
        "faults": list(faults),
        "versions": dict(versions),
        "exit_status": int(exit_status),
        # pytest.ExitCode.INTERRUPTED (Ctrl-C, SIGTERM) or a failed start: the figures are partial or absent.
        "interrupted": int(exit_status) == 2 if interrupted is None else interrupted,
        "tests": {"total": len(checks), **{o: counts.get(o, 0) for o in OUTCOMES}},
        # The verdict at a glance (pytest_ml4.report.verdict): overall, per area, with the first reason each.
        "verdict": run_verdict(records, int(exit_status)).as_dict(),
        # Why each check that reached no pass/fail verdict did not: not judged, does not apply, skipped.
        "reasons": skip_reasons(records),
        "suites": suites,
        "gates": suite_gates(checks) + perf["gates"] + _accuracy_gates(accuracy),
        "perf": {str(c): figs for c, figs in sorted(perf["points"].items())},
        "perf_trace": perf["trace"],
        "perf_settings": perf["settings"],
        "perf_baseline": perf["baseline"],
        "accuracy": accuracy,
        "checks": records,
    }
    return redact(doc)


def verdict_lines_of(doc: Mapping[str, Any]) -> list[str]:
    """The verdict lines of a run from its summary (recomputed from the checks, so an older summary works too)."""
    return verdict_lines(verdict_of(doc))


def verdict_of(doc: Mapping[str, Any]) -> RunVerdict:
    """A run's verdict from its summary: its checks and the exit status it recorded."""
    return run_verdict(doc.get("checks") or [], int(doc.get("exit_status", 0)))


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).isoformat(timespec="seconds")


def write_summary(run_dir: Path, doc: Mapping[str, Any]) -> Path:
    """Write ``summary.json`` into the run folder."""
    path = run_dir / SUMMARY_NAME
    path.write_text(json.dumps(doc, indent=2, sort_keys=False), encoding="utf-8")
    return path


def has_results(doc: Mapping[str, Any]) -> bool:
    """True when the run judged at least one check (a start that failed or was interrupted judged none)."""
    return int((doc.get("tests") or {}).get("total") or 0) > 0


def load_summary(run_dir_or_file: Path) -> dict[str, Any]:
    """Read a run's ``summary.json`` (given the run folder or the file)."""
    path = run_dir_or_file / SUMMARY_NAME if run_dir_or_file.is_dir() else run_dir_or_file
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"{path}: summary schema {doc.get('schema')!r}, expected {SCHEMA_VERSION}")
    return doc


# ------------------------------------------------------------------------------------------------- the stored runs
def _summary_or_empty(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / SUMMARY_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def run_target(run_dir: Path) -> str | None:
    """The target a run folder belongs to, from its ``summary.json`` (None when it has none)."""
    return _summary_or_empty(run_dir).get("target")


def run_order(run_dir: Path) -> tuple[str, str]:
    """Sort key of a run folder: the start time its summary recorded; the folder name (the plugin's names start
    with a timestamp) breaks ties and orders folders whose summary lacks it (explicit ``--ml4-run-dir`` names need
    not sort by time)."""
    return (_summary_or_empty(run_dir).get("started") or "", run_dir.name)


def runs_in(root: Path, target: str | None = None, *, with_results: bool = False) -> list[Path]:
    """Run folders (those with a ``summary.json``) under ``root``, optionally of one target and only those that
    judged a check (``with_results``), oldest first: the one run listing (Allure history, ``ml4-report``)."""
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if p.is_dir() and (p / SUMMARY_NAME).is_file()]
    if with_results:
        runs = [p for p in runs if has_results(_summary_or_empty(p))]
    if target is not None:
        runs = [p for p in runs if run_target(p) == target]
    return sorted(runs, key=run_order)


def stored_runs(root: Path, target: str | None = None) -> list[dict[str, Any]]:
    """Summaries of the runs under ``root`` (optionally of one target) that judged a check, oldest first. A run
    still in progress or of an older summary schema is not part of the trend; one that judged nothing (its start
    failed or was interrupted) has no figures."""
    docs = []
    for run in runs_in(root, target, with_results=True):
        try:
            docs.append(load_summary(run))
        except (OSError, ValueError):
            continue
    return docs
