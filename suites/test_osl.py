"""Fixed output length: with ``min_tokens = max_tokens = N`` every request returns exactly N completion tokens.

Seed 000: "fixed-OSL benchmarks must use --extra-inputs 'min_tokens:4096', not ignore_eos: true ... output sequence
length was exactly 4096.0 at every concurrency (min = max = 4096, std 0)". Checked three ways: the final usage of
each streamed request, the tokens counted while streaming (``continuous_usage_stats``), and aiperf's own export
(min = max = N, std 0, per request in the jsonl). A request killed by the reasoning grammar (``ParserTooComplex``,
``grammar rejected`` in the engine log) fails the suite.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pytest_ml4.checks.codes import fails_with, require
from pytest_ml4.checks.osl import (
    Streamed,
    assert_aiperf_export_exactly_n,
    assert_no_grammar_kill,
    assert_no_ignore_eos,
    assert_streamed_count_exactly_n,
    assert_usage_exactly_n,
    fixed_length_aiperf_spec,
    stream_fixed_length,
)
from pytest_ml4.client.deployment import Deployment
from pytest_ml4.logs import LogReader, LogView
from pytest_ml4.logs.reader import LogMark
from pytest_ml4.perf.runner import RunResult, failure_log, run_aiperf
from pytest_ml4.perf.sweep import Client
from pytest_ml4.report.attach import attach_text
from pytest_ml4.target.model import Target

pytestmark = [pytest.mark.osl, pytest.mark.exclusive]   # the engine counter must see only these requests

#: Small enough for CI on the simulator (~3 s per request), large enough to outlast any natural answer.
N = 192
PROMPTS = ("Say hello.", "What is 2 + 2? Answer with the number only.", "Name one colour.",
           "Reply with the word 'ok'.")


@pytest.fixture(scope="module")
def osl_window_start(ml4: Deployment) -> LogMark:
    """Where the grammar-kill check's log window starts (a run without a log reader still runs the other checks)."""
    reader = ml4.logs
    return reader.mark() if reader is not None else LogMark(time.time() - 1.0)


@pytest.fixture(scope="module")
def streamed(ml4: Deployment, osl_window_start: LogMark) -> Streamed:
    # After osl_window_start: the grammar-kill check reads the log from there.
    return stream_fixed_length(ml4.http, ml4.endpoint, ml4.target, PROMPTS, N)


def test_usage_reports_exactly_n_completion_tokens(streamed: Streamed) -> None:
    assert_usage_exactly_n(streamed.results, N)


def test_streamed_token_count_is_exactly_n(streamed: Streamed, record_property: Any) -> None:
    """Counted while streaming: the per-chunk usage (continuous_usage_stats) where the path keeps it; a proxy
    (LiteLLM) strips it, so the engine's own generated-token counter over exactly these requests is used too."""
    record_property("osl_engine_tokens", "unread" if streamed.engine_tokens is None else int(streamed.engine_tokens))
    assert_streamed_count_exactly_n(streamed, N)


@pytest.fixture(scope="module")
@fails_with("osl.spec_uses_ignore_eos", "the suite's own aiperf spec holds ignore_eos")
def aiperf_osl(ml4_perf_client: Client, ml4_run_dir: Path, osl_window_start: LogMark) -> RunResult:
    spec = fixed_length_aiperf_spec(ml4_perf_client, N)
    require(not spec.uses_ignore_eos, "osl.spec_uses_ignore_eos", "the suite's own aiperf spec holds ignore_eos")
    out = ml4_run_dir / "osl" / f"aiperf-{int(time.time() * 1000)}"
    return run_aiperf(spec, out, api_key=ml4_perf_client.api_key)


def test_aiperf_export_min_equals_max_equals_n(aiperf_osl: RunResult, ml4_perf_client: Client) -> None:
    if not aiperf_osl.ok:
        attach_text(failure_log(aiperf_osl, [ml4_perf_client.api_key]), "aiperf.log")
    assert_aiperf_export_exactly_n(aiperf_osl, N)


def test_no_request_killed_by_the_grammar(streamed: Streamed, aiperf_osl: RunResult, ml4_logs: LogReader,
                                          osl_window_start: LogMark, ml4_attach_log: Any) -> None:
    """Seed 000's grammar-kill signature (``grammar rejected`` / ``ParserTooComplex``) must not appear while the
    fixed-OSL requests ran.

    An empty window is a failure, not a pass: the requests above were served, so the engine log must show lines
    for them (access lines, stats); nothing there means the log cannot be read and a kill would go unseen."""
    view = LogView(ml4_logs.read_from(osl_window_start), ml4_logs.describe())
    assert_no_grammar_kill(view, ml4_attach_log)


def test_perf_configs_never_use_ignore_eos(ml4_target: Target, ml4_perf_extra_inputs: dict[str, Any]) -> None:
    """The target's manifests and the user's ``--perf-extra-input`` never hold the length with ignore_eos.

    (The suite's own aiperf spec is checked where it is built, ``tests/test_perf_core.py``: a spec this test
    built itself says nothing about the deployment.)"""
    assert_no_ignore_eos([ml4_target.resolve(m) for m in ml4_target.manifests], ml4_perf_extra_inputs)
