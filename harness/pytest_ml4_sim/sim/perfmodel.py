"""Timing model of the simulated engine: TTFT, engine step time and speculative-decoding acceptance.

All timing maths of the simulator lives here; the engine (``engine.py``) calls exactly ``ttft``, ``prefill_s``,
``step_time``, ``accepted_tokens`` (and ``sequence_scale`` when it supports per-request acceptance) and reads
``num_spec``; ``itl`` and ``mean_tokens_per_step`` are for reports and benchmarks.

* ``ttft(prompt_tokens, queue)``: the request's own prefill (``sim.ttft_s`` at the reference ISL, plus or minus the
  prompt-length difference at ``prefill_tok_s``), slowed by the sequences already running
  (``ttft_load_by_running``: chunked prefill shares each step with decode), plus the prefill work queued ahead of it
  (``queue.prefill_backlog_s``: a burst of arrivals drains one prompt after another), plus the ``ttft_spike`` fault.
  Waiting for a free running slot (past ``max_num_seqs``) is the engine's queue, not part of this figure.
* ``step_time(running)``: ``itl(running)`` x the mean tokens a sequence emits per step; ``itl(running)`` is
  ``sim.itl_ms`` x ``itl_growth_by_running`` (piecewise linear), x the ``slow_decode`` fault.
* ``decode_every(n)``: the ``tail_slow=P`` fault: every round(1/P)-th admitted request decodes only every
  ``TAIL_SLOW_FACTOR``-th step (the tail slows, the median does not).
* ``accepted_tokens(rng, scale)``: 1 + accepted drafts, position i accepted with probability
  ``spec_position_rates[i] x scale`` (a low-discrepancy draw, so short log windows show steady rates); ``sequence_scale(rng)`` draws a request's scale (mean 1,
  ``acceptance_spread``), which spreads per-request ITL the way seed 000's ITL p99 sits above its p50.

Calibration data per target: ``pytest_ml4/data/perfmodel/profiles.yaml`` (rtxpro6000-tp8 reproduces seed 000's sweep, see
``benchmarks/seed_sweep.py``; the Dynamo targets sit just inside the seed-002 gate). ``target.sim.extra`` keys of the
same names override the file. ``ML4_SIM_TIME_SCALE=K`` divides every duration by K (time-compressed benchmark runs).
"""

from __future__ import annotations

import bisect
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.target.model import Target

PROFILES = data_file("perfmodel", "profiles.yaml")
TIME_SCALE_ENV = "ML4_SIM_TIME_SCALE"
# Without a profile: ITL grows by 11.3 % of the c1 value per extra running sequence (seed 000: 11.7 ms at c1 ->
# 31.5 ms at c16), TTFT does not depend on load.
_DEFAULT_ITL_GROWTH = {1: 1.0, 16: 1.0 + 0.113 * 15}
_DEFAULT_TTFT_LOAD = {0: 1.0, 1: 1.0}
# Per-position acceptance rates for k=3 (seed 000: "per-position acceptance 0.61-1.00", mean length 2.24-4.00).
_DEFAULT_POSITION_RATES = (0.93, 0.81, 0.69)
# Golden-ratio step of the low-discrepancy acceptance sequence.
_PHI = 0.6180339887498949
_MAX_RATE = 0.999
# A request's acceptance factor stays within these bounds: position 3 (0.69) then stays near the seed's 0.61 floor.
_SCALE_BOUNDS = (0.8, 1.2)
#: Fault ``tail_slow``: how much slower the slowed share decodes (far past any ITL SLO, the median untouched).
#: 10, not 4: VR200's 6.5 ms ITL times 4 stays under the workloads' 30 ms SLO, so the kill failed only when a
#: loaded machine added the rest (a vr200-disagg nightly run passed the goodput gate under it).
TAIL_SLOW_FACTOR = 10


@dataclass(frozen=True)
class QueueState:
    """What the scheduler looks like when a request is admitted."""

    running: int = 0
    waiting: int = 0
    #: Seconds of prefill work already queued ahead of this request.
    prefill_backlog_s: float = 0.0


