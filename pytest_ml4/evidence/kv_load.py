"""The KV checks' short load and the engines' /metrics it reads: what the KV verdicts (``checks/kv.py``) judge.

:func:`run_load` sends concurrent requests, one with a prompt over ``max_num_batched_tokens`` (a full step: where
seed 000's crashing config died), while a poller thread keeps the peak of ``vllm:kv_cache_usage_perc``; the
spec-decode counters are read before and after. :class:`EngineMetrics` says where the ``vllm:*`` families are: the
engine's own /metrics, or on Dynamo every worker's (``Endpoint.worker_metrics_urls``). The load's sizes and
pacing are in ``fixtures/kv/load.yaml``. Nothing here needs pytest.
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.evidence.metrics import MetricsError, MetricsSnapshot, scrape
from pytest_ml4.locations import data_file
from pytest_ml4.logs import LogReader, LogView, StatsLine
from pytest_ml4.stacks import Stack, stack_for
from pytest_ml4.target.model import Target

LOAD_FILE = data_file("kv", "load.yaml")


class LoadSettings(Strict):
    """The load's sizes and pacing (``pytest_ml4/data/kv/load.yaml``; the file says what each is)."""

    concurrency: int
    large_prompt_steps: float
    max_prompt_tokens: int
    small_prompt_tokens: int
    max_tokens: int
    request_timeout_s: float
    metrics_poll_s: float
    stats_wait_s: float
    chars_per_token: int
    paragraph: str


@functools.cache
def load_settings() -> LoadSettings:
    return load_yaml(LOAD_FILE, LoadSettings)


@dataclass(frozen=True)
class SpecCounts:
    """Speculative-decoding counters over a window (from /metrics deltas)."""

    drafts: float
    accepted: float
    accepted_per_pos: tuple[float, ...]

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 0.0

    @property
    def per_position(self) -> tuple[float, ...]:
        return tuple(a / self.drafts for a in self.accepted_per_pos) if self.drafts else ()


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

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def note(self) -> str:
        """A line for a verdict's message: how many requests completed and the first error."""
        note = f"\nload: {self.completed}/{self.requests} requests completed"
        if self.errors:
            note += f"; first error: {self.errors[0]}"
        return note


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
    #: The serving stack: its engine's family names.
    adapter: Stack
    #: Why there are none (names the target field to set), or None.
    missing: str | None = None

    @classmethod
    def of(cls, endpoint: Endpoint, target: Target) -> EngineMetrics:
        stack = stack_for(target)
        if not stack.routes_workers:
            url = endpoint.effective_metrics_url
            return cls((url,), (url,), stack)
        by_role = endpoint.worker_metrics_urls
        engine_urls = tuple(u for role in ("worker", "decode") for u in by_role.get(role, ()))
        urls = endpoint.all_worker_metrics_urls()
        if urls:
            return cls(urls, engine_urls, stack)
        variables = ", ".join(f"{r}: {v}" for r, v in target.endpoint.worker_metrics_url_env.items()) or "none"
        families = f"{stack.metric_prefix}*"
        return cls((), (), stack, f"the {families} cross-check needs the Dynamo workers' /metrics and no worker "
                                  f"metrics URL is known: set the variables of endpoint.worker_metrics_url_env "
                                  f"({variables}) of target {target.name} (the frontend's /metrics has no {families} "
                                  f"families)")

    def snapshots(self, urls: tuple[str, ...] | None = None) -> list[MetricsSnapshot | None]:
        return [_scrape(u) for u in (self.urls if urls is None else urls)]


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

    def cache_info(self, family: str) -> dict[str, str] | None:
        """The labels of the first sample of the engine's cache-config ``family`` (the stack's
        ``engine_metric("cache_config_info")``; None when no engine exposes it)."""
        samples = next((snap.samples(family) for snap in self.snapshots if snap and snap.samples(family)), [])
        return dict(samples[0].labels) if samples else None


