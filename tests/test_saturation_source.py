"""The saturation gate judges the engine's own running-sequence count, not a load-dependent client figure.

The flake benchmark found ``test_decode_concurrency_saturates_at_max_num_seqs`` failing on a healthy simulator
under load: aiperf's client-side ``effective_decode_concurrency`` at c32 read p50 12.0 (max 22) while the engine,
whose ``max_num_seqs`` the gate is about, ran exactly 16 sequences throughout. The recorded export of that run is
``fixtures/aiperf/saturation_c32_loaded`` (real aiperf 0.13.0 output).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_ml4.perf import gates
from pytest_ml4.perf.export import (
    SERVER_METRICS_JSONL,
    ProfileExport,
    gauge_total,
    server_gauge,
    weighted_quantile,
)
from pytest_ml4.perf.figures import ENGINE_RUNNING_GAUGE, figures_from_export
from pytest_ml4.perf.runner import AiperfSpec, build_argv

AIPERF = Path(__file__).resolve().parent.parent / "fixtures" / "aiperf"
LOADED = AIPERF / "saturation_c32_loaded"


def loaded_point():  # type: ignore[no-untyped-def]
    return figures_from_export(ProfileExport.load(LOADED), 32)


def test_server_gauge_reads_aiperfs_scrape_of_the_engine() -> None:
    [series] = server_gauge(LOADED, ENGINE_RUNNING_GAUGE)
    assert series.endpoint_url.endswith("/metrics")
    assert series.stats["p50"] == 16.0 and series.stats["max"] == 16.0


def test_server_gauge_of_the_reference_mock_has_no_engine_gauge() -> None:
    """The reference run scraped a mock: its gauges read, the engine's is absent (not zero)."""
    run = AIPERF / "basic_c2_reasoning_servermetrics"
    assert server_gauge(run, "mock_inflight")[0].stats["max"] == 2.0
    assert server_gauge(run, ENGINE_RUNNING_GAUGE) == []
    assert figures_from_export(ProfileExport.load(run), 2).engine_running_p50 is None


def test_a_run_without_server_metrics_has_no_engine_figure(tmp_path: Path) -> None:
    (tmp_path / "profile_export_aiperf.json").write_text((LOADED / "profile_export_aiperf.json").read_text())
    assert server_gauge(tmp_path, ENGINE_RUNNING_GAUGE) == []
    assert figures_from_export(ProfileExport.load(tmp_path), 32).engine_running_p50 is None


def test_loaded_healthy_point_passes_on_the_engine_gauge() -> None:
    fig = loaded_point()
    assert fig.decode_conc_p50 == 12.0 and fig.engine_running_p50 == 16.0
    result = gates.saturation_gate(fig, 16)
    assert result.passed, result
    assert "vllm:num_requests_running" in result.detail and "client-side effective_decode_concurrency p50 12" \
        in result.detail


def test_the_same_point_judged_client_side_fails() -> None:
    """Without the engine's gauge the load-dependent client figure is all there is, and it fails: the fallback."""
    fig = replace(loaded_point(), engine_running_p50=None, engine_running_max=None)
    result = gates.saturation_gate(fig, 16)
    assert not result.passed and "from client-side effective_decode_concurrency" in result.detail


def test_engine_gauge_catches_a_lower_cap_and_a_run_above_the_cap() -> None:
    fig = loaded_point()
    lower = gates.saturation_gate(replace(fig, engine_running_p50=4.0, engine_running_max=4.0), 16)
    assert not lower.passed and "past the cap the p50 must be 16" in lower.detail
    above = gates.saturation_gate(replace(fig, engine_running_max=20.0), 16)
    assert not above.passed and "never above it" in above.detail
    below_cap = gates.saturation_gate(replace(fig, concurrency=16, engine_running_p50=4.0), 16)
    assert not below_cap.passed and "below the cap it must lie in 8..16" in below_cap.detail


# ---------------------------------------------------------- several engines (Dynamo workers): gauges summed
def _write_run(tmp: Path, scrapes: list[tuple[float, str, float]], starts: list[float],
               ends: list[float] | None = None) -> Path:
    """A run folder with aiperf's per-scrape jsonl (seconds -> ns) and profiling records starting at ``starts``
    (ending at ``ends`` when given)."""
    ns = 1_000_000_000
    lines = [json.dumps({"endpoint_url": url, "timestamp_ns": int(t * ns), "endpoint_latency_ns": 1,
                         "metrics": {ENGINE_RUNNING_GAUGE: [{"labels": {"engine": "0"}, "value": v}]}})
             for t, url, v in scrapes]
    (tmp / SERVER_METRICS_JSONL).write_text("\n".join(lines) + "\n")
    records = [json.dumps({"metadata": {"benchmark_phase": "profiling", "request_start_ns": int(s * ns),
                                        **({"request_end_ns": int(ends[i] * ns)} if ends else {})},
                           "metrics": {}}) for i, s in enumerate(starts)]
    (tmp / "profile_export.jsonl").write_text("\n".join(records) + "\n")
    return tmp


