"""The simulated engine core: one asyncio step loop over all running sequences.

Like vLLM's scheduler it keeps at most ``engine.max_num_seqs`` sequences running and a FIFO waiting queue.
An admitted sequence first prefills (``PerfModel.ttft``; prefills are serialised, so a burst queues), then
every engine step emits 1 token per running sequence, or 1..k+1 with speculative decoding
(``PerfModel.accepted_tokens``).  A step lasts ``PerfModel.step_time(running)``.  The loop feeds the Prometheus
series and the periodic ``Engine 000: ...`` / ``SpecDecoding metrics: ...`` log lines.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_ml4_sim.sim.perfmodel import PerfModel, QueueState
from pytest_ml4_sim.sim.promstats import SimMetrics


@dataclass(eq=False)
class Sequence:
    """One request inside the engine; ``queue`` receives token counts (0 = aborted/failed)."""

    req_id: str
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    finish_reason: str
    params_max_tokens: int | None = None
    #: Chained hashes of the prompt's full KV blocks (prefix caching); see ``block_hashes``.
    block_hashes: tuple[int, ...] = ()
    cached_tokens: int = 0
    queue: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    arrival: float = 0.0
    admitted_at: float = 0.0
    ready_at: float = 0.0
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    emitted: int = 0
    aborted: bool = False
    #: This request's draft-acceptance factor: acceptance differs between prompts (seed 000 logs 2.24-4.00), which
    #: is what puts the seed's ITL p99 7-14 % above p50 even at c1.
    accept_scale: float = 1.0
    #: Fault ``tail_slow``: this request decodes only every N-th engine step (1: every step).
    decode_every: int = 1
    steps_seen: int = 0

    @property
    def done(self) -> bool:
        return self.emitted >= self.output_tokens


def block_hashes(token_ids: list[int], block_size: int) -> tuple[int, ...]:
    """vLLM-style prefix-cache keys: one chained hash per full block of ``block_size`` prompt tokens."""
    out: list[int] = []
    h = 0
    for i in range(0, len(token_ids) - block_size + 1, block_size):
        h = hash((h, tuple(token_ids[i:i + block_size])))
        out.append(h)
    return tuple(out)


@dataclass
class _Window:
    """Counters since the last periodic log line."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)


