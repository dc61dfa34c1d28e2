"""The saturation gate judges the engine's own running-sequence count, not a load-dependent client figure (issue 15).

The flake benchmark found ``test_decode_concurrency_saturates_at_max_num_seqs`` failing on a healthy simulator
under load: aiperf's client-side ``effective_decode_concurrency`` at c32 read p50 12.0 (max 22) while the engine,
whose ``max_num_seqs`` the gate is about, ran exactly 16 sequences throughout. The recorded export of that run is
``fixtures/aiperf/saturation_c32_loaded`` (real aiperf 0.13.0 output).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pytest_ml4.perf import gates
from pytest_ml4.perf.export import ProfileExport, server_gauge
from pytest_ml4.perf.figures import ENGINE_RUNNING_GAUGE, figures_from_export

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
