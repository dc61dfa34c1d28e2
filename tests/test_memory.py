"""The seed's GPU memory model (pytest_ml4.evidence.memory) against the seed's data points and vLLM's message formats."""

from __future__ import annotations

import pytest

from pytest_ml4.evidence.memory import (
    CALIBRATION_FILE,
    format_gib,
    format_size,
    kv_bytes_per_token,
    load_calibration,
    plan_memory,
)
from pytest_ml4.target.model import Target, load_target

SEED_OOM = ("MemoryError: CUDA out of memory. Tried to allocate 792.00 MiB. GPU 0 has a total capacity of 95.06 GiB "
            "of which 751.25 MiB is free.")
SEED_REFUSAL = ("ValueError: Free memory on device cuda:0 (93.94/95.06 GiB) on startup is less than desired GPU memory "
                "utilization (0.99, 94.11 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
                "processes.")


@pytest.fixture(scope="module")
def rtx() -> Target:
    return load_target("rtxpro6000-tp8")


def plan(t: Target, **engine: object):
    return plan_memory(t.hardware, t.engine.model_copy(update=engine), t.topology.tensor_parallel)


def test_util_099_is_refused_at_startup_with_vllms_message(rtx: Target) -> None:
    p = plan(rtx, gpu_memory_utilization=0.99)
    assert p.outcome == "startup_refused"
    assert p.message == SEED_REFUSAL
    assert not p.boots and p.kv_pool_tokens == 0


@pytest.mark.parametrize("max_model_len, tokens", [(204800, 272_636), (262144, 274_934)])
def test_crashing_config_sizes_the_seeds_pool_then_ooms_with_the_seeds_line(rtx: Target, max_model_len: int,
                                                                            tokens: int) -> None:
    p = plan(rtx, gpu_memory_utilization=0.98, max_num_batched_tokens=8192, max_num_seqs=32,
             max_model_len=max_model_len)
    assert p.kv_pool_tokens == tokens
    assert p.outcome == "oom_first_step" and p.boots
    assert p.message == SEED_OOM
    assert p.first_step_free_mib == pytest.approx(751.25, abs=0.005)
    assert not p.estimate
    # Only a large step kills it: one of at least ~7,900 tokens at 8192 batched tokens.
    assert p.oom_step_tokens is not None and 7_000 < p.oom_step_tokens <= 8192


def test_util_0983_with_8192_tokens_also_crashes(rtx: Target) -> None:
    p = plan(rtx, gpu_memory_utilization=0.983, max_num_batched_tokens=8192, max_num_seqs=32, max_model_len=262144)
    assert p.outcome == "oom_first_step"
    assert p.message.startswith("MemoryError: CUDA out of memory. Tried to allocate 792.00 MiB.")
    assert p.first_step_free_mib < 751.25


def test_stable_unit_boots_with_about_3_gib_headroom(rtx: Target) -> None:
    check = load_calibration().checks["stable_unit"]
    p = plan(rtx, **check.engine)
    assert p.outcome == "ok" and p.message is None
    assert p.headroom_gib == pytest.approx(check.headroom_gib_about, abs=0.2)
    # "about 4x the 792 MiB workspace"
    assert 3.0 <= p.headroom_gib * 1024 / p.workspace_mib <= 4.5
    assert p.first_step_free_mib > p.workspace_mib
    assert p.oom_step_tokens is not None and p.oom_step_tokens > check.engine["max_num_batched_tokens"]
    assert p.kv_pool_tokens >= 256_000 and p.max_concurrency >= 1.0


def test_the_target_file_is_the_stable_unit(rtx: Target) -> None:
    p = plan_memory(rtx.hardware, rtx.engine, rtx.topology.tensor_parallel)
    assert p.outcome == "ok" and p.kv_pool_tokens >= rtx.gates.kv_pool_tokens_min


