"""Fixed output length: with ``min_tokens = max_tokens = N`` every request returns exactly N completion tokens.

Seed 000: "fixed-OSL benchmarks must use --extra-inputs 'min_tokens:4096', not ignore_eos: true ... output sequence
length was exactly 4096.0 at every concurrency (min = max = 4096, std 0)". Checked three ways: the final usage of
each streamed request, the tokens counted while streaming (``continuous_usage_stats``), and aiperf's own export
(min = max = N, std 0, per request in the jsonl). A request killed by the reasoning grammar (``ParserTooComplex``,
``grammar rejected`` in the engine log) fails the suite.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_ml4.targets import Target
from pytest_ml4.client import Endpoint
from pytest_ml4.urls import display_url
from pytest_ml4.metrics import STACK_TOKEN_COUNTER, generated_tokens
from pytest_ml4.perf.export import read_records
from pytest_ml4.perf.methodology import (
    WHY_NOT_IGNORE_EOS,
    explain,
    extra_inputs_ask_ignore_eos,
    ignore_eos_in_files,
)
from pytest_ml4.perf.runner import AiperfSpec, failure_log, run_aiperf
from pytest_ml4.probe import probe_chat_stream

pytestmark = [pytest.mark.osl, pytest.mark.exclusive]   # the engine counter must see only these requests

#: Small enough for CI on the simulator (~3 s per request), large enough to outlast any natural answer.
N = 192
PROMPTS = ("Say hello.", "What is 2 + 2? Answer with the number only.", "Name one colour.",
           "Reply with the word 'ok'.")


def _body(model: str, prompt: str, n: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": n, "min_tokens": n,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@pytest.fixture(scope="module")
def osl_window_start() -> float:
    # Log lines carry whole seconds; start a second early so nothing of this module is missed.
    return time.time() - 1.0


@dataclass
class Streamed:
    results: list[Any]
    engine_tokens: float | None      # generated while these requests ran (engine counter difference)
    counter: str = ""                # which counter, at which URL


@pytest.fixture(scope="module")
def streamed(http_client: Any, ml4_endpoint: Endpoint, ml4_target: Target, osl_window_start: float) -> Streamed:
    # The effective metrics URL (not only a --sim one): live runs read the engine's, or the Dynamo frontend's,
    # counter too; each stack's URL carries its own counter (STACK_TOKEN_COUNTER).
    url, counter = ml4_endpoint.effective_metrics_url, STACK_TOKEN_COUNTER[ml4_target.serving.stack]
    before = generated_tokens(url, counter=counter)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: probe_chat_stream(http_client, _body(ml4_endpoint.model, p, N)), PROMPTS))
    after = generated_tokens(url, counter=counter)
    return Streamed(results, None if before is None or after is None else after - before,
                    f"{counter} at {display_url(url)}")


def test_usage_reports_exactly_n_completion_tokens(streamed: Streamed) -> None:
    for r in streamed.results:
        # Stream-grammar details (e.g. a proxy's usage chunk shape) are the smoke suite's business; here the
        # request must have streamed to the end without errors.
        assert r.status_code == 200 and r.transport_error is None and not r.error_events, r.describe()
        assert r.usage is not None, f"no usage although include_usage was requested:\n{r.describe()}"
        assert r.usage.get("completion_tokens") == N, (
            f"min_tokens = max_tokens = {N} but usage.completion_tokens = {r.usage.get('completion_tokens')}")
        assert r.finish_reason == "length", f"finish_reason {r.finish_reason!r}: an EOS ended the request early"


def test_streamed_token_count_is_exactly_n(streamed: Streamed, record_property: Any) -> None:
    """Counted while streaming: the per-chunk usage (continuous_usage_stats) where the path keeps it; a proxy
    (LiteLLM) strips it, so the engine's own generated-token counter over exactly these requests is used too."""
    record_property("osl_engine_tokens", "unread" if streamed.engine_tokens is None else int(streamed.engine_tokens))
    per_chunk = [r for r in streamed.results if r.tokens_per_chunk]
    for r in per_chunk:
        assert sum(r.tokens_per_chunk) == N, (
            f"tokens counted while streaming: {sum(r.tokens_per_chunk)} over {len(r.tokens_per_chunk)} chunks, "
            f"expected {N}")
        assert all(n >= 1 for n in r.tokens_per_chunk), "a content chunk carried no new token"
    if streamed.engine_tokens is not None:
        print(f"engine token counter: {streamed.engine_tokens:.0f} tokens generated ({streamed.counter})")
        assert streamed.engine_tokens == N * len(streamed.results), (
            f"the engine generated {streamed.engine_tokens:.0f} tokens ({streamed.counter}) for "
            f"{len(streamed.results)} requests of exactly {N} (no other traffic may hit the endpoint while this "
            f"module runs)")
    else:
        print(f"engine token counter not readable ({streamed.counter}): judged on the per-chunk usage only")
    assert per_chunk or streamed.engine_tokens is not None, (
        f"no streamed count: the stream carried no per-chunk usage and {streamed.counter} was not readable")


