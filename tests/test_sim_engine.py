"""The simulator's engine loop and performance-model contract, in-process (no HTTP)."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest
from pytest_ml4_sim.sim.engine import Engine, Sequence, block_hashes
from pytest_ml4_sim.sim.perfmodel import PerfModel, QueueState
from pytest_ml4_sim.sim.promstats import SimMetrics

from pytest_ml4.locations import data_file
from pytest_ml4.target.model import load_target


@pytest.mark.parametrize("name", ["rtxpro6000-tp8", "gb300-agg", "vr200-disagg"])
def test_spec_acceptance_in_seed_range(name: str) -> None:
    perf = PerfModel(load_target(name))
    rng = random.Random(1)
    steps = [perf.accepted_tokens(rng) for _ in range(20000)]
    assert all(1 <= e <= perf.num_spec + 1 and e == 1 + a for e, a in steps)
    mean = statistics.fmean(e for e, _ in steps)
    # Seed 000: "mean acceptance length 2.24-4.00".
    assert 2.24 <= mean <= 4.00
    assert abs(mean - perf.mean_tokens_per_step()) < 0.05


def test_no_speculation_means_one_token_per_step() -> None:
    perf = PerfModel(load_target("gb300-agg", overrides={"engine": {"speculative": None}}))
    assert perf.num_spec == 0 and perf.mean_tokens_per_step() == 1.0


def test_timing_grows_with_load_and_prompt() -> None:
    perf = PerfModel(load_target("rtxpro6000-tp8"))
    assert perf.step_time(1) < perf.step_time(8) < perf.step_time(16)
    idle = QueueState()
    assert perf.ttft(512, idle) < perf.ttft(8192, idle)
    assert perf.ttft(512, QueueState(prefill_backlog_s=2.0)) >= perf.ttft(512, idle) + 2.0
    slow = PerfModel(load_target("rtxpro6000-tp8"), itl_factor=3.0, ttft_extra_s=5.0)
    assert slow.step_time(4) == pytest.approx(3 * perf.step_time(4))
    assert slow.ttft(512, idle) == pytest.approx(perf.ttft(512, idle) + 5.0)


def test_block_hashes_chain_full_blocks_only() -> None:
    a = block_hashes(list(range(40)), 16)
    b = block_hashes([*range(32), 99, 98], 16)
    assert len(a) == 2 and a == b
    assert block_hashes([0, *range(1, 40)], 16)[0] == a[0]
    assert block_hashes([7, *range(1, 40)], 16)[0] != a[0]


def test_engine_caps_running_and_serves_fifo() -> None:
    target = load_target("gb300-agg", overrides={"sim": {"ttft_s": 0.01, "itl_ms": 1.0},
                                                 "engine": {"speculative": None, "max_num_seqs": 2}})
    lines: list[str] = []

    async def scenario() -> tuple[list[str], int]:
        engine = Engine(perf=PerfModel(target), metrics=SimMetrics(target, "m", 100), max_num_seqs=2,
                        kv_pool_tokens=100000, log=lambda *a: lines.append(str(a)), stats_interval_s=0)
        engine.start()
        seqs = [Sequence(f"r{i}", prompt_tokens=20, output_tokens=10, max_tokens=10, finish_reason="stop")
                for i in range(5)]
        finished: list[str] = []
        peak = 0

        async def consume(s: Sequence) -> None:
            got = 0
            while got < s.output_tokens:
                got += await s.queue.get()
            finished.append(s.req_id)

        for s in seqs:
            engine.add(s)
        tasks = [asyncio.ensure_future(consume(s)) for s in seqs]
        while not all(t.done() for t in tasks):
            peak = max(peak, len(engine.running))
            assert len(engine.running) <= 2
            await asyncio.sleep(0.001)
        await engine.stop()
        return finished, peak

    finished, peak = asyncio.run(scenario())
    assert peak == 2
    assert finished[:2] == ["r0", "r1"] and sorted(finished) == [f"r{i}" for i in range(5)]


def test_engine_waits_for_kv_room() -> None:
    target = load_target("gb300-agg", overrides={"sim": {"ttft_s": 0.01, "itl_ms": 1.0},
                                                 "engine": {"speculative": None}})

    async def scenario() -> int:
        engine = Engine(perf=PerfModel(target), metrics=SimMetrics(target, "m", 10), max_num_seqs=8,
                        kv_pool_tokens=100, log=lambda *a: None, stats_interval_s=0)
        engine.start()
        seqs = [Sequence(f"r{i}", prompt_tokens=60, output_tokens=5, max_tokens=5, finish_reason="stop")
                for i in range(3)]
        for s in seqs:
            engine.add(s)
        peak = 0
        while any(s.emitted < s.output_tokens for s in seqs):
            peak = max(peak, len(engine.running))
            await asyncio.sleep(0.001)
        await engine.stop()
        return peak

    # Two 60-token prompts do not fit a 100-token pool together.
    assert asyncio.run(scenario()) == 1


def test_cache_config_info_matches_reference_for_same_config() -> None:
    """Configured like the reference harness (fp8, block 16, util 0.9, 12345 blocks) the series is byte-identical."""

    target = load_target("gb300-agg", overrides={"engine": {
        "max_model_len": 131072, "block_size": 16, "kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.9,
        "kv_offloading_size_gib": None}})
    text = SimMetrics(target, "mistral-large-4", 12345).render().decode()
    ref = data_file("vllm", "metrics-0.33.txt").read_text()

    def info(t: str) -> str:
        return next(line for line in t.splitlines() if line.startswith("vllm:cache_config_info"))

    assert info(text) == info(ref)
    # Token histograms use 1-2-5 buckets up to max_model_len, as in the reference.
    buckets = [line.split('le="')[1].split('"')[0] for line in text.splitlines()
               if line.startswith("vllm:request_prompt_tokens_bucket")]
    assert buckets == [line.split('le="')[1].split('"')[0] for line in ref.splitlines()
                       if line.startswith("vllm:request_prompt_tokens_bucket")]
