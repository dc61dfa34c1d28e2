"""The simulator's performance model (harness/pytest_ml4_sim/sim/perfmodel.py) against its calibration targets.

rtxpro6000-tp8 follows seed 000's table (ITL by running sequences, burst prefill spacing, acceptance); the Dynamo
targets sit just inside the seed-002 gate at c32, so that twice the ITL falls outside it.
"""

from __future__ import annotations

import random
import statistics

import pytest
from pytest_ml4_sim.sim.perfmodel import (
    TIME_SCALE_ENV,
    Curve,
    PerfModel,
    QueueState,
    profile_for,
)

from pytest_ml4.target.model import load_target

DYNAMO = ("gb300-agg", "gb300-disagg", "vr200-agg", "vr200-disagg")


def test_curve_interpolates_and_extrapolates() -> None:
    c = Curve({1: 1.0, 3: 2.0, 5: 2.0})
    assert c(0) == 1.0 and c(2) == 1.5 and c(4) == 2.0 and c(9) == 2.0
    assert Curve({1: 1.0, 2: 2.0})(4) == 4.0


def test_rtx_itl_follows_the_seed_table() -> None:
    perf = PerfModel(load_target("rtxpro6000-tp8"))
    for running, seed_ms in ((1, 11.7), (4, 17.1), (8, 21.5), (16, 31.5)):
        assert perf.itl(running) * 1000 == pytest.approx(seed_ms, rel=0.01)
    # A step emits mean_tokens_per_step tokens per sequence, so per token it costs the ITL.
    assert perf.step_time(16) / perf.mean_tokens_per_step() == pytest.approx(perf.itl(16))


def test_rtx_prefill_burst_spacing_and_load() -> None:
    perf = PerfModel(load_target("rtxpro6000-tp8"))
    idle = perf.ttft(550, QueueState())
    # Seed c1 TTFT p50 0.56 s, less the simulator's own request handling, which the client also sees.
    assert idle + perf.ttft_overhead_s == pytest.approx(0.56, abs=0.01)
    # The k-th of a burst waits k prompts of prefill: c16's last starts ~15 x 0.43 s later (seed p99 7.5 s).
    assert 15 * perf.prefill_s(550) + idle == pytest.approx(7.0, abs=0.5)
    assert perf.ttft(550, QueueState(running=15)) > 1.5 * idle           # steady c16 TTFT p50 1.59 s


def test_rtx_acceptance_in_the_seed_range_with_per_request_spread() -> None:
    perf = PerfModel(load_target("rtxpro6000-tp8"))
    assert all(0.61 <= r <= 1.0 for r in perf.position_rates)
    assert 2.24 <= perf.mean_tokens_per_step() <= 4.0
    rng = random.Random(1)
    scales = [perf.sequence_scale(rng) for _ in range(4000)]
    assert statistics.fmean(scales) == pytest.approx(1.0, abs=0.01)
    assert 0.05 < statistics.pstdev(scales) < 0.12
    slow = statistics.fmean(perf.accepted_tokens(rng, 0.85)[0] for _ in range(20000))
    fast = statistics.fmean(perf.accepted_tokens(rng, 1.0)[0] for _ in range(20000))
    assert slow < fast - 0.2


@pytest.mark.parametrize("name", DYNAMO)
def test_dynamo_profiles_sit_just_inside_the_gate(name: str) -> None:
    target = load_target(name)
    prof = profile_for(target)
    running = int(prof["gate_running"])            # sequences per decode worker at the top sweep concurrency
    perf = PerfModel(target)
    gate_tok_s = target.gates.decode_tok_s_user_p50_min
    for r in (running - 4, running, running + 4):  # an uneven routing split stays inside
        tok_s = 1.0 / perf.itl(r)
        assert gate_tok_s < tok_s < 1.3 * gate_tok_s, f"{name}: {tok_s:.1f} tok/s/user with {r} running"
    slow = PerfModel(target, itl_factor=2.0)
    assert 1.0 / slow.itl(running - 8) < gate_tok_s                         # a 2x ITL regression fails the gate
    ttft = perf.ttft(target.perf.isl, QueueState(running=running - 1))
    assert 0.6 * target.gates.ttft_p50_s_max < ttft < target.gates.ttft_p50_s_max
    assert "estimate" in prof["source"]


def test_time_scale_compresses_every_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    target = load_target("rtxpro6000-tp8")
    real = PerfModel(target)
    monkeypatch.setenv(TIME_SCALE_ENV, "4")
    fast = PerfModel(target)
    assert fast.step_time(8) == pytest.approx(real.step_time(8) / 4)
    assert fast.prefill_s(550) == pytest.approx(real.prefill_s(550) / 4)
    # The simulator's own handling overhead is real time in any run, so it is taken out after scaling.
    o = real.ttft_overhead_s
    assert fast.ttft(550, QueueState(running=3)) + o == pytest.approx((real.ttft(550, QueueState(running=3)) + o) / 4)
    assert fast.itl(8) == real.itl(8)                                        # reports stay in real time
    monkeypatch.setenv(TIME_SCALE_ENV, "0")
    with pytest.raises(ValueError, match=TIME_SCALE_ENV):
        PerfModel(target)


def test_sim_extra_overrides_the_profile() -> None:
    target = load_target("rtxpro6000-tp8", overrides={"sim": {"extra": {"acceptance_spread": 0.0,
                                                                          "itl_growth_by_running": {1: 1, 2: 3}}}})
    perf = PerfModel(target)
    assert perf.sequence_scale(random.Random(0)) == 1.0
    assert perf.itl(2) == pytest.approx(3 * perf.itl(1))


def test_spec_accept_scale_fault_scales_every_position() -> None:
    """Fault ``spec_accept_scale=0.6``: position 0 accepts about 0.56 of its drafts, under seed 000's 0.61 floor."""
    target = load_target("rtxpro6000-tp8")
    rng = random.Random(3)
    healthy, drifted = PerfModel(target), PerfModel(target, accept_scale=0.6)
    first = [drifted.accepted_tokens(rng)[1] >= 1 for _ in range(5000)]
    assert statistics.fmean(first) == pytest.approx(0.6 * healthy.position_rates[0], abs=0.01)
    assert statistics.fmean(first) < 0.61