def test_max_num_seqs_32_costs_kv_but_still_boots(rtx: Target) -> None:
    p16, p32 = plan(rtx), plan(rtx, max_num_seqs=32)
    assert p32.outcome == "ok"
    assert 0 < p32.kv_pool_tokens < p16.kv_pool_tokens


def test_pool_grows_with_utilization_and_shrinks_with_batched_tokens(rtx: Target) -> None:
    assert plan(rtx, gpu_memory_utilization=0.975).kv_pool_tokens > plan(rtx).kv_pool_tokens
    assert plan(rtx, max_num_batched_tokens=2048).kv_pool_tokens > plan(rtx).kv_pool_tokens


def test_raising_max_model_len_frees_no_memory(rtx: Target) -> None:
    # Seed: "Raising --max-model-len does not free memory - the KV pool is sized from whatever memory is left."
    a, b = plan(rtx, max_model_len=131072), plan(rtx, max_model_len=256000)
    assert a.available_kv_gib == b.available_kv_gib
    assert a.max_concurrency > b.max_concurrency


def test_too_little_memory_gives_vllms_no_cache_blocks_error(rtx: Target) -> None:
    p = plan(rtx, gpu_memory_utilization=0.8)
    assert p.outcome == "no_kv_memory"
    assert p.message.startswith("ValueError: No available memory for the cache blocks. Try increasing "
                                "`gpu_memory_utilization`")


def test_pool_shorter_than_max_model_len_is_refused_with_the_estimated_length(rtx: Target) -> None:
    p = plan(rtx, max_model_len=1_048_576)
    assert p.outcome == "no_kv_memory"
    assert "To serve at least one request with the model's max seq len (1048576)" in p.message
    assert f"the estimated maximum model length is {p.num_gpu_blocks * rtx.engine.block_size}." in p.message


@pytest.mark.parametrize("name", ["gb300-agg", "gb300-disagg", "vr200-agg", "vr200-disagg"])
def test_other_hardware_gets_estimates_that_hold_a_1m_context(name: str) -> None:
    t = load_target(name)
    p = plan_memory(t.hardware, t.engine, t.topology.tensor_parallel)
    assert p.estimate is True
    assert p.outcome == "ok"
    assert p.max_concurrency >= 1.0
    assert p.weights_gib < plan(load_target("rtxpro6000-tp8")).weights_gib * 8 / t.topology.tensor_parallel + 0.01


def test_nvfp4_kv_holds_more_tokens_than_fp8_on_the_same_memory() -> None:
    gb, vr = load_target("gb300-agg"), load_target("vr200-agg")
    fp8 = plan_memory(gb.hardware, gb.engine, 4)
    nvfp4 = plan_memory(gb.hardware, gb.engine.model_copy(update={"kv_cache_dtype": "nvfp4_ds_mla"}), 4)
    assert vr.engine.kv_cache_dtype == "nvfp4_ds_mla"
    ratio = kv_bytes_per_token("fp8_ds_mla") / kv_bytes_per_token("nvfp4_ds_mla")
    assert nvfp4.kv_pool_tokens == pytest.approx(fp8.kv_pool_tokens * ratio, rel=0.001)


def test_formats_match_vllm_and_pytorch() -> None:
    assert format_gib(0.99 * 95.06 * (1 << 30)) == "94.11"
    assert format_size(792 * (1 << 20)) == "792.00 MiB"
    assert format_size(95.06 * (1 << 30)) == "95.06 GiB"
    assert format_size(1024) == "1024 bytes" and format_size(2048) == "2.00 KiB"


def test_every_calibration_constant_names_its_source() -> None:
    cal = load_calibration()
    assert CALIBRATION_FILE.is_file()
    for anchor in cal.anchors:
        assert anchor.source.startswith("seed 000")
    for section in (cal.unit, cal.anchor_engine, cal.fused_moe_workspace):
        assert any(k.endswith("source") and "seed 000" in str(v) for k, v in section.model_dump().items()), section
