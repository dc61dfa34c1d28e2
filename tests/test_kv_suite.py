"""The KV checks (pytest_ml4.checks.kv) on recorded logs, and the KV suite end to end against the simulator.

End to end: the stable RTX PRO unit passes; seed 000's crashing flags fail with the seed's OOM line quoted; the
open-item-1 variant (max_num_seqs 32) reports its pool and the >= 256,000 verdict.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from checkout import FIXTURES_DIR, REPO_ROOT

from pytest_ml4.checks.kv import (
    cache_info_problems,
    kv_pool_verdict,
    max_concurrency_verdict,
    no_failures_verdict,
    peak_usage_verdict,
    required_pool,
    spec_decode_verdict,
)
from pytest_ml4.evidence.kv_load import SpecCounts
from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.logs import FileLogReader, KvCacheSize, LogView, records_from_text
from pytest_ml4.target.model import Target, load_target

LOGS = FIXTURES_DIR / "logs"
SUITE = REPO_ROOT / "suites" / "test_kv_cache.py"
VARIANTS = BUNDLED_TARGETS_DIR / "variants"
SEED_OOM = ("MemoryError: CUDA out of memory. Tried to allocate 792.00 MiB. GPU 0 has a total capacity of 95.06 GiB "
            "of which 751.25 MiB is free.")


@pytest.fixture(scope="module")
def rtx() -> Target:
    return load_target("rtxpro6000-tp8")


def boot_view(name: str) -> LogView:
    reader = FileLogReader(LOGS / name)
    return LogView(reader.since_last_boot(), name)


# ------------------------------------------------------------------------------------------ checks on recorded logs
def test_pool_of_the_crashing_boot_passes_the_size_gate_but_not_the_failure_check(rtx: Target) -> None:
    view = boot_view("rtxpro-oom-crashloop.log")
    pool = kv_pool_verdict(view, rtx)
    assert pool.ok and pool.figures["kv_pool_tokens"] == 274_934
    assert "GPU KV cache size: 274,934 tokens" in pool.message
    failures = no_failures_verdict(view)
    assert not failures.ok
    assert SEED_OOM in failures.message and "fused_moe_workspace_oom" in failures.message
    # The cause leads, before the engine-death lines it caused.
    assert failures.message.splitlines()[0] == SEED_OOM
    assert failures.judged[0].signature == "fused_moe_workspace_oom"


def test_concurrency_check_names_a_max_model_len_mismatch(rtx: Target) -> None:
    verdict = max_concurrency_verdict(boot_view("rtxpro-oom-crashloop.log"), rtx)
    assert not verdict.ok
    assert "the engine runs max_model_len 262,144, the target says 256,000" in verdict.message
    assert verdict.judged[0].max_concurrency == 1.05


def test_refused_boot_quotes_the_refusal(rtx: Target) -> None:
    verdict = kv_pool_verdict(boot_view("rtxpro-startup-refused.log"), rtx)
    assert not verdict.ok
    assert "no 'GPU KV cache size' line" in verdict.message
    assert "[startup_refused] ValueError: Free memory on device cuda:0 (93.94/95.06 GiB)" in verdict.message


def test_pool_below_requirement_fails_with_the_line(rtx: Target) -> None:
    small = rtx.model_copy(update={"gates": rtx.gates.model_copy(update={"kv_pool_tokens_min": 300_000})})
    verdict = kv_pool_verdict(boot_view("rtxpro-stable.log"), small)
    assert not verdict.ok
    assert verdict.message.startswith("KV pool 263,923 tokens < required 300,000 (gates.kv_pool_tokens_min)")
    assert "judged: [kv_cache_size]" in verdict.message


def test_requirement_without_a_pool_gate_comes_from_max_model_len() -> None:
    t = load_target("gb300-agg")
    assert t.gates.kv_pool_tokens_min is None
    assert required_pool(t) == (1_048_576, "engine.max_model_len x gates.kv_max_concurrency_min")


def test_cache_config_info_cross_check(rtx: Target) -> None:
    view = boot_view("rtxpro-stable.log")
    kv = view.first(KvCacheSize)
    assert kv is not None
    good = {"num_gpu_blocks": str(263_923 // 64), "block_size": "64", "gpu_memory_utilization": "0.97",
            "cache_dtype": "fp8_ds_mla", "kv_cache_size_tokens": "None"}
    assert cache_info_problems(kv, rtx, good) == []
    bad = dict(good, gpu_memory_utilization="0.98", num_gpu_blocks="100", kv_cache_size_tokens="5")
    problems = cache_info_problems(kv, rtx, bad)
    assert len(problems) == 3 and any("gpu_memory_utilization=0.98" in p for p in problems)
    verdict = kv_pool_verdict(view, rtx, bad)
    assert not verdict.ok and "cross-check with vllm:cache_config_info" in verdict.message


def test_peak_usage_from_stats_lines_and_metrics(rtx: Target) -> None:
    view = boot_view("rtxpro-stable.log")
    ok = peak_usage_verdict(view, rtx, metric_peak_pct=None)
    assert ok.ok and ok.figures["peak_pct"] == 15.1  # seed 000: "KV usage never exceeded 15.1%"
    over = peak_usage_verdict(view, rtx, metric_peak_pct=93.0)
    assert not over.ok and "peak KV usage 93.0% >= 90.0%" in over.message
    empty = peak_usage_verdict(LogView(records_from_text("nothing here")), rtx, None)
    assert not empty.ok and "no KV usage to judge" in empty.message


def test_spec_decode_within_the_seed_ranges(rtx: Target) -> None:
    view = boot_view("rtxpro-stable.log")
    good = SpecCounts(drafts=1000, accepted=2280, accepted_per_pos=(900, 760, 620))
    assert spec_decode_verdict(view, rtx, good).figures["spec_decode counters"]["mean_acceptance_length"] == 3.28
    verdict = spec_decode_verdict(view, rtx, good)
    assert verdict.ok, verdict.message
    lines = verdict.figures["SpecDecoding lines"]
    # Five windows of 100 drafts each, aggregated per position (0.568 over 500 drafts: the 99 % one-sided Wilson
    # bound, 0.62, reaches the 0.61 floor; the seed's own stable log must pass).
    assert lines == {"drafts": 500, "mean_acceptance_length": 3.138, "per_position": [0.86, 0.71, 0.568]}
    low = records_from_text(
        "(APIServer pid=1) INFO 11-01 20:06:00 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 1.90, "
        "Accepted throughput: 90.00 tokens/s, Drafted throughput: 300.00 tokens/s, Accepted: 900 tokens, Drafted: "
        "3000 tokens, Per-position acceptance rate: 0.500, 0.300, 0.100, Avg Draft acceptance rate: 30.0%")
    verdict = spec_decode_verdict(LogView(low), rtx, None)
    assert not verdict.ok
    assert "SpecDecoding lines: position 0 acceptance 0.500 outside [0.61, 1.0] over 1000 drafts" in verdict.message
    assert "window mean acceptance length 1.90 outside [2.24, 4.0]" in verdict.message
    lines_only = LogView([r for r in view.records if "SpecDecoding" not in r.text])
    assert spec_decode_verdict(lines_only, rtx, good).ok
    bad = SpecCounts(drafts=5000, accepted=3000, accepted_per_pos=(1500, 1000, 500))
    verdict = spec_decode_verdict(lines_only, rtx, bad)
    assert not verdict.ok and "mean acceptance length 1.60 outside [2.24, 4.0]" in verdict.message


def test_spec_decode_floor_is_a_one_sided_wilson_bound(rtx: Target) -> None:
    """Caught: z = 3 on a normal stderr passed position-0 acceptance 0.42 over 60 drafts (floor 0.61)."""
    view = LogView(records_from_text("x"))
    low = spec_decode_verdict(view, rtx, SpecCounts(drafts=60, accepted=60, accepted_per_pos=(25.2, 21, 13.8)))
    assert not low.ok and "too few drafts to judge per-position acceptance" in low.message
    # The same rate over the minimum number of drafts fails by the bound.
    many = spec_decode_verdict(view, rtx, SpecCounts(drafts=150, accepted=150, accepted_per_pos=(63, 52.5, 34.5)))
    assert not many.ok and "position 0 acceptance 0.420 outside [0.61, 1.0] over 150 drafts" in many.message
    assert "too few" not in many.message
    # Healthy (the simulator's 0.93/0.81/0.69 profile) over the minimum number of drafts passes.
    healthy = spec_decode_verdict(view, rtx, SpecCounts(drafts=150, accepted=364.5, accepted_per_pos=(139.5, 121.5,
                                                                                                     103.5)))
    assert healthy.ok, healthy.message
    # Healthy rates over too few drafts: per-position acceptance is not judged (never passed).
    few = spec_decode_verdict(view, rtx, SpecCounts(drafts=40, accepted=97.2, accepted_per_pos=(37.2, 32.4, 27.6)))
    assert few.ok and "spec_decode counters 40 (at least 150 in one source)" in few.undecided


def test_spec_decode_without_any_data_fails(rtx: Target) -> None:
    verdict = spec_decode_verdict(LogView(records_from_text("x")), rtx, None)
    assert not verdict.ok and "no SpecDecoding metrics line" in verdict.message


# ------------------------------------------------------------------------------------------ the suite, end to end
def run_suite(pytester: pytest.Pytester, tmp_path: Path, target: str) -> pytest.RunResult:
    # Stats every second instead of ten keeps the run short; the suite waits for the line covering its load.
    return pytester.runpytest_subprocess(
        str(SUITE), "--target", target, "--sim", "-m", "kv", "--ml4-reports", str(tmp_path / "reports"),
        "--ml4-set", "sim.extra.stats_interval_s=1", "-p", "no:randomly", timeout=240)


def test_stable_unit_passes_and_reports_its_pool(pytester: pytest.Pytester, tmp_path: Path, rtx: Target) -> None:
    """The stable unit passes: seed 000 ran it "0 errors" with the pool above open item 1's 256,000 (the
    expected figure used to come from the same memory model that wrote the simulator's boot log)."""
    result = run_suite(pytester, tmp_path, "rtxpro6000-tp8")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["kv_pool: PASS - KV pool * tokens >= required 256,000*"])


