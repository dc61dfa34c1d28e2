"""KV cache sizing and memory health after boot (seed 000: the OOM root cause and open item 1).

After the engine booted: its KV pool (log line, cross-checked with ``vllm:cache_config_info`` where /metrics is
exposed) holds the target's requirement and at least ``kv_max_concurrency_min`` requests of ``max_model_len``;
a short load makes the engine take one full ``max_num_batched_tokens`` step (where seed 000's crashing config
died); afterwards no OOM or engine-death line is in the log since boot, and during the session peak KV usage
stayed under the target's limit and speculative decoding accepted drafts within the target's range. Every failure
quotes the judged log lines, which are also attached to the report. The ``vllm:*`` cross-checks read the engine's
/metrics; on Dynamo that is every worker's own /metrics (``Endpoint.worker_metrics_urls``), and where none is known
a passing log verdict is skipped naming the target field to set, never passed without its cross-check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import yaml

from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.locations import data_file
from pytest_ml4.logs import LogReader, LogView, StatsLine, quote
from pytest_ml4.logs.kv import (
    SpecCounts,
    Verdict,
    judge_kv_pool,
    judge_max_concurrency,
    judge_no_failures,
    judge_peak_usage,
    judge_spec_decode,
    root_causes_first,
)
from pytest_ml4.metrics import MetricsError, MetricsSnapshot, scrape
from pytest_ml4.report.redact import redact
from pytest_ml4.targets import Target

pytestmark = pytest.mark.kv

LOAD: dict[str, Any] = yaml.safe_load((data_file("kv", "load.yaml")).read_text())


@dataclass
class LoadResult:
    """What the short load saw: request outcomes, the KV usage gauge's peak and the spec-decode counter deltas."""

    started: float
    requests: int = 0
    completed: int = 0
    errors: list[str] = field(default_factory=list)
    metric_peak_pct: float | None = None
    metrics_error: str | None = None
    spec: SpecCounts | None = None


def _scrape(url: str) -> MetricsSnapshot | None:
    try:
        return scrape(url, timeout=5.0)
    except MetricsError:
        return None


@dataclass(frozen=True)
class EngineMetrics:
    """Where the engines' ``vllm:*`` families are: the engine's own /metrics (vLLM, or behind a proxy the target's
    metrics URL), or on Dynamo every worker's system-port /metrics (the frontend's has only ``dynamo_*``)."""

    urls: tuple[str, ...]
    #: The agg/decode workers' URLs: the role ``engine`` describes (cache config is per role).
    engine_urls: tuple[str, ...]
    #: Why there are none (names the target field to set), or None.
    missing: str | None = None

    @classmethod
    def of(cls, endpoint: Any, target: Target) -> EngineMetrics:
        if not target.is_dynamo:
            url = endpoint.effective_metrics_url
            return cls((url,), (url,))
        by_role = endpoint.worker_metrics_urls
        engine_urls = tuple(u for role in ("worker", "decode") for u in by_role.get(role, ()))
        urls = endpoint.all_worker_metrics_urls()
        if urls:
            return cls(urls, engine_urls)
        variables = ", ".join(f"{r}: {v}" for r, v in target.endpoint.worker_metrics_url_env.items()) or "none"
        return cls((), (), f"the vllm:* cross-check needs the Dynamo workers' /metrics and no worker metrics URL is "
                           f"known: set the variables of endpoint.worker_metrics_url_env ({variables}) of target "
                           f"{target.name} (the frontend's /metrics has no vllm:* families)")

    def snapshots(self, urls: tuple[str, ...] | None = None) -> list[MetricsSnapshot | None]:
        return [_scrape(u) for u in (self.urls if urls is None else urls)]


def _cache_info(snaps: list[MetricsSnapshot | None]) -> dict[str, str] | None:
    samples = next((snap.samples("vllm:cache_config_info") for snap in snaps
                    if snap and snap.samples("vllm:cache_config_info")), [])
    return dict(samples[0].labels) if samples else None


