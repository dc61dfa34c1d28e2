"""The /metrics scraper on vLLM 0.33's recorded exposition and on histograms written by prometheus_client."""

from __future__ import annotations

from pathlib import Path

import pytest
from ml4_http_stub import Scripted, StubServer
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from pytest_ml4.evidence.metrics import (
    MetricsError,
    diff,
    parse_metrics,
    quantile_from_buckets,
    scrape,
)

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "probe" / "vllm-0.33-metrics.txt"
MODEL = "mistral-large-4"


@pytest.fixture(scope="module")
def recorded():
    return parse_metrics(RECORDED.read_text())


def test_gauges_and_counters_of_the_reference(recorded) -> None:
    assert recorded.value("vllm:num_requests_running", model_name=MODEL, engine="0") == 2.0
    assert recorded.value("vllm:kv_cache_usage_perc") == 0.25
    assert recorded.sum("vllm:prefix_cache_queries_total") == 100.0
    assert recorded.sum("vllm:prefix_cache_hits_total") == 40.0
    assert recorded.sum("vllm:spec_decode_num_draft_tokens_total") == 3.0
    assert recorded.sum("vllm:spec_decode_num_accepted_tokens_total") == 2.0
    per_pos = {s.labels["position"]: s.value for s in recorded.samples("vllm:spec_decode_num_accepted_tokens_per_pos_total")}
    assert per_pos == {"0": 1.0, "1": 1.0, "2": 0.0}
    assert recorded.types["vllm:request_success"] == "counter"
    assert recorded.label_values("vllm:request_success_total", "finished_reason") == {
        "stop", "length", "abort", "error", "repetition"}


def test_cache_config_info_labels(recorded) -> None:
    (info,) = recorded.samples("vllm:cache_config_info")
    assert info.value == 1.0
    assert info.labels["cache_dtype"] == "fp8" and info.labels["block_size"] == "16"
    assert info.labels["num_gpu_blocks"] == "12345"


def test_absent_and_ambiguous_lookups(recorded) -> None:
    assert recorded.value("vllm:no_such_metric") is None and recorded.sum("vllm:no_such_metric_total") == 0.0
    with pytest.raises(MetricsError, match="matches 5 samples"):
        recorded.value("vllm:request_success_total")
    assert recorded.histogram_quantile("vllm:time_to_first_token_seconds", 0.5) is None  # no requests yet


def _histogram_text(observations: list[float], counter: float) -> str:
    reg = CollectorRegistry()
    h = Histogram("vllm:time_to_first_token_seconds", "TTFT", ["model_name", "engine"], registry=reg,
                  buckets=(0.1, 0.25, 0.5, 1.0, 2.5))
    c = Counter("vllm:generation_tokens", "gen", ["model_name", "engine"], registry=reg)
    for v in observations:
        h.labels(MODEL, "0").observe(v)
    c.labels(MODEL, "0").inc(counter)
    return generate_latest(reg).decode()


def test_histogram_quantile_interpolates_like_promql() -> None:
    snap = parse_metrics(_histogram_text([0.05] * 5 + [0.3] * 5, 10))
    # 10 observations: rank 5 for p50 lands at the top of the 0.1 bucket; p90 inside (0.25, 0.5].
    assert snap.histogram_quantile("vllm:time_to_first_token_seconds", 0.5) == pytest.approx(0.1)
    assert snap.histogram_quantile("vllm:time_to_first_token_seconds", 0.9) == pytest.approx(0.25 + 0.25 * 4 / 5)
    assert snap.histogram_mean("vllm:time_to_first_token_seconds") == pytest.approx(0.175)
    assert quantile_from_buckets([(1.0, 0.0), (float("inf"), 4.0)], 0.5) == 1.0


def test_diff_counts_only_what_happened_in_between() -> None:
    before = parse_metrics(_histogram_text([0.05], 100))
    after = parse_metrics(_histogram_text([0.05, 0.3, 0.3], 160))
    d = diff(before, after)
    assert d.sum("vllm:generation_tokens_total") == 60
    assert d.sum("vllm:time_to_first_token_seconds_count") == 2
    assert "vllm:time_to_first_token_seconds_created" not in d  # gauges are not differenced


def test_diff_after_a_reset_takes_the_new_value() -> None:
    d = diff(parse_metrics(_histogram_text([], 500)), parse_metrics(_histogram_text([], 20)))
    assert d.sum("vllm:generation_tokens_total") == 20


def test_scrape_over_http_and_its_errors() -> None:
    with StubServer({"/metrics": Scripted(200, "text/plain; version=0.0.4", [RECORDED.read_bytes()]),
                     "/v1/metrics": Scripted(200, "text/html", [b"<html>login page</html>"])}) as srv:
        snap = scrape(srv.url + "/metrics")
        assert snap.value("vllm:num_requests_waiting") == 1.0
        with pytest.raises(MetricsError, match="login page"):
            scrape(srv.url + "/v1/metrics")
        with pytest.raises(MetricsError, match="HTTP 404"):
            scrape(srv.url + "/nothing")
