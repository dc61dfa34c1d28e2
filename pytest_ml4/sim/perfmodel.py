"""Timing model of the simulated engine: TTFT, engine step time and speculative-decoding acceptance.

All timing maths of the simulator lives here behind three calls the engine loop uses:

* ``ttft(prompt_tokens, queue)`` - seconds from admission to the first token (prefill),
* ``step_time(running)`` - seconds one decode step takes with ``running`` sequences decoding,
* ``accepted_tokens(rng)`` - tokens one sequence emits in one step (1 without speculative decoding,
  1..k+1 with it).

The engine (``engine.py``) calls exactly ``ttft``, ``prefill_s``, ``step_time``, ``accepted_tokens`` and reads
``num_spec``; ``itl`` and ``mean_tokens_per_step`` are for reports and benchmarks.

Parameters come from ``target.sim`` (``ttft_s``, ``itl_ms``, ``prefill_tok_s``, ``extra``) and
``target.engine.speculative``.  Defaults are the seed-000 sweep's c1 point and its ITL growth with load
(ITL p50 11.7 ms at c1 -> 31.5 ms at c16).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pytest_ml4.targets import Target

# ITL growth per extra running sequence, as a fraction of the c1 ITL (seed 000: (31.5/11.7 - 1) / 15 ≈ 0.113).
_DEFAULT_ITL_SLOPE = 0.113
# Per-position acceptance rates for k=3 (seed 000: "per-position acceptance 0.61-1.00", mean length 2.24-4.00).
_DEFAULT_POSITION_RATES = (0.93, 0.81, 0.69)
# Golden-ratio step of the low-discrepancy acceptance sequence.
_PHI = 0.6180339887498949


@dataclass(frozen=True)
class QueueState:
    """What the scheduler looks like when a request is admitted."""

    running: int = 0
    waiting: int = 0
    #: Seconds of prefill work already queued ahead of this request.
    prefill_backlog_s: float = 0.0


class PerfModel:
    """Per-target timing; ``slow_decode`` and ``ttft_spike`` faults scale/offset it."""

    def __init__(self, target: Target, *, itl_factor: float = 1.0, ttft_extra_s: float = 0.0) -> None:
        sim = target.sim
        extra = sim.extra
        self.ttft_s = sim.ttft_s
        self.itl_s = sim.itl_ms / 1000.0
        self.prefill_tok_s = sim.prefill_tok_s
        self.ref_isl = int(extra.get("ref_isl", target.perf.isl))
        self.itl_slope = float(extra.get("itl_slope", _DEFAULT_ITL_SLOPE))
        self.itl_factor = itl_factor
        self.ttft_extra_s = ttft_extra_s
        spec = target.engine.speculative
        self.num_spec = spec.num_speculative_tokens if spec else 0
        rates = extra.get("spec_position_rates") or _DEFAULT_POSITION_RATES
        self.position_rates = tuple(float(r) for r in list(rates)[: self.num_spec]) if self.num_spec else ()
        if self.num_spec and len(self.position_rates) < self.num_spec:
            last = self.position_rates[-1] if self.position_rates else 0.6
            self.position_rates += (last,) * (self.num_spec - len(self.position_rates))
        self._u: float | None = None

    # ---------------------------------------------------------------- prefill
    def ttft(self, prompt_tokens: int, queue: QueueState) -> float:
        """Seconds from admission to the first token: the profile's TTFT at the reference ISL, plus/minus the
        prompt-length difference, plus the prefill work already queued ahead (``queue.prefill_backlog_s``).
        ``prompt_tokens`` counts only tokens to compute (prefix-cache hits excluded).  Time spent waiting for a
        running slot is not included: the engine admits the request only when a slot frees."""
        base = self.ttft_s + (prompt_tokens - self.ref_isl) / self.prefill_tok_s
        return max(base, 0.3 * self.ttft_s) + queue.prefill_backlog_s + self.ttft_extra_s

    def prefill_s(self, computed_tokens: int) -> float:
        """Engine time one request's prefill occupies (prefills of concurrent requests queue behind it)."""
        return computed_tokens / self.prefill_tok_s

    # ---------------------------------------------------------------- decode
    def itl(self, running: int) -> float:
        """Per-token inter-token latency with ``running`` sequences decoding."""
        return self.itl_s * (1.0 + self.itl_slope * max(running - 1, 0)) * self.itl_factor

    def mean_tokens_per_step(self) -> float:
        """Expected tokens per sequence and step: 1 + sum of per-position acceptance rates."""
        return 1.0 + sum(self.position_rates)

    def step_time(self, running: int) -> float:
        """One engine step; with speculative decoding a step yields several tokens, so it lasts longer."""
        return self.itl(running) * self.mean_tokens_per_step()

    def accepted_tokens(self, rng: random.Random) -> tuple[int, int]:
        """``(emitted, accepted_drafts)`` for one sequence in one step; emitted = 1 + accepted_drafts.

        Draft position i is accepted with unconditional probability ``position_rates[i]`` (rates fall with the
        position, so acceptance is a prefix).  The draw is a golden-ratio low-discrepancy sequence started at a
        random offset: any window of steps then shows per-position rates within a few drafts of the profile,
        as a stable deployment's short log windows do, instead of binomial noise that would make gates flaky."""
        if self._u is None:
            self._u = rng.random()
        self._u = (self._u + _PHI) % 1.0
        accepted = 0
        for rate in self.position_rates:
            if self._u >= rate:
                break
            accepted += 1
        return 1 + accepted, accepted