def _spec_delta(before: list[MetricsSnapshot | None], after: list[MetricsSnapshot | None],
                k: int) -> SpecCounts | None:
    """The spec-decode counters' increase summed over every engine (None when one of them could not be read)."""
    if not k or not before or any(s is None for s in before + after):
        return None

    def delta(name: str, **labels: str) -> float:
        return sum(a.sum(name, **labels) - b.sum(name, **labels) for a, b in zip(after, before))  # type: ignore[union-attr]

    drafts = delta("vllm:spec_decode_num_drafts_total")
    if drafts <= 0:
        return None
    return SpecCounts(drafts, delta("vllm:spec_decode_num_accepted_tokens_total"),
                      tuple(delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
                            for i in range(k)))


def _prompt(i: int, tokens: int) -> str:
    paragraph = " ".join(str(LOAD["paragraph"]).split())
    want = tokens * int(LOAD["chars_per_token"])
    body = (paragraph + " ") * (want // (len(paragraph) + 1) + 1)
    return f"Request {i} of the KV check. " + body[:want]


def _poll_usage(urls: tuple[str, ...], stop: threading.Event, result: LoadResult) -> None:
    """Peak of vllm:kv_cache_usage_perc (0..1, max over engines and workers) while the load runs."""
    while not stop.is_set():
        for url in urls:
            snap = _scrape(url)
            if snap is None:
                result.metrics_error = result.metrics_error or f"cannot read the engine's metrics at {url}"
                continue
            values = [s.value for s in snap.samples("vllm:kv_cache_usage_perc")]
            if not values:
                # A /metrics that answers without the gauge (on Dynamo: the worker's engine-metrics callback
                # failed and the runtime served its own families only) is as unreadable as a 500.
                result.metrics_error = result.metrics_error or (
                    f"the engine's metrics at {url} carry no vllm:kv_cache_usage_perc")
            else:
                peak = max(values) * 100
                result.metric_peak_pct = max(peak, result.metric_peak_pct or 0.0)
        stop.wait(float(LOAD["metrics_poll_s"]))


def _one_request(http: httpx.Client, model: str, prompt: str) -> str | None:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            # min_tokens: the answer would end at its EOS after ~30 tokens, too few drafts to judge acceptance.
            "max_tokens": int(LOAD["max_tokens"]), "min_tokens": int(LOAD["max_tokens"]), "temperature": 0.0}
    try:
        resp = http.post("chat/completions", json=body, timeout=float(LOAD["request_timeout_s"]))
    except httpx.HTTPError as err:
        return f"{type(err).__name__}: {err}"
    if resp.status_code != 200:
        return f"HTTP {resp.status_code}: {resp.text[:300]}"
    return None


def run_load(http: httpx.Client, endpoint: Any, target: Target) -> LoadResult:
    """Concurrent requests, one with a prompt over ``max_num_batched_tokens`` (a full step); polls /metrics."""
    eng = target.engine
    n = max(1, min(int(LOAD["concurrency"]), eng.max_num_seqs))
    large = min(int(LOAD["max_prompt_tokens"]), eng.max_model_len // 2,
                int(eng.max_num_batched_tokens * float(LOAD["large_prompt_steps"])))
    sizes = [large] + [min(int(LOAD["small_prompt_tokens"]), large)] * (n - 1)
    result = LoadResult(started=time.time(), requests=n)
    metrics = EngineMetrics.of(endpoint, target)
    before = metrics.snapshots()
    stop = threading.Event()
    poller = threading.Thread(target=_poll_usage, args=(metrics.urls, stop, result), daemon=True)
    poller.start()
    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            outcomes = list(pool.map(lambda i: _one_request(http, endpoint.model, _prompt(i, sizes[i])), range(n)))
    finally:
        stop.set()
        poller.join(timeout=10)
    result.errors = [o for o in outcomes if o]
    result.completed = n - len(result.errors)
    k = eng.speculative.num_speculative_tokens if eng.speculative else 0
    result.spec = _spec_delta(before, metrics.snapshots(), k)
    return result