def test_gauges_of_several_engines_are_summed_at_each_instant(tmp_path: Path) -> None:
    # Engine a runs 16 from t=0; engine b 8 until t=6, then 16 (its unchanged scrapes are not written).
    run = _write_run(tmp_path, [(0, "a", 16), (0, "b", 8), (6, "b", 16), (30, "a", 0)], starts=[2, 10])
    held, engines = gauge_total(run, ENGINE_RUNNING_GAUGE)
    assert engines == 2
    # Issuing window 2..10 s: 24 for 4 s, then 32 for 4 s.
    assert sorted(held) == [(24.0, 4.0), (32.0, 4.0)]
    assert weighted_quantile(held, 0.5) == 24.0 and weighted_quantile([(24.0, 3.0), (32.0, 5.0)], 0.5) == 32.0


def test_a_single_wave_is_judged_until_its_first_request_ends(tmp_path: Path) -> None:
    """A c4 point whose four requests all start at once and outlast the point (slow decode, a short point): the
    issuing window was the 4 ms between their starts, where the engine had not yet admitted them (p50 0 read as a
    cap of 0). It now lasts until the first request ends: 4 running for 4.7 of the 6 s."""
    run = _write_run(tmp_path, [(0, "e", 0), (1.3, "e", 4), (6.4, "e", 3), (7.0, "e", 0)],
                     starts=[0.0, 0.001, 0.002, 0.004], ends=[6.0, 6.3, 6.9, 7.0])
    held, engines = gauge_total(run, ENGINE_RUNNING_GAUGE)
    assert engines == 1 and sorted(held) == [(0.0, 1.3), (4.0, pytest.approx(4.7))]
    assert weighted_quantile(held, 0.5) == 4.0


def test_the_gate_judges_the_summed_engines_against_their_summed_cap() -> None:
    fig = replace(loaded_point(), concurrency=32, engine_running_p50=30.0, engine_running_max=32.0,
                  engine_running_engines=2)
    ok = gates.saturation_gate(fig, 64)
    assert ok.passed and "summed over 2 engines" in ok.detail, ok.detail
    # Two engines capped at 4 each (seq_cap) run 8 of 32: under half the concurrency.
    capped = gates.saturation_gate(replace(fig, engine_running_p50=8.0, engine_running_max=8.0), 64)
    assert not capped.passed and "must lie in 16..32" in capped.detail, capped.detail
    # Past two engines' cap of 16 each: the sum must sit at 32 and never above it.
    past = gates.saturation_gate(replace(fig, concurrency=64, engine_running_p50=32.0, engine_running_max=33.0), 16)
    assert not past.passed and "past the cap the p50 must be 32" in past.detail, past.detail


def test_a_real_two_worker_run_is_judged_on_the_workers_summed_gauge() -> None:
    """Real aiperf output of gb300-agg c32 under --sim (two workers scraped beside the frontend): the figure is the
    workers' sum, 32, where each series alone says 16 and the client-side figure depends on the client's load."""
    fig = figures_from_export(ProfileExport.load(AIPERF / "saturation_c32_two_workers"), 32)
    assert len(server_gauge(AIPERF / "saturation_c32_two_workers", ENGINE_RUNNING_GAUGE)) == 2
    assert (fig.engine_running_p50, fig.engine_running_engines) == (32.0, 2)
    result = gates.saturation_gate(fig, 64)
    assert result.passed and "summed over 2 engines" in result.detail, result.detail


def test_the_workers_are_scraped_beside_the_frontend_with_the_per_scrape_export(tmp_path: Path) -> None:
    spec = AiperfSpec(model="m", url="http://f/v1", concurrency=32, server_metrics_url="http://f/metrics",
                      engine_metrics_urls=("http://w1/metrics", "http://w2/metrics"))
    argv = " ".join(build_argv(spec, tmp_path, executable=Path("aiperf")))
    assert ("--server-metrics http://f/metrics http://w1/metrics http://w2/metrics "
            "--server-metrics-formats json csv jsonl") in argv
    alone = " ".join(build_argv(replace(spec, engine_metrics_urls=()), tmp_path, executable=Path("aiperf")))
    # One engine too: its figure is read over the profiling phase from the per-scrape export.
    assert "--server-metrics http://f/metrics --server-metrics-formats json csv jsonl" in alone
