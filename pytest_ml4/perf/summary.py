"""``perf-summary.json``: the machine-readable perf figures of a run, under the run folder.

Written by the perf suite (and the benchmark scripts) for the report engineer's run summary. Sections are merged
under a file lock, so the sweep and the trace replay (possibly on different xdist workers) can each add theirs.

Schema (``"schema": "ml4-perf-summary/1"``)::

    {
      "schema": "ml4-perf-summary/1",
      "target": str, "simulated": bool, "updated_at": ISO-8601 UTC,
      "sweep": {                                    # fixed-OSL concurrency sweep (absent if it did not run)
        "settings": {"concurrencies": [int], "isl": int, "osl": int, "duration_s": float,
                     "grace_s": float, "min_tokens": int, "short": bool},
        "points": [{<PointFigures fields>: number|null, "ok": bool, "problems": [str],
                    "artifact_dir": str (relative to the run folder)}],
        "knee_concurrency": int|null, "knee_ttft_p99_s": float,
        "gates": [{"gate": str, "concurrency": int|null, "passed": bool, "detail": str}],
        "baseline": {"path": str, "full_run": bool,
                     "deviations": [{"concurrency", "figure", "measured", "baseline", "change", "limit",
                                     "regressed"}]} | null,
        "roofline": {<Roofline fields>, "label": "ESTIMATE ..."} | null (no hardware.memory_bandwidth_tb_s),
        "plots": [str (relative)],
        "passed": bool
      },
      "trace": {                                    # mooncake trace replay (Dynamo targets)
        "settings": {"trace": str, "rows": int, "warmup_requests": int, "concurrency": int},
        "point": {...same as a sweep point...}, "gates": [...], "passed": bool
      }
    }

Figures use the seed table's units: tok/s, seconds for TTFT, milliseconds for ITL, percent for error rates.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pytest_ml4.perf.baseline import Deviation
from pytest_ml4.perf.gates import GateResult

SUMMARY_NAME = "perf-summary.json"
SCHEMA = "ml4-perf-summary/1"


def gate_dicts(results: Iterable[GateResult]) -> list[dict[str, Any]]:
    return [{"gate": r.gate, "concurrency": r.concurrency, "passed": r.passed, "detail": r.detail} for r in results]


def deviation_dicts(devs: Iterable[Deviation]) -> list[dict[str, Any]]:
    return [{"concurrency": d.concurrency, "figure": d.figure, "measured": d.measured, "baseline": d.baseline,
             "change": round(d.change, 4), "limit": d.limit, "regressed": d.regressed} for d in devs]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / (path.name + ".lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update_summary(run_dir: Path, target: str, simulated: bool, section: str,
                   content: Mapping[str, Any]) -> Path:
    """Set ``section`` (``sweep`` or ``trace``) of the run's summary, keeping the other sections."""
    path = run_dir / SUMMARY_NAME
    with _locked(path):
        data: dict[str, Any] = {}
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError:
                data = {}
        data.update({"schema": SCHEMA, "target": target, "simulated": simulated,
                     "updated_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")})
        data[section] = content
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
        tmp.replace(path)
    return path


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
