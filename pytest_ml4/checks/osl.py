"""Fixed output length checks (seed 000): with ``min_tokens = max_tokens = N`` every request returns exactly N
completion tokens, counted three ways (each streamed request's final usage, the tokens counted while streaming,
aiperf's export), no request is killed by the reasoning grammar, and no perf config holds the length with
``ignore_eos``.

The streamed requests are :func:`stream_fixed_length`'s; the counts are read from the engine's own generated-token
counter around them (the stack's ``token_counter``: ``pytest_ml4/data/stacks/stacks.yaml``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from pytest_ml4.checks.codes import fail, fails_with, require
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.client.stream_probe import StreamResult, probe_chat_stream
from pytest_ml4.client.urls import display_url
from pytest_ml4.evidence.metrics import generated_tokens
from pytest_ml4.logs import GrammarKill, LogEvent, LogView
from pytest_ml4.perf.export import ProfileExport, RequestRecord, read_records
from pytest_ml4.perf.methodology import (
    WHY_NOT_IGNORE_EOS,
    explain,
    extra_inputs_ask_ignore_eos,
    ignore_eos_in_files,
)
from pytest_ml4.perf.runner import AiperfSpec, RunResult
from pytest_ml4.stacks import stack_for
from pytest_ml4.target.model import Target

if TYPE_CHECKING:
    from pytest_ml4.perf.sweep import Client


def fixed_length_body(model: str, prompt: str, n: int) -> dict[str, Any]:
    """A streamed request held at exactly ``n`` tokens by ``min_tokens``, asking for per-chunk usage."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": n, "min_tokens": n,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@dataclass
class Streamed:
    """The fixed-length requests, streamed at once, and what the engine counted while they ran."""

    results: list[StreamResult]
    engine_tokens: float | None      # generated while these requests ran (engine counter difference)
    counter: str = ""                # which counter, at which URL


def stream_fixed_length(http_client: httpx.Client, endpoint: Endpoint, target: Target, prompts: Sequence[str],
                        n: int) -> Streamed:
    """Stream one request of exactly ``n`` tokens per prompt, all at once, reading the engine's generated-token
    counter before and after."""
    # The effective metrics URL (not only a --sim one): live runs read the engine's, or the Dynamo frontend's,
    # counter too; each stack's URL carries its own counter (its token_counter).
    url, counter = endpoint.effective_metrics_url, stack_for(target).token_counter
    before = generated_tokens(url, counter=counter)
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: probe_chat_stream(http_client, fixed_length_body(endpoint.model, p, n)),
                                prompts))
    after = generated_tokens(url, counter=counter)
    return Streamed(results, None if before is None or after is None else after - before,
                    f"{counter} at {display_url(url)}")


@fails_with("osl.request_failed", "a fixed-length request did not stream to its end without errors")
@fails_with("osl.no_usage", "a fixed-length stream carried no usage although include_usage was asked")
@fails_with("osl.usage_not_n", "usage.completion_tokens differs from min_tokens = max_tokens")
@fails_with("osl.finish_reason", "a fixed-length request did not finish with length: an EOS ended it early")
def assert_usage_exactly_n(results: Sequence[StreamResult], n: int) -> None:
    """Each request streamed to its end and its final usage reports exactly ``n`` completion tokens."""
    for r in results:
        # Stream-grammar details (e.g. a proxy's usage chunk shape) are the smoke suite's business; here the
        # request must have streamed to the end without errors.
        if not (r.status_code == 200 and r.transport_error is None and not r.error_events):
            fail("osl.request_failed", r.describe())
        if r.usage is None:
            fail("osl.no_usage", f"no usage although include_usage was requested:\n{r.describe()}")
        if r.usage.get("completion_tokens") != n:
            fail("osl.usage_not_n",
                 f"min_tokens = max_tokens = {n} but usage.completion_tokens = {r.usage.get('completion_tokens')}")
        if r.finish_reason != "length":
            fail("osl.finish_reason", f"finish_reason {r.finish_reason!r}: an EOS ended the request early")