class Engine:
    """Scheduler + step loop.  ``add(seq)`` enqueues; the caller then awaits ``seq.queue``."""

    def __init__(self, *, perf: PerfModel, metrics: SimMetrics, max_num_seqs: int, kv_pool_tokens: int,
                 log: Callable[[str, str, int, str], None], seed: int = 0, stats_interval_s: float = 10.0,
                 block_size: int = 16, prefix_caching: bool = True,
                 crash_on_first_step: Callable[[int], None] | None = None, leaked_tokens: int = 0) -> None:
        self.perf = perf
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.kv_pool_tokens = max(kv_pool_tokens, 1)
        #: KV blocks held since boot and never freed (fault kv_leak): they count as used, as vLLM's do.
        self.leaked_tokens = leaked_tokens
        self.log = log
        self.rng = random.Random(seed)
        self.stats_interval_s = stats_interval_s
        self.crash_on_first_step = crash_on_first_step
        self.running: list[Sequence] = []
        self.waiting: deque[Sequence] = deque()
        self._wake = asyncio.Event()
        self._prefill_free_at = 0.0
        self._deadline = 0.0
        self._admitted = 0
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        # Prefix cache: block hash -> None, in LRU order, bounded by the KV pool.
        self._prefix_cache: OrderedDict[int, None] = OrderedDict()
        self._prefix_capacity = max(self.kv_pool_tokens // max(block_size, 1), 1)
        # vLLM's hit rate in the stats line covers the most recent requests (CachingMetrics, 1000 requests).
        self._recent_prefix: deque[tuple[int, int]] = deque(maxlen=1000)
        #: Told of every prefix-cache change: (sequence, blocks it hit, hashes evicted). A Dynamo worker publishes
        #: these as KV events for the router (pytest_ml4_sim.sim.dynamo_worker.KvEvents).
        self.on_prefix_cache: Callable[[Sequence, int, list[int]], None] | None = None
        self._win = _Window(per_pos=[0] * perf.num_spec)
        self._last_log = time.monotonic()
        self._had_traffic = False
        self.dead = False
        self._task: asyncio.Task[None] | None = None
        self._stats_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ public
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())
        if self.stats_interval_s > 0:
            self._stats_task = asyncio.get_running_loop().create_task(self._stats_loop())

    async def stop(self) -> None:
        for t in (self._task, self._stats_task):
            if t:
                t.cancel()

    def add(self, seq: Sequence) -> None:
        seq.arrival = time.monotonic()
        if self.dead:
            seq.queue.put_nowait(0)
            return
        self.waiting.append(seq)
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        seq.aborted = True
        self._wake.set()

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def _kv_used(self) -> int:
        return self.leaked_tokens + sum(s.prompt_tokens + s.emitted for s in self.running)

    def kv_usage(self) -> float:
        return min(self._kv_used() / self.kv_pool_tokens, 1.0)

    # ------------------------------------------------------------------ loop
    async def _loop(self) -> None:
        try:
            await self._steps()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a simulator bug must look like engine death, not a hang
            self.dead = True
            self.log("ERROR", "core.py", 1056, f"EngineCore encountered a fatal error. {type(exc).__name__}: {exc}")
            for s in [*self.running, *self.waiting]:
                s.queue.put_nowait(0)
            self.running.clear()
            self.waiting.clear()

    async def _steps(self) -> None:
        while True:
            self._reap_aborted()
            self._admit()
            now = time.monotonic()
            prefilled = [s for s in self.running if s.emitted == 0 and s.ready_at <= now]
            decoding = [s for s in self.running if s.emitted > 0]
            if self.crash_on_first_step is not None and (prefilled or decoding):
                # A boot that cannot survive a large step (BootResult.crash_on_first_step) dies here.
                self.crash_on_first_step(sum(s.prompt_tokens for s in prefilled) + len(decoding))
            for s in prefilled:
                self._first_token(s, now)
            self._finish_done()
            decoding = [s for s in self.running if s.emitted > 0]
            self._update_gauges()
            if decoding:
                await self._sleep_step(self.perf.step_time(len(decoding)))
                self._decode_step(decoding)
                self._finish_done()
                continue
            self._deadline = 0.0
            pending = [s.ready_at for s in self.running if s.emitted == 0]
            timeout = max(min(pending) - time.monotonic(), 0.0) if pending else None
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    async def _sleep_step(self, dt: float) -> None:
        """Sleep until the step's deadline; deadlines follow each other back to back so that the loop's own
        processing time does not stretch the inter-token latency (unless the loop falls a whole step behind)."""
        now = time.monotonic()
        prev = self._deadline
        deadline = prev + dt if prev and now - prev < dt else now + dt
        self._deadline = deadline
        await asyncio.sleep(max(deadline - now, 0.0))

    def _reap_aborted(self) -> None:
        if any(s.aborted for s in self.running):
            for s in [s for s in self.running if s.aborted]:
                self.running.remove(s)
                self.metrics.inc("vllm:request_success", finished_reason="abort")
        if any(s.aborted for s in self.waiting):
            self.waiting = deque(s for s in self.waiting if not s.aborted)

    def _admit(self) -> None:
        now = time.monotonic()
        while self.waiting and len(self.running) < self.max_num_seqs:
            head = self.waiting[0]
            # Like vLLM's scheduler, a request waits while its prompt does not fit in the free KV blocks.
            if self.running and self._kv_used() + head.prompt_tokens > self.kv_pool_tokens:
                break
            s = self.waiting.popleft()
            s.admitted_at = now
            s.accept_scale = self.perf.sequence_scale(self.rng)
            self._admitted += 1
            s.decode_every = self.perf.decode_every(self._admitted)
            hits = self._prefix_lookup(s)
            s.cached_tokens = hits
            computed = s.prompt_tokens - hits
            backlog = max(self._prefill_free_at - now, 0.0)
            ttft = self.perf.ttft(computed, QueueState(len(self.running), len(self.waiting), backlog))
            # Prefill chunks of different requests share one token budget: they run one after another.
            self._prefill_free_at = now + backlog + self.perf.prefill_s(computed)
            s.ready_at = now + ttft
            self.running.append(s)
            m = self.metrics
            m.inc("vllm:prompt_tokens", s.prompt_tokens)
            m.inc("vllm:prompt_tokens_by_source", computed, source="local_compute")
            m.inc("vllm:prompt_tokens_by_source", hits, source="local_cache_hit")
            m.inc("vllm:prompt_tokens_cached", hits)
            m.inc("vllm:prompt_tokens_cached_by_source", hits, source="device")
            m.inc("vllm:prefix_cache_queries", s.prompt_tokens)
            m.inc("vllm:prefix_cache_hits", hits)
            self._win.prompt_tokens += s.prompt_tokens
            self._recent_prefix.append((s.prompt_tokens, hits))
            self._had_traffic = True

    def _prefix_lookup(self, s: Sequence) -> int:
        """Tokens of ``s``'s prompt already in the prefix cache; then caches all of its blocks (LRU)."""
        cache = self._prefix_cache
        hit_blocks = 0
        for h in s.block_hashes:
            if h not in cache or not self.prefix_caching:
                break
            hit_blocks += 1
        for h in s.block_hashes:
            cache[h] = None
            cache.move_to_end(h)
        evicted: list[int] = []
        while len(cache) > self._prefix_capacity:
            evicted.append(cache.popitem(last=False)[0])
        if self.on_prefix_cache is not None:
            self.on_prefix_cache(s, hit_blocks, evicted)
        # vLLM always recomputes at least the last prompt token.
        return min(hit_blocks * self.block_size, max(s.prompt_tokens - 1, 0))

    def _first_token(self, s: Sequence, now: float) -> None:
        s.first_token_at = s.last_token_at = now
        self._emit(s, 1)
        self.metrics.observe("vllm:time_to_first_token_seconds", now - s.arrival)
        self.metrics.observe("vllm:iteration_tokens_total", s.prompt_tokens + 1)

    def _decode_step(self, decoding: list[Sequence]) -> None:
        now = time.monotonic()
        step_tokens = 0
        for s in decoding:
            if s.aborted or s.done:
                continue
            s.steps_seen += 1
            if s.steps_seen % s.decode_every:
                continue  # a tail-slowed request sits this step out (its ITL is N steps)
            emitted, accepted = self.perf.accepted_tokens(self.rng, s.accept_scale) if self.perf.num_spec else (1, 0)
            n = min(emitted, s.output_tokens - s.emitted)
            self.metrics.observe("vllm:inter_token_latency_seconds", now - s.last_token_at)
            s.last_token_at = now
            self._emit(s, n)
            step_tokens += n
            if self.perf.num_spec:
                self._spec(accepted)
        if step_tokens:
            self.metrics.observe("vllm:iteration_tokens_total", step_tokens)

    def _spec(self, accepted: int) -> None:
        k = self.perf.num_spec
        self.metrics.inc("vllm:spec_decode_num_drafts")
        self.metrics.inc("vllm:spec_decode_num_draft_tokens", k)
        self.metrics.inc("vllm:spec_decode_num_accepted_tokens", accepted)
        for pos in range(accepted):
            self.metrics.inc("vllm:spec_decode_num_accepted_tokens_per_pos", position=str(pos))
            self._win.per_pos[pos] += 1
        self._win.drafts += 1
        self._win.draft_tokens += k
        self._win.accepted += accepted

    def _emit(self, s: Sequence, n: int) -> None:
        s.emitted += n
        self.metrics.inc("vllm:generation_tokens", n)
        self._win.generation_tokens += n
        s.queue.put_nowait(n)

    def _finish_done(self) -> None:
        done = [s for s in self.running if s.done or s.aborted]
        for s in done:
            self.running.remove(s)
            if s.aborted:
                self.metrics.inc("vllm:request_success", finished_reason="abort")
                continue
            self._record_finished(s)
        if done:
            self._wake.set()

    def _record_finished(self, s: Sequence) -> None:
        now = time.monotonic()
        m = self.metrics
        m.inc("vllm:request_success", finished_reason=s.finish_reason)
        m.observe("vllm:request_prompt_tokens", s.prompt_tokens)
        m.observe("vllm:request_generation_tokens", s.emitted)
        m.observe("vllm:request_max_num_generation_tokens", s.max_tokens)
        m.observe("vllm:request_params_n", 1)
        if s.params_max_tokens is not None:
            m.observe("vllm:request_params_max_tokens", s.params_max_tokens)
        m.observe("vllm:e2e_request_latency_seconds", now - s.arrival)
        m.observe("vllm:request_queue_time_seconds", s.admitted_at - s.arrival)
        m.observe("vllm:request_inference_time_seconds", now - s.admitted_at)
        m.observe("vllm:request_prefill_time_seconds", s.first_token_at - s.admitted_at)
        m.observe("vllm:request_decode_time_seconds", now - s.first_token_at)
        m.observe("vllm:request_num_preemptions", 0)
        m.observe("vllm:request_prefill_kv_computed_tokens", s.prompt_tokens - s.cached_tokens)
        if s.emitted > 1:
            m.observe("vllm:request_time_per_output_token_seconds", (now - s.first_token_at) / (s.emitted - 1))

    def _update_gauges(self) -> None:
        m = self.metrics
        m.gauge("vllm:num_requests_running", len(self.running))
        m.gauge("vllm:num_requests_waiting", len(self.waiting))
        m.gauge("vllm:num_requests_waiting_by_reason", len(self.waiting), reason="capacity")
        m.gauge("vllm:kv_cache_usage_perc", self.kv_usage())

    # ------------------------------------------------------------------ periodic log lines
    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(self.stats_interval_s)
            self.log_stats()

    def log_stats(self) -> None:
        """vLLM's LoggingStatLogger.log (0.33, vllm.md §9.3) and the spec-decode line (§9.4)."""
        now = time.monotonic()
        elapsed = max(now - self._last_log, 1e-9)
        w = self._win
        prompt_tp = w.prompt_tokens / elapsed
        gen_tp = w.generation_tokens / elapsed
        active = bool(prompt_tp or gen_tp or self._had_traffic)
        self._had_traffic = bool(prompt_tp or gen_tp)
        level = "INFO" if active else "DEBUG"
        parts = [f"Avg prompt throughput: {prompt_tp:.1f} tokens/s",
                 f"Avg generation throughput: {gen_tp:.1f} tokens/s",
                 f"Running: {len(self.running)} reqs", f"Waiting: {len(self.waiting)} reqs",
                 f"GPU KV cache usage: {self.kv_usage() * 100:.1f}%"]
        queries = sum(q for q, _ in self._recent_prefix)
        if queries:
            hit_rate = 100.0 * sum(h for _, h in self._recent_prefix) / queries
            parts.append(f"Prefix cache hit rate: {hit_rate:.1f}%")
        if level == "INFO":
            self.log(level, "loggers.py", 335, "Engine 000: " + ", ".join(parts))
            if w.drafts:
                rates = ", ".join(f"{c / w.drafts:.3f}" for c in w.per_pos)
                self.log("INFO", "metrics.py", 120,
                         "SpecDecoding metrics: "
                         f"Mean acceptance length: {1 + w.accepted / w.drafts:.2f}, "
                         f"Accepted throughput: {w.accepted / elapsed:.2f} tokens/s, "
                         f"Drafted throughput: {w.draft_tokens / elapsed:.2f} tokens/s, "
                         f"Accepted: {w.accepted} tokens, Drafted: {w.draft_tokens} tokens, "
                         f"Per-position acceptance rate: {rates}, "
                         f"Avg Draft acceptance rate: {100.0 * w.accepted / w.draft_tokens:.1f}%")
        self._win = _Window(per_pos=[0] * self.perf.num_spec)
        self._last_log = now
