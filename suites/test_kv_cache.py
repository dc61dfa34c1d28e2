"""KV cache sizing and memory health after boot (seed 000: the OOM root cause and open item 1).

After the engine booted: its KV pool (log line, cross-checked with ``vllm:cache_config_info`` where /metrics is
exposed) holds the target's requirement and at least ``kv_max_concurrency_min`` requests of ``max_model_len``;
a short load makes the engine take one full ``max_num_batched_tokens`` step (where seed 000's crashing config
died); afterwards no OOM or engine-death line is in the log since boot, and during the session peak KV usage
stayed under the target's limit and speculative decoding accepted drafts within the target's range. Every failure
quotes the judged log lines, which are also attached to the report. The ``vllm:*`` cross-checks read the engine's
/metrics; on Dynamo that is every worker's own /metrics (``Endpoint.worker_metrics_urls``), and where none is known
a passing log verdict is skipped naming the target field to set, never passed without its cross-check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_ml4.checks.kv import (
    VerdictReport,
    assert_kv_pool_holds_requirement,
    assert_max_concurrency_at_max_model_len,
    assert_no_oom_or_engine_death,
    assert_peak_kv_usage_under_limit,
    assert_spec_decode_acceptance_within_range,
)
from pytest_ml4.client.deployment import Deployment
from pytest_ml4.evidence.kv_load import (
    EngineMetrics,
    LoadResult,
    MetricsRead,
    run_load,
    wait_for_stats_line,
)
from pytest_ml4.logs import LogReader, LogView
from pytest_ml4.target.model import Target

pytestmark = pytest.mark.kv


@pytest.fixture(scope="module")
def engine_metrics(ml4: Deployment) -> EngineMetrics:
    return EngineMetrics.of(ml4.endpoint, ml4.target)


@pytest.fixture(scope="module")
def kv_metrics(engine_metrics: EngineMetrics) -> MetricsRead:
    """One scrape of each engine's /metrics after boot, with the errors of those that could not be read (never
    swallowed: a cross-check that silently drops out is a check that passes for the wrong reason
    in silence)."""
    return MetricsRead.of(engine_metrics.engine_urls)


@pytest.fixture(scope="module")
def kv_load(ml4: Deployment, ml4_logs: LogReader) -> Iterator[LoadResult]:
    result = run_load(ml4.http, ml4.endpoint, ml4.target)
    wait_for_stats_line(ml4_logs, result.started)
    yield result


@pytest.fixture
def kv_report(ml4_attach_log: Callable[..., str], record_property: Callable[[str, Any], None]) -> VerdictReport:
    return VerdictReport(ml4_attach_log, record_property)


@pytest.fixture
def session_view(ml4_logs: LogReader, ml4_session_start: float) -> LogView:
    # "During the session": a long-running engine's stats from last week's traffic are not this session's peak.
    return LogView(ml4_logs.since_last_boot(since=ml4_session_start - 1), ml4_logs.describe())


def test_kv_pool_holds_the_target_requirement(ml4_boot_log: LogView, ml4: Deployment, kv_metrics: MetricsRead,
                                              engine_metrics: EngineMetrics, kv_report: VerdictReport) -> None:
    assert_kv_pool_holds_requirement(ml4_boot_log, ml4.target, kv_metrics, kv_report, unchecked=engine_metrics.missing)


def test_max_concurrency_at_max_model_len(ml4_boot_log: LogView, ml4_target: Target, kv_report: VerdictReport) -> None:
    # From the boot log alone: no endpoint needed (the bundle would open the session's clients).
    assert_max_concurrency_at_max_model_len(ml4_boot_log, ml4_target, kv_report)


def test_no_oom_or_engine_death_since_boot(kv_load: LoadResult, ml4_logs: LogReader, kv_report: VerdictReport) -> None:
    assert_no_oom_or_engine_death(LogView(ml4_logs.since_last_boot(), ml4_logs.describe()), kv_load, kv_report)


def test_peak_kv_usage_under_limit(kv_load: LoadResult, session_view: LogView, ml4: Deployment,
                                   engine_metrics: EngineMetrics, kv_report: VerdictReport) -> None:
    assert_peak_kv_usage_under_limit(session_view, ml4.target, kv_load, kv_report, unchecked=engine_metrics.missing)


@pytest.mark.applies_if("engine.speculative", why="it runs no speculative decoding")
@pytest.mark.applies_if("gates.spec_acceptance_length", "gates.spec_position_rate",
                        why="no spec-decode acceptance range in its gates")
def test_spec_decode_acceptance_within_range(kv_load: LoadResult, session_view: LogView, ml4: Deployment,
                                             engine_metrics: EngineMetrics, kv_report: VerdictReport) -> None:
    assert_spec_decode_acceptance_within_range(session_view, ml4.target, kv_load, kv_report,
                                               unchecked=engine_metrics.missing)