def _wait_for_stats_line(logs: LogReader, since: float) -> None:
    """vLLM logs its stats every 10 s once there was traffic; wait for the one covering the load."""
    deadline = time.monotonic() + float(LOAD["stats_wait_s"])
    while time.monotonic() < deadline:
        # Only the lines since the load: cheap over ssh, and enough to see the stats line or the engine's death.
        view = LogView(logs.read(since=since - 1), logs.describe())
        if view.failures() or view.all(StatsLine):
            return
        time.sleep(0.5)


@dataclass
class MetricsRead:
    """Scrapes of several /metrics URLs: a snapshot per URL (None where unreadable) and why each failed."""

    snapshots: list[MetricsSnapshot | None]
    errors: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, urls: tuple[str, ...]) -> MetricsRead:
        read = cls([])
        for url in urls:
            try:
                read.snapshots.append(scrape(url, timeout=5.0))
            except MetricsError as err:
                read.snapshots.append(None)
                read.errors.append(f"cannot read the engine's metrics at {url}: {err}")
        return read


@pytest.fixture(scope="module")
def engine_metrics(ml4_endpoint: Any, ml4_target: Target) -> EngineMetrics:
    return EngineMetrics.of(ml4_endpoint, ml4_target)


@pytest.fixture(scope="module")
def kv_metrics(engine_metrics: EngineMetrics) -> MetricsRead:
    """One scrape of each engine's /metrics after boot, with the errors of those that could not be read (never
    swallowed: a cross-check that silently drops out is a check that passes for the wrong reason
    in silence)."""
    return MetricsRead.of(engine_metrics.engine_urls)


@pytest.fixture(scope="module")
def kv_load(http_client: httpx.Client, ml4_endpoint: Any, ml4_target: Target, ml4_logs: LogReader) -> Iterator[LoadResult]:
    result = run_load(http_client, ml4_endpoint, ml4_target)
    _wait_for_stats_line(ml4_logs, result.started)
    yield result


def _judge(verdict: Verdict, view: LogView, attach: Callable[..., str], record_property: Callable[[str, Any], None],
           extra: str = "", unchecked: str | None = None) -> None:
    """Report the verdict; ``unchecked``: why its /metrics cross-check could not run (a passing verdict then
    skips with that reason rather than passing silently without it)."""
    attach(view, verdict.judged, f"{verdict.name}: judged log lines")
    first = verdict.message.splitlines()[0] if verdict.message else verdict.name
    record_property("ml4_verdict", f"{verdict.name}: {'PASS' if verdict.ok else 'FAIL'} - {first}")
    for key, value in verdict.figures.items():
        record_property(f"ml4_{key}", value)
    # Messages quote engine log lines; a real engine logs its --api-key among the non-default args.
    assert verdict.ok, redact(verdict.message + extra)
    if unchecked:
        not_judged(redact(f"log verdict passed ({first}), but {unchecked}"))


def test_kv_pool_holds_the_target_requirement(ml4_boot_log: LogView, ml4_target: Target,
                                              kv_metrics: MetricsRead,
                                              engine_metrics: EngineMetrics, ml4_attach_log: Callable[..., str],
                                              record_property: Callable[[str, Any], None]) -> None:
    verdict = judge_kv_pool(ml4_boot_log, ml4_target, _cache_info(kv_metrics.snapshots))
    if verdict.ok and kv_metrics.errors:
        verdict = Verdict(verdict.name, False, f"{kv_metrics.errors[0]}\n(the KV pool cross-check with "
                          f"vllm:cache_config_info needs it)\n{verdict.message}", judged=verdict.judged)
    _judge(verdict, ml4_boot_log, ml4_attach_log, record_property, unchecked=engine_metrics.missing)