class Profile(Strict):
    """A target's calibration (``pytest_ml4/data/perfmodel/profiles.yaml``; the file says where each comes from).
    A target's ``sim.extra`` may set the same keys on top (:func:`profile_for`)."""

    source: str
    ref_isl: int | None = None
    prefill_tok_s: float | None = None
    #: Running sequences -> ITL factor over c1 (interpolated); or ``itl_slope``: the growth per extra sequence.
    itl_growth_by_running: dict[int, float] | None = None
    itl_slope: float | None = None
    ttft_load_by_running: dict[int, float] | None = None
    ttft_overhead_s: float | None = None
    acceptance_spread: float | None = None
    spec_position_rates: tuple[float, ...] | None = None
    #: Sequences per decode worker at the top sweep concurrency (the gate's point).
    gate_running: int | None = None


@lru_cache(maxsize=4)
def _load_profiles(path: Path) -> dict[str, dict[str, Any]]:
    """target name -> the keys its profile sets (plain data: ``sim.extra`` is merged on top)."""
    if not path.is_file():
        return {}
    return {name: prof.model_dump(exclude_unset=True) for name, prof in load_yaml(path, dict[str, Profile]).items()}


def profile_for(target: Target) -> dict[str, Any]:
    """The target's calibration: the profiles file entry with ``target.sim.extra`` on top."""
    merged = dict(_load_profiles(PROFILES).get(target.name) or {})
    merged.update(target.sim.extra)
    return merged