def _spec_delta(before: list[MetricsSnapshot | None], after: list[MetricsSnapshot | None],
                k: int, stack: Stack) -> SpecCounts | None:
    """The spec-decode counters' increase summed over every engine (None when one of them could not be read)."""
    if not k or not before or any(s is None for s in before + after):
        return None

    def delta(name: str, **labels: str) -> float:
        return sum(a.sum(name, **labels) - b.sum(name, **labels) for a, b in zip(after, before))  # type: ignore[union-attr]

    drafts = delta(stack.engine_metric("spec_decode_drafts"))
    if drafts <= 0:
        return None
    per_position = stack.engine_metric("spec_decode_accepted_per_position")
    return SpecCounts(drafts, delta(stack.engine_metric("spec_decode_accepted_tokens")),
                      tuple(delta(per_position, position=str(i))
                            for i in range(k)))


def _prompt(i: int, tokens: int) -> str:
    load = load_settings()
    paragraph = " ".join(load.paragraph.split())
    want = tokens * load.chars_per_token
    body = (paragraph + " ") * (want // (len(paragraph) + 1) + 1)
    return f"Request {i} of the KV check. " + body[:want]


def _poll_usage(metrics: EngineMetrics, stop: threading.Event, result: LoadResult) -> None:
    """Peak of the engines' KV-cache usage gauge (0..1, max over engines and workers) while the load runs."""
    gauge = metrics.adapter.engine_metric("kv_cache_usage")
    while not stop.is_set():
        for url in metrics.urls:
            snap = _scrape(url)
            if snap is None:
                result.metrics_error = result.metrics_error or f"cannot read the engine's metrics at {url}"
                continue
            values = [s.value for s in snap.samples(gauge)]
            if not values:
                # A /metrics that answers without the gauge (on Dynamo: the worker's engine-metrics callback
                # failed and the runtime served its own families only) is as unreadable as a 500.
                result.metrics_error = result.metrics_error or (
                    f"the engine's metrics at {url} carry no {gauge}")
            else:
                peak = max(values) * 100
                result.metric_peak_pct = max(peak, result.metric_peak_pct or 0.0)
        stop.wait(load_settings().metrics_poll_s)


def _one_request(http: httpx.Client, model: str, prompt: str) -> str | None:
    load = load_settings()
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            # min_tokens: the answer would end at its EOS after ~30 tokens, too few drafts to judge acceptance.
            "max_tokens": load.max_tokens, "min_tokens": load.max_tokens, "temperature": 0.0}
    try:
        resp = http.post("chat/completions", json=body, timeout=load.request_timeout_s)
    except httpx.HTTPError as err:
        return f"{type(err).__name__}: {err}"
    if resp.status_code != 200:
        return f"HTTP {resp.status_code}: {resp.text[:300]}"
    return None


def run_load(http: httpx.Client, endpoint: Endpoint, target: Target) -> LoadResult:
    """Concurrent requests, one with a prompt over ``max_num_batched_tokens`` (a full step); polls /metrics."""
    load, eng = load_settings(), target.engine
    n = max(1, min(load.concurrency, eng.max_num_seqs))
    large = min(load.max_prompt_tokens, eng.max_model_len // 2, int(eng.max_num_batched_tokens * load.large_prompt_steps))
    sizes = [large] + [min(load.small_prompt_tokens, large)] * (n - 1)
    result = LoadResult(started=time.time(), requests=n)
    metrics = EngineMetrics.of(endpoint, target)
    before = metrics.snapshots()
    stop = threading.Event()
    poller = threading.Thread(target=_poll_usage, args=(metrics, stop, result), daemon=True)
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
    result.spec = _spec_delta(before, metrics.snapshots(), k, metrics.adapter)
    return result


def wait_for_stats_line(logs: LogReader, since: float) -> None:
    """vLLM logs its stats every 10 s once there was traffic; wait for the one covering the load."""
    deadline = time.monotonic() + load_settings().stats_wait_s
    while time.monotonic() < deadline:
        # Only the lines since the load: cheap over ssh, and enough to see the stats line or the engine's death.
        view = LogView(logs.read(since=since - 1), logs.describe())
        if view.failures() or view.all(StatsLine):
            return
        time.sleep(0.5)