@fails_with("osl.streamed_count_not_n", "the per-chunk usage of a fixed-length stream does not sum to its length")
@fails_with("osl.empty_chunk", "a content chunk carried no new token")
@fails_with("osl.engine_count_not_n", "the engine's generated-token counter grew by other than length x requests")
@fails_with("osl.no_streamed_count", "neither per-chunk usage nor the engine's counter counted the stream")
def assert_streamed_count_exactly_n(streamed: Streamed, n: int) -> None:
    """The per-chunk usage sums to ``n`` per request where the path keeps it, and the engine's counter grew by
    ``n`` per request where it can be read; at least one of the two counted."""
    per_chunk = [r for r in streamed.results if r.tokens_per_chunk]
    for r in per_chunk:
        if sum(r.tokens_per_chunk) != n:
            fail("osl.streamed_count_not_n",
                 f"tokens counted while streaming: {sum(r.tokens_per_chunk)} over {len(r.tokens_per_chunk)} chunks, "
            f"expected {n}")
        require(all(k >= 1 for k in r.tokens_per_chunk), "osl.empty_chunk", "a content chunk carried no new token")
    if streamed.engine_tokens is not None:
        print(f"engine token counter: {streamed.engine_tokens:.0f} tokens generated ({streamed.counter})")
        require(streamed.engine_tokens == n * len(streamed.results), "osl.engine_count_not_n",
                lambda: f"the engine generated {streamed.engine_tokens:.0f} tokens ({streamed.counter}) for "
                        f"{len(streamed.results)} requests of exactly {n} (no other traffic may hit the endpoint while this "
                        f"module runs)")
    else:
        print(f"engine token counter not readable ({streamed.counter}): judged on the per-chunk usage only")
    require(per_chunk or streamed.engine_tokens is not None, "osl.no_streamed_count",
            lambda: f"no streamed count: the stream carried no per-chunk usage and {streamed.counter} was not readable")


def fixed_length_aiperf_spec(perf_client: Client, n: int) -> AiperfSpec:
    """aiperf at exactly ``n`` output tokens held by ``min_tokens`` (never ``ignore_eos``)."""
    return AiperfSpec(model=perf_client.model, url=perf_client.base_url, concurrency=4, isl=256, osl=n,
                      duration_s=None, request_count=8, min_tokens=n, server_metrics_url=perf_client.metrics_url)


@fails_with("osl.aiperf_no_osl", "aiperf wrote no output_sequence_length")
@fails_with("osl.aiperf_osl_not_n", "aiperf's output_sequence_length is not min = max = n, std 0")
@fails_with("osl.aiperf_no_min_tokens", "aiperf's fixed-length run was not asked with min_tokens")
@fails_with("osl.aiperf_ignore_eos", "aiperf's fixed-length run held the length with ignore_eos")
@fails_with("osl.aiperf_request_errors", "requests of aiperf's fixed-length run failed")
@fails_with("osl.aiperf_records_missing", "aiperf's per-request records are not one per successful request")
@fails_with("osl.aiperf_records_not_n", "aiperf records requests without exactly n completion tokens")
def assert_aiperf_export_exactly_n(run: RunResult, n: int) -> None:
    """aiperf's export: every request served, output_sequence_length min = max = ``n``, std 0, asked with
    ``min_tokens``, and every request's record at exactly ``n`` completion tokens.

    Failed requests are named first and as such: the summary's figures cover the successful ones only
    (``request_count``), so without this a run with failures read as "records missing"."""
    ex = run.require()
    records = read_records(run.out_dir)
    failed = [r for r in records if not r.ok]
    require(not ex.error_request_count and not failed, "osl.aiperf_request_errors",
            lambda: describe_failed_requests(ex, failed, len(records)))
    osl = ex.metric("output_sequence_length")
    require(osl is not None, "osl.aiperf_no_osl", "aiperf wrote no output_sequence_length")
    require((osl.min, osl.max, osl.std) == (n, n, 0.0), "osl.aiperf_osl_not_n",
            lambda: f"output_sequence_length min {osl.min}, max {osl.max}, std {osl.std}; expected {n}, {n}, 0")
    require(ex.extra_inputs.get("min_tokens") == n, "osl.aiperf_no_min_tokens",
            lambda: f"aiperf's extra inputs {ex.extra_inputs} do not hold min_tokens {n}")
    require(not extra_inputs_ask_ignore_eos(ex.extra_inputs), "osl.aiperf_ignore_eos", WHY_NOT_IGNORE_EOS)
    require(len(records) == ex.request_count, "osl.aiperf_records_missing",
            lambda: f"{len(records)} per-request records (profiling phase) for the {ex.request_count} successful "
                    f"requests of the summary ({run.out_dir})")
    bad = [(r.metadata.get("x_request_id"), r.value("usage_completion_tokens")) for r in records
           if r.value("usage_completion_tokens") != n or r.value("output_sequence_length") != n]
    require(not bad, "osl.aiperf_records_not_n",
            lambda: f"requests without exactly {n} completion tokens: {bad[:5]}")