def test_crashing_variant_fails_with_the_seeds_oom_line(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result = run_suite(pytester, tmp_path, str(VARIANTS / "rtxpro6000-tp8-crashing.yaml"))
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 2, result.stdout.str()[-3000:]
    out = result.stdout.str()
    assert SEED_OOM in out
    assert "FAILED" in out and "test_no_oom_or_engine_death_since_boot" in out
    # The pool itself was big enough: the seed's "KV cache was never the constraint".
    assert re.search(r"kv_pool: PASS - KV pool 272,636 tokens >= required 256,000", out)


def test_seqs32_variant_reports_pool_and_verdict(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The verdict follows seed 000's rule (>= 256,000 tokens) applied to the pool the suite reports from the
    engine's boot line, not a figure the test derives from the memory model that wrote that line (which
    would agree with itself)."""
    result = run_suite(pytester, tmp_path, str(VARIANTS / "rtxpro6000-tp8-seqs32.yaml"))
    found = re.search(r"kv_pool: (PASS|FAIL) - KV pool ([\d,]+) tokens (>=|<) required 256,000", result.stdout.str())
    assert found, result.stdout.str()[-3000:]
    verdict, pool, sign = found.group(1), int(found.group(2).replace(",", "")), found.group(3)
    assert (verdict, sign) == (("PASS", ">=") if pool >= 256_000 else ("FAIL", "<"))


def test_with_several_engines_the_weakest_pool_is_judged(rtx: Target) -> None:
    def line(pid: int, tokens: int, conc: float) -> str:
        return (f"(EngineCore_DP0 pid={pid}) INFO 11-30 07:00:00 [kv_cache_utils.py:1310] GPU KV cache size: "
                f"{tokens:,} tokens, Maximum concurrency for 256,000 tokens per request: {conc:.2f}x")

    view = LogView(records_from_text("\n".join([line(1, 300_000, 1.17), line(2, 250_000, 0.98)])))
    pool = kv_pool_verdict(view, rtx)
    assert not pool.ok and "KV pool 250,000 tokens < required 256,000" in pool.message
    conc = max_concurrency_verdict(view, rtx)
    assert not conc.ok and "0.98x < 1.00x" in conc.message


def test_refused_start_reports_vllms_refusal(pytester: pytest.Pytester, tmp_path: Path) -> None:
    # Seed 000: util 0.99 was refused at start-up; the session stops and quotes vLLM's message from the log.
    result = pytester.runpytest_subprocess(
        str(SUITE), "--target", "rtxpro6000-tp8", "--sim", "-m", "kv", "--ml4-reports", str(tmp_path / "reports"),
        "--ml4-set", "engine.gpu_memory_utilization=0.99", "-p", "no:randomly", timeout=120)
    assert result.ret != 0
    assert ("ValueError: Free memory on device cuda:0 (93.94/95.06 GiB) on startup is less than desired GPU memory "
            "utilization (0.99, 94.11 GiB).") in result.stderr.str() + result.stdout.str()


def test_spec_decode_without_lines_or_readable_counters_is_not_judged(rtx: Target) -> None:
    """No SpecDecoding line and the engine's /metrics unreadable during the load: nothing was measured, so the
    check is not judged and says why; with the counters readable (they never moved) it still fails."""
    from pytest_ml4.checks.kv import assert_spec_decode_acceptance_within_range
    from pytest_ml4.checks.verdict import NotJudged
    from pytest_ml4.evidence.kv_load import LoadResult

    class Report:
        def attach(self, *args: object) -> None: ...
        def record(self, *args: object) -> None: ...

    view = LogView(records_from_text("x"), "file engine.log")
    unread = LoadResult(started=0.0, metrics_error="scraping http://e/metrics gave HTTP 500")
    with pytest.raises(NotJudged, match="counters were not read: scraping http://e/metrics gave HTTP 500"):
        assert_spec_decode_acceptance_within_range(view, rtx, unread, Report())  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="no SpecDecoding metrics line"):
        assert_spec_decode_acceptance_within_range(view, rtx, LoadResult(started=0.0), Report())  # type: ignore[arg-type]
