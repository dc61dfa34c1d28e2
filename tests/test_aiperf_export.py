"""The aiperf export readers on real aiperf 0.13.0 exports (fixtures/aiperf/, copied from the reference folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ml4.perf.export import ExportError, ProfileExport, read_records
from pytest_ml4.perf.runner import judge

AIPERF = Path(__file__).resolve().parent.parent / "fixtures" / "aiperf"


def load(sample: str) -> ProfileExport:
    return ProfileExport.load(AIPERF / sample)


def test_clean_run_reads_status_and_metrics() -> None:
    ex = load("basic_c2_reasoning_servermetrics")
    assert (ex.schema_version, ex.aiperf_version) == ("1.4", "0.13.0")
    assert ex.is_complete is True and ex.was_cancelled is False
    assert ex.request_error_rate_pct == 0.0
    assert ex.error_request_count == 0  # omitted on clean runs, which means zero
    osl = ex.metric("output_sequence_length")
    assert osl is not None and osl.unit == "tokens"
    assert (osl.min, osl.max, osl.std) == (256.0, 256.0, 0.0)
    # OSL 256 = 192 output + 64 reasoning (aiperf.md §6.2)
    assert ex.stat("reasoning_token_count", "avg") == 64.0
    assert ex.stat("output_token_count", "avg") == 192.0
    assert ex.extra_inputs == {"min_tokens": 256}
    assert ex.metric("time_to_first_token").unit == "ms"
    # sweep-line metrics have no p1/p25/count
    edc = ex.metric("effective_decode_concurrency")
    assert edc.p50 is not None and edc.get("p25") is None and edc.count is None
    assert judge(ex, 0) == []


def test_absent_keys_stay_absent_not_zero() -> None:
    ex = load("server_omits_reasoning_usage")
    for key in ("reasoning_token_count", "usage_reasoning_tokens", "total_reasoning_tokens"):
        assert key not in ex
        assert ex.metric(key) is None
        assert ex.stat(key, "avg") is None
        assert ex.scalar(key) is None
    assert ex.stat("output_token_count", "avg") == ex.stat("output_sequence_length", "avg") == 256.0
    assert ex.missing(["reasoning_token_count", "request_count"]) == ["reasoning_token_count"]


def test_error_run_exits_clean_but_reports_percent() -> None:
    ex = load("errors_20pct")
    assert ex.is_complete is True
    assert ex.request_error_rate_pct == pytest.approx(21.2766, abs=1e-3)  # percent, not a fraction
    assert ex.request_count == 111 and ex.error_request_count == 30
    assert ex.scalar("completed_request_count") == 141
    [entry] = ex.error_summary
    assert entry.code == 500 and entry.count == 30 and "injected failure" in entry.message
    assert "adj_time_to_first_token" in ex
    assert ex.warmup_metrics["output_sequence_length"].max == 32.0
    # Usable (errors are the gates' business), and the run itself is complete.
    assert judge(ex, 0) == []


@pytest.mark.parametrize("sample", ["cancelled_failed_threshold", "sigint_partial"])
def test_cancelled_runs_are_rejected_despite_exit_code_zero(sample: str) -> None:
    ex = load(sample)
    assert ex.was_cancelled is True and ex.is_complete is False
    assert ex.incomplete_reason == "Run cancelled before all records were processed."
    problems = judge(ex, 0)
    assert any("cancelled" in p for p in problems)
    assert any("not complete" in p for p in problems)


def test_missing_summary_and_missing_keys_are_problems(tmp_path: Path) -> None:
    assert "no profile_export_aiperf.json" in judge(None, 1)[0]
    ex = load("basic_c2_reasoning_servermetrics")
    raw = dict(ex.raw)
    del raw["inter_token_latency"]
    problems = judge(ProfileExport.from_dict(raw), 0)
    assert problems and "inter_token_latency" in problems[0]
    with pytest.raises(ExportError):
        ProfileExport.load(tmp_path)


def test_trace_replay_keys() -> None:
    ex = load("mooncake_trace_replay")
    assert ex.scalar("replay_sched_lag_p99") is not None
    assert ex.scalar("replay_sched_degraded") is not None


def test_jsonl_profiling_phase_only() -> None:
    folder = AIPERF / "warmup_goodput_multiturn_timeslices"
    everything = read_records(folder, phase=None)
    profiling = read_records(folder)
    warmup = read_records(folder, phase="warmup")
    assert (len(everything), len(profiling), len(warmup)) == (32, 24, 8)
    assert all(r.phase == "profiling" for r in profiling)
    assert {r.metadata["turn_index"] for r in profiling} == {0, 1}
    rec = profiling[0]
    assert isinstance(rec.value("inter_chunk_latency"), list)
    assert rec.value("no_such_metric") is None
    assert rec.duration_s is not None and rec.duration_s > 0


def test_jsonl_usage_counts_per_request() -> None:
    recs = read_records(AIPERF / "basic_c2_reasoning_servermetrics")
    assert recs and all(r.ok for r in recs)
    assert {r.value("output_sequence_length") for r in recs} == {256}
    assert {r.value("usage_completion_tokens") for r in recs} == {256}


def test_jsonl_head_is_warmup_only() -> None:
    path = AIPERF / "errors_20pct" / "profile_export.head3.jsonl"
    assert read_records(path) == []
    assert len(read_records(path, phase=None)) == 3