@pytest.fixture(scope="module")
def aiperf_osl(ml4_perf_client: Any, ml4_run_dir: Path, osl_window_start: float) -> Any:
    spec = AiperfSpec(model=ml4_perf_client.model, url=ml4_perf_client.base_url, concurrency=4, isl=256, osl=N,
                      duration_s=None, request_count=8, min_tokens=N,
                      server_metrics_url=ml4_perf_client.metrics_url)
    assert not spec.uses_ignore_eos
    out = ml4_run_dir / "osl" / f"aiperf-{int(time.time() * 1000)}"
    return run_aiperf(spec, out, api_key=ml4_perf_client.api_key)


def test_aiperf_export_min_equals_max_equals_n(aiperf_osl: Any, ml4_perf_client: Any) -> None:
    _attach_on_failure(aiperf_osl, ml4_perf_client)
    ex = aiperf_osl.require()
    osl = ex.metric("output_sequence_length")
    assert osl is not None, "aiperf wrote no output_sequence_length"
    assert (osl.min, osl.max, osl.std) == (N, N, 0.0), (
        f"output_sequence_length min {osl.min}, max {osl.max}, std {osl.std}; expected {N}, {N}, 0")
    assert ex.extra_inputs.get("min_tokens") == N
    assert not extra_inputs_ask_ignore_eos(ex.extra_inputs), WHY_NOT_IGNORE_EOS
    records = read_records(aiperf_osl.out_dir)
    assert len(records) == ex.request_count
    bad = [(r.metadata.get("x_request_id"), r.value("usage_completion_tokens")) for r in records
           if r.value("usage_completion_tokens") != N or r.value("output_sequence_length") != N]
    assert not bad, f"requests without exactly {N} completion tokens: {bad[:5]}"


def test_no_request_killed_by_the_grammar(streamed: Streamed, aiperf_osl: Any, ml4_logs: Any,
                                          osl_window_start: float) -> None:
    """Seed 000's grammar-kill signature (``grammar rejected`` / ``ParserTooComplex``) must not appear while the
    fixed-OSL requests ran.

    An empty window is a failure, not a pass: the requests above were served, so the engine log must show lines
    for them (access lines, stats); nothing there means the log cannot be read and a kill would go unseen."""
    from pytest_ml4.logs import GrammarKill, LogView
    from pytest_ml4.plugin.logs import attach_log

    view = LogView(ml4_logs.read(since=osl_window_start), ml4_logs.describe())
    assert view.records, (f"no engine log lines in {ml4_logs.describe()} since the fixed-OSL run started: the "
                          f"grammar-kill check cannot see the requests it judges (set --ml4-log-file or the "
                          f"target's logs section)")
    kills = view.all(GrammarKill)
    if kills:
        attach_log(view, kills, "grammar kills")
    assert not kills, ("requests were killed by the reasoning grammar during the fixed-OSL run:\n"
                       + view.excerpt(kills) + "\n" + WHY_NOT_IGNORE_EOS)


def test_perf_configs_never_use_ignore_eos(ml4_target: Target,
                                           ml4_perf_extra_inputs: dict[str, Any]) -> None:
    """The target's manifests and the user's ``--perf-extra-input`` never hold the length with ignore_eos.

    (The suite's own aiperf spec is checked where it is built, ``tests/test_perf_core.py``: a spec this test
    built itself says nothing about the deployment.)"""
    manifests = [ml4_target.resolve(m) for m in ml4_target.manifests]
    uses = ignore_eos_in_files(manifests)
    assert not uses, explain(uses)
    assert not extra_inputs_ask_ignore_eos(ml4_perf_extra_inputs), (
        f"--perf-extra-input asks for ignore_eos: {WHY_NOT_IGNORE_EOS}")


def _attach_on_failure(run: Any, client: Any) -> None:
    if run.ok:
        return
    try:
        import allure

        allure.attach(failure_log(run, [client.api_key]), name="aiperf.log", attachment_type=allure.attachment_type.TEXT)
    except ImportError:
        pass
