"""The machine-readable run summary (``<run_dir>/summary.json``) that nightly comparisons read.

One JSON per run: when it ran, the target, simulated or live, versions (engine, suite, git sha), the verdict per
check and per suite, gates (suite verdicts plus the perf engineer's gates), and perf figures per concurrency
read from ``<run_dir>/perf-summary.json`` when the perf suite wrote one.

``perf-summary.json`` is read leniently: ``{"points": [{"concurrency": 16, "<metric>": number, ...}, ...],
"gates": [{"name": ..., "passed": bool, "value": ..., "limit": ...}]}``; ``points`` may also be a mapping
``{"16": {...}}`` or be called ``per_concurrency``/``sweep``. Every numeric field of a point is a metric.
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

SCHEMA_VERSION = 1
PERF_SUMMARY_NAME = "perf-summary.json"
SUMMARY_NAME = "summary.json"
OUTCOMES = ("passed", "failed", "broken", "skipped")


@dataclass
class CheckRecord:
    """The verdict of one check (test item) of the run."""

    nodeid: str
    title: str
    suite: str
    outcome: str = "passed"      # passed | failed | broken | skipped
    duration_s: float = 0.0
    message: str = ""
    categories: list[str] = field(default_factory=list)


def perf_points(data: Mapping[str, Any]) -> dict[int, dict[str, float]]:
    """Numeric perf figures per concurrency from a perf summary or baseline in any of the accepted shapes."""
    raw: Any = None
    for key in ("points", "per_concurrency", "sweep", "concurrency", "perf"):
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


def read_perf_summary(run_dir: Path) -> tuple[dict[int, dict[str, float]], list[dict[str, Any]]]:
    """(perf figures per concurrency, perf gates) from the run folder; empty when the perf suite did not run."""
    path = run_dir / PERF_SUMMARY_NAME
    if not path.is_file():
        return {}, []
    data = json.loads(path.read_text(encoding="utf-8"))
    gates = [g for g in data.get("gates", []) if isinstance(g, Mapping) and "name" in g and "passed" in g]
    return perf_points(data), [dict(g, source="perf") for g in gates]


def suite_gates(checks: Iterable[CheckRecord]) -> list[dict[str, Any]]:
    """One gate per suite: passed when none of its checks failed or broke (skips do not fail a suite)."""
    by_suite: dict[str, Counter[str]] = {}
    for c in checks:
        by_suite.setdefault(c.suite, Counter())[c.outcome] += 1
    return [{"name": f"suite: {suite}", "passed": counts["failed"] + counts["broken"] == 0,
             "value": dict(counts), "source": "checks"} for suite, counts in sorted(by_suite.items())]


def build_summary(*, run_dir: Path, target: str | None, simulated: bool, faults: Iterable[str],
                  versions: Mapping[str, str], checks: list[CheckRecord], started: float, finished: float,
                  exit_status: int) -> dict[str, Any]:
    """The summary document (plain JSON types)."""
    perf, perf_gates = read_perf_summary(run_dir)
    counts = Counter(c.outcome for c in checks)
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
        "tests": {"total": len(checks), **{o: counts.get(o, 0) for o in OUTCOMES}},
        "suites": suites,
        "gates": suite_gates(checks) + perf_gates,
        "perf": {str(c): figs for c, figs in sorted(perf.items())},
        "checks": [asdict(c) for c in checks],
    }
    return redact(doc)


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).isoformat(timespec="seconds")


def write_summary(run_dir: Path, doc: Mapping[str, Any]) -> Path:
    """Write ``summary.json`` into the run folder."""
    path = run_dir / SUMMARY_NAME
    path.write_text(json.dumps(doc, indent=2, sort_keys=False), encoding="utf-8")
    return path


def load_summary(run_dir_or_file: Path) -> dict[str, Any]:
    """Read a run's ``summary.json`` (given the run folder or the file)."""
    path = run_dir_or_file / SUMMARY_NAME if run_dir_or_file.is_dir() else run_dir_or_file
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"{path}: summary schema {doc.get('schema')!r}, expected {SCHEMA_VERSION}")
    return doc
