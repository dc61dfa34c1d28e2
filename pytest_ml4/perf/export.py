"""Typed readers of aiperf 0.13.0 exports: ``profile_export_aiperf.json`` (schema 1.4) and ``profile_export.jsonl``.

Facts (aiperf.md §6, aiperf-0.13.0-exports/KEYS.md):

* every metric is ``{"unit": str, <stat>: number, ...}``; a metric whose inputs are missing is *omitted*, never null,
  so :meth:`ProfileExport.metric` returns ``None`` and :meth:`Metric.get` returns ``None`` for an absent stat: an
  absent value is never turned into 0;
* scalars (``request_count``, ``request_error_rate`` in **percent**, ...) carry only ``avg``;
* ``error_request_count`` is omitted on clean runs; ``request_count`` counts successful requests only;
* the per-request jsonl mixes warmup and profiling records: :func:`read_records` keeps the profiling phase by default.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUMMARY_FILE = "profile_export_aiperf.json"
RECORDS_FILE = "profile_export.jsonl"
READY_FILE = ".aiperf_results_ready.json"
LOG_FILE = "logs/aiperf.log"
SCHEMA_VERSION = "1.4"


class ExportError(ValueError):
    """An export file is missing, unreadable or not the schema this reader knows."""


@dataclass(frozen=True)
class Metric:
    """One metric of the summary: its unit and whichever statistics aiperf wrote."""

    name: str
    unit: str
    stats: Mapping[str, float]

    def get(self, stat: str) -> float | None:
        value = self.stats.get(stat)
        return None if value is None else float(value)

    def require(self, stat: str) -> float:
        value = self.get(stat)
        if value is None:
            raise ExportError(f"metric {self.name} has no '{stat}' (has {sorted(self.stats)})")
        return value

    @property
    def avg(self) -> float | None:
        return self.get("avg")

    @property
    def p50(self) -> float | None:
        return self.get("p50")

    @property
    def p99(self) -> float | None:
        return self.get("p99")

    @property
    def min(self) -> float | None:
        return self.get("min")

    @property
    def max(self) -> float | None:
        return self.get("max")

    @property
    def std(self) -> float | None:
        return self.get("std")

    @property
    def count(self) -> float | None:
        return self.get("count")


def _metrics_of(data: Mapping[str, Any]) -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for name, value in data.items():
        if isinstance(value, dict) and "unit" in value:
            stats = {k: v for k, v in value.items() if k != "unit" and isinstance(v, (int, float))
                     and not isinstance(v, bool)}
            out[name] = Metric(name=name, unit=str(value["unit"]), stats=stats)
    return out


@dataclass(frozen=True)
class ErrorSummaryEntry:
    code: int | None
    type: str
    message: str
    count: int


@dataclass(frozen=True)
class ProfileExport:
    """``profile_export_aiperf.json`` of one run."""

    raw: Mapping[str, Any]
    path: Path | None = None
    metrics: Mapping[str, Metric] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: Path | None = None) -> ProfileExport:
        if not isinstance(data, Mapping):
            raise ExportError(f"{path or 'export'}: top level is {type(data).__name__}, expected an object")
        return cls(raw=data, path=path, metrics=_metrics_of(data))

    @classmethod
    def load(cls, path: str | Path) -> ProfileExport:
        p = Path(path)
        if p.is_dir():
            p = p / SUMMARY_FILE
        if not p.is_file():
            raise ExportError(f"no aiperf summary at {p}")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as err:
            raise ExportError(f"{p}: not valid JSON ({err})") from None
        return cls.from_dict(data, p)

    # --- status ---------------------------------------------------------------------------------------------
    @property
    def schema_version(self) -> str | None:
        return self.raw.get("schema_version")

    @property
    def aiperf_version(self) -> str | None:
        return self.raw.get("aiperf_version")

    @property
    def benchmark_id(self) -> str | None:
        return self.raw.get("benchmark_id")

    @property
    def is_complete(self) -> bool | None:
        return self.raw.get("is_complete")

    @property
    def was_cancelled(self) -> bool | None:
        return self.raw.get("was_cancelled")

    @property
    def incomplete_reason(self) -> str | None:
        return self.raw.get("incomplete_reason")

    @property
    def start_time(self) -> str | None:
        return self.raw.get("start_time")

    @property
    def end_time(self) -> str | None:
        return self.raw.get("end_time")

    @property
    def input_config(self) -> Mapping[str, Any]:
        return self.raw.get("input_config") or {}

    @property
    def cli_command(self) -> str | None:
        return (self.raw.get("run_info") or {}).get("cli_command")

    @property
    def error_summary(self) -> list[ErrorSummaryEntry]:
        out = []
        for item in self.raw.get("error_summary") or []:
            det = item.get("error_details") or {}
            out.append(ErrorSummaryEntry(code=det.get("code"), type=str(det.get("type", "")),
                                         message=str(det.get("message", "")), count=int(item.get("count", 0))))
        return out

    # --- metrics --------------------------------------------------------------------------------------------
    def __contains__(self, name: object) -> bool:
        return name in self.metrics

    def metric(self, name: str) -> Metric | None:
        return self.metrics.get(name)

    def stat(self, name: str, stat: str) -> float | None:
        """``stat`` of metric ``name``, or None when either is absent (never 0 for absent)."""
        m = self.metrics.get(name)
        return None if m is None else m.get(stat)

    def scalar(self, name: str) -> float | None:
        return self.stat(name, "avg")

    def missing(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if n not in self.metrics]

    @property
    def warmup_metrics(self) -> dict[str, Metric]:
        return _metrics_of(self.raw.get("warmup_metrics") or {})

    @property
    def request_error_rate_pct(self) -> float | None:
        """Error rate in percent (aiperf's unit: 1.0 means 1 %)."""
        return self.scalar("request_error_rate")

    @property
    def error_request_count(self) -> int:
        """Failed requests; aiperf omits the key on clean runs, which here genuinely means zero."""
        v = self.scalar("error_request_count")
        return 0 if v is None else int(v)

    @property
    def request_count(self) -> int | None:
        v = self.scalar("request_count")
        return None if v is None else int(v)

    @property
    def extra_inputs(self) -> Mapping[str, Any]:
        """The ``--extra-inputs`` as aiperf resolved them (``input_config.endpoint.extra``)."""
        extra = (self.input_config.get("endpoint") or {}).get("extra") or {}
        if isinstance(extra, list):  # some versions store [[k, v], ...]
            return {k: v for k, v in extra}
        return extra


@dataclass(frozen=True)
class RequestRecord:
    """One line of ``profile_export.jsonl``."""

    metadata: Mapping[str, Any]
    metrics: Mapping[str, Mapping[str, Any]]
    error: Mapping[str, Any] | None = None

    @property
    def phase(self) -> str | None:
        return self.metadata.get("benchmark_phase")

    @property
    def ok(self) -> bool:
        return self.error is None

    def value(self, name: str) -> Any:
        """The metric's value (a number, or a list for ``inter_chunk_latency``), None when absent."""
        m = self.metrics.get(name)
        return None if m is None else m.get("value")

    @property
    def duration_s(self) -> float | None:
        start, end = self.metadata.get("request_start_ns"), self.metadata.get("request_end_ns")
        return None if start is None or end is None else (end - start) / 1e9


def iter_records(path: str | Path, phase: str | None = "profiling") -> Iterator[RequestRecord]:
    """Records of the jsonl; ``phase=None`` keeps every phase (warmup and profiling are mixed in the file)."""
    p = Path(path)
    if p.is_dir():
        p = p / RECORDS_FILE
    if not p.is_file():
        raise ExportError(f"no aiperf per-request export at {p}")
    with p.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ExportError(f"{p}:{lineno}: not valid JSON ({err})") from None
            rec = RequestRecord(metadata=obj.get("metadata") or {}, metrics=obj.get("metrics") or {},
                                error=obj.get("error"))
            if phase is None or rec.phase == phase:
                yield rec


def read_records(path: str | Path, phase: str | None = "profiling") -> list[RequestRecord]:
    return list(iter_records(path, phase))


SERVER_METRICS_FILE = "server_metrics_export.json"


@dataclass(frozen=True)
class GaugeSeries:
    """One scraped endpoint's statistics of a gauge over the profiling phase (``server_metrics_export.json``)."""

    endpoint_url: str
    stats: Mapping[str, float]


def server_gauge(run_dir: Path, name: str) -> list[GaugeSeries]:
    """The series of gauge ``name`` that aiperf scraped during the run in ``run_dir``; [] when it scraped none.

    Shape (aiperf 0.13, ``--server-metrics URL``): ``metrics.<name> = {"type": "gauge", "series": [{"endpoint_url",
    "stats": {"avg", "min", "max", "p50", ...}}]}``, one series per endpoint that answered. The file only exists when
    a ``/metrics`` endpoint answered (aiperf.md §6), so a missing file is "not scraped", never an error.
    """
    path = Path(run_dir) / SERVER_METRICS_FILE
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ExportError(f"{path}: not valid JSON ({err})") from None
    metric = ((data.get("metrics") or {}) if isinstance(data, Mapping) else {}).get(name) or {}
    if metric.get("type") != "gauge":
        return []
    return [GaugeSeries(str(s.get("endpoint_url", "")), s.get("stats") or {}) for s in metric.get("series") or []
            if isinstance(s, Mapping)]


#: aiperf's per-scrape server metrics (``--server-metrics-formats ... jsonl``): one line per scrape that changed.
SERVER_METRICS_JSONL = "server_metrics_export.jsonl"


def gauge_total(run_dir: Path, name: str) -> tuple[list[tuple[float, float]], int] | None:
    """Gauge ``name`` summed over every endpoint that exposes it, as ``(value, seconds it held)`` pairs over the
    profiling phase's issuing window (first to last request start, at least to the first request's end), and the
    number of endpoints summed. None
    without the per-scrape file or a profiling record.

    aiperf writes a line only when an endpoint's scrape changed (``is_duplicate`` skipped), so each endpoint's last
    value holds until its next line: the sum at any instant is over the endpoints' last values."""
    path = Path(run_dir) / SERVER_METRICS_JSONL
    if not path.is_file():
        return None
    records = list(iter_records(run_dir))
    starts = [s for r in records if isinstance(s := r.metadata.get("request_start_ns"), int)]
    ends = [e for r in records if isinstance(e := r.metadata.get("request_end_ns"), int)]
    if not starts:
        return None
    # While requests are still issued the client holds its concurrency; a run whose requests all started at once
    # (one wave: each outlasts the point) holds it until the first one ends.
    lo, hi = min(starts), max(max(starts), min(ends, default=max(starts)))
    points: list[tuple[int, str, float]] = []
    with path.open() as fh:
        for line in fh:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            samples = (obj.get("metrics") or {}).get(name)
            values = [x.get("value") for x in samples or [] if isinstance(x.get("value"), (int, float))]
            if values and isinstance(obj.get("timestamp_ns"), int):
                points.append((obj["timestamp_ns"], str(obj.get("endpoint_url")), float(sum(values))))
    points.sort()
    last: dict[str, float] = {}
    held: list[tuple[float, float]] = []
    for i, (ts, url, value) in enumerate(points):
        last[url] = value
        end = points[i + 1][0] if i + 1 < len(points) else hi
        start, end = max(ts, lo), min(end, hi)
        if end > start:
            held.append((sum(last.values()), (end - start) / 1e9))
    return held, len(last)


def weighted_quantile(held: Sequence[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of values held for the given durations (a time-weighted median for q = 0.5)."""
    total = sum(w for _, w in held)
    if total <= 0:
        return None
    acc = 0.0
    for value, w in sorted(held):
        acc += w
        if acc >= q * total:
            return value
    return max(v for v, _ in held)

