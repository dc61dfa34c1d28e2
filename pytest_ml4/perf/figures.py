"""The perf figures of one concurrency point, read from an aiperf summary in the seed table's units.

Columns of seed 000's results table and the keys they come from ("keys: output_token_throughput,
output_token_throughput_per_user, time_to_first_token, inter_token_latency, effective_decode_concurrency,
reasoning_token_count, request_error_rate, output_sequence_length"). Absent metrics stay ``None``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pytest_ml4.perf.export import (
    ProfileExport,
    gauge_total,
    server_gauge,
    weighted_quantile,
)
from pytest_ml4.stacks.vllm import adapter as vllm_stack

#: The engine's own count of sequences in its running batch (vllm.md: "Number of requests in model execution
#: batches"), as aiperf scraped it from the engine's /metrics during the profiling phase. An aiperf export names
#: no stack: vLLM's family (every stack's workers run vLLM: stacks.yaml worker_engine).
ENGINE_RUNNING_GAUGE = vllm_stack().engine_metric("num_requests_running")

@dataclass(frozen=True)
class PointFigures:
    concurrency: int
    requests: int | None
    errors: int
    error_rate_pct: float | None
    out_tok_s: float | None            # aggregate output tok/s (output_token_throughput)
    tok_s_user: float | None           # per-user tok/s, mean over requests (output_token_throughput_per_user avg)
    tok_s_user_p50: float | None       # the Dynamo gate's "decode tok/s/user P50"
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    decode_conc_avg: float | None      # effective_decode_concurrency avg
    decode_conc_p50: float | None
    decode_conc_max: float | None
    reasoning_share: float | None      # reasoning tokens / output tokens
    osl_min: float | None
    osl_max: float | None
    osl_std: float | None
    duration_s: float | None
    engine_running_p50: float | None = None   # ENGINE_RUNNING_GAUGE p50 (None: no engine scraped)
    engine_running_max: float | None = None
    engine_running_engines: int | None = None  # engines whose gauges were summed (Dynamo: every decoding worker)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def get(self, name: str) -> float | None:
        value = getattr(self, name, None)
        return None if value is None else float(value)


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def engine_running(ex: ProfileExport) -> tuple[float | None, float | None, int | None]:
    """(p50, max, engines) of the engines' running-sequence gauge during the run, scraped by aiperf.

    The gauges are summed at every instant from aiperf's per-scrape export (``server_metrics_export.jsonl``) and the
    p50 is time-weighted over the profiling phase's issuing window: several engines (a Dynamo deployment's workers,
    each ``--server-metrics`` URL) cannot be added as percentiles, and aiperf's own statistics of one series also
    span its warm-up phase (the first point of a sweep warms up one request at a time: a c4 point read p50 1.0).
    aiperf's statistics of a single series only without the per-scrape file. None when no engine was scraped (no
    ``--server-metrics``; a Dynamo frontend's /metrics has no such gauge).
    """
    if ex.path is None:
        return None, None, None
    series = server_gauge(ex.path.parent, ENGINE_RUNNING_GAUGE)
    if not series:
        return None, None, None
    total = gauge_total(ex.path.parent, ENGINE_RUNNING_GAUGE)
    if total is not None and total[0]:
        held, engines = total
        return weighted_quantile(held, 0.5), max(v for v, _ in held), engines
    if len(series) == 1:
        stats = series[0].stats
        return stats.get("p50"), stats.get("max"), 1
    return None, None, None


def figures_from_export(ex: ProfileExport, concurrency: int) -> PointFigures:
    reasoning = ex.stat("reasoning_token_count", "sum")
    osl_total = ex.stat("output_sequence_length", "sum")
    share = None if reasoning is None or not osl_total else reasoning / osl_total
    running_p50, running_max, running_engines = engine_running(ex)
    return PointFigures(
        concurrency=concurrency,
        requests=ex.request_count,
        errors=ex.error_request_count,
        error_rate_pct=ex.request_error_rate_pct,
        out_tok_s=ex.scalar("output_token_throughput"),
        tok_s_user=ex.stat("output_token_throughput_per_user", "avg"),
        tok_s_user_p50=ex.stat("output_token_throughput_per_user", "p50"),
        ttft_p50_s=_s(ex.stat("time_to_first_token", "p50")),
        ttft_p99_s=_s(ex.stat("time_to_first_token", "p99")),
        itl_p50_ms=ex.stat("inter_token_latency", "p50"),
        itl_p99_ms=ex.stat("inter_token_latency", "p99"),
        decode_conc_avg=ex.stat("effective_decode_concurrency", "avg"),
        decode_conc_p50=ex.stat("effective_decode_concurrency", "p50"),
        decode_conc_max=ex.stat("effective_decode_concurrency", "max"),
        reasoning_share=share,
        osl_min=ex.stat("output_sequence_length", "min"),
        osl_max=ex.stat("output_sequence_length", "max"),
        osl_std=ex.stat("output_sequence_length", "std"),
        duration_s=ex.scalar("benchmark_duration"),
        engine_running_p50=running_p50,
        engine_running_max=running_max,
        engine_running_engines=running_engines,
    )