class Curve:
    """Piecewise-linear y(x) through the given points, extrapolated along the last segment (never below 0)."""

    def __init__(self, points: Mapping[Any, Any]) -> None:
        pts = sorted((float(x), float(y)) for x, y in points.items())
        if not pts:
            raise ValueError("a curve needs at least one point")
        self.xs = [x for x, _ in pts]
        self.ys = [y for _, y in pts]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1 or x <= xs[0]:
            return ys[0]
        i = min(bisect.bisect_right(xs, x), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


def time_scale(env: Mapping[str, str] | None = None) -> float:
    raw = (os.environ if env is None else env).get(TIME_SCALE_ENV, "")
    try:
        k = float(raw) if raw else 1.0
    except ValueError:
        raise ValueError(f"{TIME_SCALE_ENV} must be a positive number, got {raw!r}") from None
    if k <= 0:
        raise ValueError(f"{TIME_SCALE_ENV} must be a positive number, got {raw!r}")
    return k


class PerfModel:
    """Per-target timing; ``slow_decode`` and ``ttft_spike`` faults scale/offset it."""

    def __init__(self, target: Target, *, itl_factor: float = 1.0, ttft_extra_s: float = 0.0,
                 accept_scale: float = 1.0, tail_share: float = 0.0) -> None:
        sim = target.sim
        prof = profile_for(target)
        self.ttft_s = sim.ttft_s
        self.itl_s = sim.itl_ms / 1000.0
        self.prefill_tok_s = float(prof.get("prefill_tok_s", sim.prefill_tok_s))
        self.ref_isl = int(prof.get("ref_isl", target.perf.isl))
        self.itl_growth = Curve(prof.get("itl_growth_by_running") or _itl_growth_from_slope(prof))
        self.ttft_load = Curve(prof.get("ttft_load_by_running") or _DEFAULT_TTFT_LOAD)
        self.acceptance_spread = float(prof.get("acceptance_spread", 0.0))
        self.ttft_overhead_s = float(prof.get("ttft_overhead_s", 0.0))
        self.itl_factor = itl_factor
        self.ttft_extra_s = ttft_extra_s
        #: Fault ``spec_accept_scale``: every draft position's acceptance times F (a drifted draft model).
        self.accept_scale = accept_scale
        #: Fault ``tail_slow``: every round(1/share)-th admitted request decodes TAIL_SLOW_FACTOR x slower.
        self.tail_every = round(1 / tail_share) if tail_share > 0 else 0
        self.time_scale = time_scale()
        spec = target.engine.speculative
        self.num_spec = spec.num_speculative_tokens if spec else 0
        rates = prof.get("spec_position_rates") or _DEFAULT_POSITION_RATES
        self.position_rates = tuple(float(r) for r in list(rates)[: self.num_spec]) if self.num_spec else ()
        if self.num_spec and len(self.position_rates) < self.num_spec:
            last = self.position_rates[-1] if self.position_rates else 0.6
            self.position_rates += (last,) * (self.num_spec - len(self.position_rates))
        self._u: float | None = None

    # ---------------------------------------------------------------- prefill
    def own_prefill_s(self, prompt_tokens: int, running: int = 0) -> float:
        """This request's prefill with ``running`` sequences already in the batch, before any queueing."""
        idle = max(self.ttft_s + (prompt_tokens - self.ref_isl) / self.prefill_tok_s, 0.3 * self.ttft_s)
        return idle * self.ttft_load(running)

    def ttft(self, prompt_tokens: int, queue: QueueState) -> float:
        """Seconds from admission to the first token (see the module docstring). ``prompt_tokens`` counts only the
        tokens to compute (prefix-cache hits excluded); ``queue.prefill_backlog_s`` is already in engine time."""
        own = (self.own_prefill_s(prompt_tokens, queue.running) + self.ttft_extra_s) / self.time_scale
        # The simulator's own request handling (HTTP, chat template, tokenisation) costs real time the client sees,
        # also in a time-compressed run; ttft_overhead_s takes it back out so client-side TTFT lands on the target.
        return max(own - self.ttft_overhead_s, 0.0) + queue.prefill_backlog_s

    def prefill_s(self, computed_tokens: int) -> float:
        """Engine time one request's prefill occupies (prefills of concurrent requests queue behind it)."""
        return computed_tokens / self.prefill_tok_s / self.time_scale

    # ---------------------------------------------------------------- decode
    def itl(self, running: int) -> float:
        """Per-token inter-token latency with ``running`` sequences decoding (real time, before time scaling)."""
        return self.itl_s * self.itl_growth(max(running, 1)) * self.itl_factor

    def mean_tokens_per_step(self) -> float:
        """Expected tokens per sequence and step at scale 1: 1 + sum of per-position acceptance rates."""
        return 1.0 + sum(self.position_rates)

    def step_time(self, running: int) -> float:
        """One engine step; with speculative decoding a step yields several tokens, so it lasts longer."""
        return self.itl(running) * self.mean_tokens_per_step() / self.time_scale

    def decode_every(self, admitted: int) -> int:
        """Engine steps per decode step of the ``admitted``-th request: TAIL_SLOW_FACTOR for the tail_slow share,
        1 otherwise. A fixed schedule, not a random draw, so a short run holds the share exactly."""
        return TAIL_SLOW_FACTOR if self.tail_every and admitted % self.tail_every == 0 else 1

    def sequence_scale(self, rng: random.Random) -> float:
        """A request's acceptance factor (mean 1; 1 exactly when the profile has no spread)."""
        if not self.num_spec or self.acceptance_spread <= 0:
            return 1.0
        lo, hi = _SCALE_BOUNDS
        return min(max(rng.gauss(1.0, self.acceptance_spread), lo), hi)

    def accepted_tokens(self, rng: random.Random, scale: float = 1.0) -> tuple[int, int]:
        """``(emitted, accepted_drafts)`` for one sequence in one step; emitted = 1 + accepted_drafts.

        Draft position i is accepted with unconditional probability ``position_rates[i] x scale`` (rates fall with
        the position, so acceptance is a prefix). The draw is a golden-ratio low-discrepancy sequence started at a
        random offset: any window of steps then shows per-position rates within a few drafts of the profile, as a
        stable deployment's short log windows do, instead of binomial noise that would make gates flaky."""
        if self._u is None:
            self._u = rng.random()
        self._u = (self._u + _PHI) % 1.0
        accepted = 0
        for rate in self.position_rates:
            if self._u >= min(rate * scale * self.accept_scale, _MAX_RATE):
                break
            accepted += 1
        return 1 + accepted, accepted


def _itl_growth_from_slope(prof: Mapping[str, Any]) -> dict[int, float]:
    slope = prof.get("itl_slope")
    if slope is None:
        return dict(_DEFAULT_ITL_GROWTH)
    return {1: 1.0, 16: 1.0 + float(slope) * 15}