def describe_failed_requests(export: ProfileExport, failed: Sequence[RequestRecord], records: int) -> str:
    """How many of the run's requests failed and with what, from the summary and the per-request records."""
    kinds = [f"{e.count} x HTTP {e.code} {e.type}: {e.message[:160]}" for e in export.error_summary]
    if not kinds and failed:
        kinds = [f"first failed record: {failed[0].error}"]
    return "; ".join([f"aiperf's fixed-length run: {export.error_request_count} failed request(s) in the summary, "
                      f"{len(failed)} failed record(s) of {records}, {export.request_count} successful", *kinds])


@fails_with("osl.no_log_lines",
            "no engine log lines while the fixed-OSL requests ran: the grammar-kill check cannot see them")
@fails_with("osl.grammar_kill", "the engine log shows a request terminated by the grammar")
def assert_no_grammar_kill(view: LogView, attach: Callable[[LogView, Sequence[LogEvent], str], Any]) -> None:
    """The engine log's lines since the fixed-length requests started (``view``) are there, and no grammar kill
    among them; ``attach`` reports the kills it found (the plugin's ``ml4_attach_log``)."""
    require(view.records, "osl.no_log_lines", f"no engine log lines in {view.source} since the fixed-OSL run "
            f"started: the grammar-kill check cannot see the requests it judges (set --ml4-log-file or the "
            f"target's logs section)")
    kills = view.all(GrammarKill)
    if kills:
        attach(view, kills, "grammar kills")
    require(not kills, "osl.grammar_kill", lambda: "requests were killed by the reasoning grammar during the "
            "fixed-OSL run:\n" + view.excerpt(kills) + "\n" + WHY_NOT_IGNORE_EOS)


@fails_with("osl.ignore_eos_in_manifests", "the target's manifests hold the length with ignore_eos")
@fails_with("osl.ignore_eos_in_extra_inputs", "the user's --perf-extra-input holds the length with ignore_eos")
def assert_no_ignore_eos(manifests: Sequence[Path], extra_inputs: Mapping[str, Any]) -> None:
    """Neither the target's manifests nor the user's ``--perf-extra-input`` hold the length with ignore_eos."""
    uses = ignore_eos_in_files(manifests)
    require(not uses, "osl.ignore_eos_in_manifests", lambda: explain(uses))
    require(not extra_inputs_ask_ignore_eos(extra_inputs), "osl.ignore_eos_in_extra_inputs",
            lambda: f"--perf-extra-input asks for ignore_eos: {WHY_NOT_IGNORE_EOS}")