def test_max_concurrency_at_max_model_len(ml4_boot_log: LogView, ml4_target: Target,
                                          ml4_attach_log: Callable[..., str],
                                          record_property: Callable[[str, Any], None]) -> None:
    _judge(judge_max_concurrency(ml4_boot_log, ml4_target), ml4_boot_log, ml4_attach_log, record_property)


def load_failed(load: LoadResult) -> bool:
    return bool(load.errors)


def _load_note(load: LoadResult) -> str:
    note = f"\nload: {load.completed}/{load.requests} requests completed"
    if load.errors:
        note += f"; first error: {load.errors[0]}"
    return note


def test_no_oom_or_engine_death_since_boot(kv_load: LoadResult, ml4_logs: LogReader,
                                           ml4_attach_log: Callable[..., str],
                                           record_property: Callable[[str, Any], None]) -> None:
    view = LogView(ml4_logs.since_last_boot(), ml4_logs.describe())
    verdict = judge_no_failures(view)
    if verdict.ok and load_failed(kv_load):
        verdict = Verdict("no_failures", False, "the load failed but the engine log has no known failure line "
                                                f"since boot; last lines:\n{view.tail(15)}")
    _judge(verdict, view, ml4_attach_log, record_property, _load_note(kv_load))


def _session_view(logs: LogReader, session_start: float) -> LogView:
    # "During the session": a long-running engine's stats from last week's traffic are not this session's peak.
    return LogView(logs.since_last_boot(since=session_start - 1), logs.describe())


def test_peak_kv_usage_under_limit(kv_load: LoadResult, ml4_logs: LogReader, ml4_target: Target,
                                   ml4_session_start: float, engine_metrics: EngineMetrics,
                                   ml4_attach_log: Callable[..., str],
                                   record_property: Callable[[str, Any], None]) -> None:
    view = _session_view(ml4_logs, ml4_session_start)
    verdict = judge_peak_usage(view, ml4_target, kv_load.metric_peak_pct)
    if verdict.ok and kv_load.metrics_error:
        verdict = Verdict(verdict.name, False, f"{kv_load.metrics_error} while the load ran: the peak of "
                          f"vllm:kv_cache_usage_perc is unknown\n{verdict.message}", judged=verdict.judged)
    if verdict.ok and load_failed(kv_load):
        # A usage figure from an engine that died under the load proves nothing about its peak.
        failures = root_causes_first(view.failures())
        cause = failures[0].line.splitlines()[0] if failures else kv_load.errors[0]
        verdict = Verdict(verdict.name, False, f"the load failed, so its KV usage proves nothing: {cause}\n"
                          f"{verdict.message}\nengine failure lines:\n" + quote(failures),
                          judged=failures or verdict.judged)
    _judge(verdict, view, ml4_attach_log, record_property, _load_note(kv_load), unchecked=engine_metrics.missing)


def test_spec_decode_acceptance_within_range(kv_load: LoadResult, ml4_logs: LogReader, ml4_target: Target,
                                             ml4_session_start: float, engine_metrics: EngineMetrics,
                                             ml4_attach_log: Callable[..., str],
                                             record_property: Callable[[str, Any], None]) -> None:
    spec, gates = ml4_target.engine.speculative, ml4_target.gates
    if spec is None:
        pytest.skip(f"target {ml4_target.name} runs no speculative decoding")
    if gates.spec_acceptance_length is None and gates.spec_position_rate is None:
        pytest.skip(f"target {ml4_target.name} sets no spec-decode acceptance range in its gates")
    view = _session_view(ml4_logs, ml4_session_start)
    _judge(judge_spec_decode(view, ml4_target, kv_load.spec), view, ml4_attach_log, record_property,
           _load_note(kv_load), unchecked=engine_metrics.missing)
