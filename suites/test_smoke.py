"""Smoke suite: is the deployment up, does it answer correctly, and does it speak vLLM's protocol?

Health and model list, a non-streaming and a streaming chat with a known answer, stream grammar, usage
consistency (re-tokenised with Tekken), the error answers of the target's serving stack, and a parallel burst.
Data (the question, the per-stack error shapes) lives in ``pytest_ml4/data/smoke/smoke.yaml``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
import yaml

from pytest_ml4.checks.codes import fail, require
from pytest_ml4.checks.expected import (
    Expected,
    answer_to_refuse,
    assert_answer_expected,
    expected_for,
)
from pytest_ml4.checks.health import (
    assert_dynamo_workers_registered,
    assert_endpoint_healthy,
    assert_engine_behind_proxy_healthy,
)
from pytest_ml4.checks.protocol import assert_stream_clean
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.client.endpoint import (
    Endpoint,
    decode_json,
    explain_openai_error,
    quote_body,
)
from pytest_ml4.client.urls import display_url
from pytest_ml4.evidence.worker_engine import WorkerEngine
from pytest_ml4.locations import data_file
from pytest_ml4.target.model import Target

pytestmark = pytest.mark.smoke

SMOKE_FILE = data_file("smoke", "smoke.yaml")
DATA = yaml.safe_load(SMOKE_FILE.read_text())
QUESTION = DATA["question"]
# Real vLLM counts the EOS token and, for reasoning models, the [THINK]/[/THINK] markers that the client never
# sees; with speculative decoding a chunk may carry several tokens. A handful of tokens of slack covers that.
USAGE_TOKEN_SLACK = 4


def _chat_body(target: Target, prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": target.serving.served_model_name, "messages": [{"role": "user", "content": prompt}], **extra}


def test_health(ml4_target: Target, ml4_endpoint: Endpoint, ml4_worker_engine: WorkerEngine | None) -> None:
    """The endpoint's health; on Dynamo every worker listed (every worker the embedded deployment started, where it
    reduced the target's topology); behind a proxy, the engine's own ``/health`` (a proxy's liveness answers 200
    while the engine behind it is dead)."""
    path = DATA["health_path"][ml4_target.serving.stack]
    resp = assert_endpoint_healthy(ml4_endpoint, path)
    if ml4_target.is_dynamo:
        reduced = ml4_worker_engine.reduced_to() if ml4_worker_engine else None
        assert_dynamo_workers_registered(resp, path, ml4_target, reduced)
    if ml4_target.has_proxy:
        engine_stack = ml4_target.serving.stack.split("+", 1)[0]
        assert_engine_behind_proxy_healthy(ml4_endpoint, ml4_target, DATA["health_path"][engine_stack])


def test_models_lists_served_name(ml4_target: Target, http_client: httpx.Client) -> None:
    resp = http_client.get("/models")
    where = display_url(str(resp.request.url))
    require(resp.status_code == 200, "models.http_status",
            lambda: f"GET {where} answered HTTP {resp.status_code}: {resp.text[:200]!r}")
    body = decode_json(resp, "GET /v1/models")
    ids = [card.get("id") for card in body.get("data", [])]
    require(ml4_target.serving.served_model_name in ids, "models.served_name_missing",
            lambda: f"served model {ml4_target.serving.served_model_name!r} missing from /v1/models: {ids}")


def _engine_card(ml4_target: Target, ml4_endpoint: Endpoint) -> dict[str, Any] | None:
    """The engine's own model card behind a proxy, found through the engine's metrics URL (same server)."""
    root = ml4_endpoint.engine_root_url
    if root == ml4_endpoint.root_url:
        return None
    resp = httpx.get(root + "/v1/models", headers=ml4_endpoint.auth_headers(), timeout=10)
    if resp.status_code != 200:
        return None
    name = ml4_target.serving.engine_served_model_name or ml4_target.serving.served_model_name
    return next((c for c in decode_json(resp, "engine GET /v1/models").get("data", []) if c.get("id") == name), None)


def test_models_max_model_len(ml4_target: Target, ml4_endpoint: Endpoint, http_client: httpx.Client) -> None:
    body = decode_json(http_client.get("/models"), "GET /v1/models")
    card = next(c for c in body["data"] if c.get("id") == ml4_target.serving.served_model_name)
    length = card.get("max_model_len", card.get("context_window"))
    if length is None and ml4_target.has_proxy:
        engine = _engine_card(ml4_target, ml4_endpoint)
        if engine is None:
            not_judged(f"the {ml4_target.serving.proxy.kind} proxy's model card carries no max_model_len and the "
                       f"engine's is not reachable (set {ml4_target.endpoint.metrics_url_env})")
        length = engine.get("max_model_len")
    require(length == ml4_target.engine.max_model_len, "models.max_model_len",
            lambda: f"max_model_len {length} on /v1/models differs from the target's {ml4_target.engine.max_model_len}")


def test_chat_answers_known_question(ml4_target: Target, openai_client: Any) -> None:
    try:
        resp = openai_client.chat.completions.create(
            **_chat_body(ml4_target, QUESTION["prompt"], max_tokens=QUESTION["max_tokens"]))
    except openai.APIStatusError as err:  # an answer, not a lost connection (which the breaker must see)
        fail("chat.request_failed", f"chat request failed: {explain_openai_error(err)}")
    choice = resp.choices[0]
    require(choice.finish_reason == "stop", "chat.finish_reason",
            lambda: f"finish_reason {choice.finish_reason!r}, content {choice.message.content!r}")
    require(QUESTION["expect_substring"] in (choice.message.content or ""), "smoke.wrong_answer",
            lambda: f"wrong answer to {QUESTION['prompt']!r}: {choice.message.content!r}")
    usage = resp.usage
    require(usage is not None, "chat.no_usage", "no usage in a non-streaming response")
    require(usage.prompt_tokens + usage.completion_tokens == usage.total_tokens, "chat.usage_sum",
            lambda: f"usage does not add up: {usage}")


def test_stream_answers_known_question_with_clean_grammar(ml4_target: Target, http_client: httpx.Client) -> None:
    from pytest_ml4.client.stream_probe import probe_chat_stream

    body = _chat_body(ml4_target, QUESTION["prompt"], max_tokens=QUESTION["max_tokens"], stream=True,
                      stream_options={"include_usage": True})
    result = probe_chat_stream(http_client, body)
    assert_stream_clean(result)  # one line naming the URL: "stream from URL: HTTP 503: ..." or "...: no answer: ..."
    require(not result.error_events, "stream.error_event", lambda: f"in-band error events in the stream: "
                                                                   f"{result.error_events}")
    require(QUESTION["expect_substring"] in result.content, "smoke.wrong_answer",
            lambda: f"wrong streamed answer: {result.content!r}")
    require(result.finish_reason == "stop", "stream.finish_reason", lambda: f"finish_reason {result.finish_reason!r}")
    require(result.ttft_s is not None and result.ttft_s > 0, "stream.no_first_token",
            lambda: f"no time to first token measured (ttft {result.ttft_s})")


def test_stream_usage_agrees_with_streamed_text(ml4_target: Target, http_client: httpx.Client,
                                                ml4_token_counter: Any) -> None:
    from pytest_ml4.client.stream_probe import probe_chat_stream

    body = _chat_body(ml4_target, "Write a one-sentence readiness check.", max_tokens=256, stream=True,
                      stream_options={"include_usage": True})
    result = probe_chat_stream(http_client, body)
    usage = result.usage
    require(usage, "stream.no_usage", lambda: (
        f"no usage chunk although stream_options.include_usage was set (stream from {result.url}: HTTP "
        f"{result.status_code}: {result.transport_error or quote_body(result.http_error_text or '')})"))
    require(usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"], "stream.usage_sum",
            lambda: f"usage does not add up: {usage}")
    seen = ml4_token_counter.count(result.reasoning) + ml4_token_counter.count(result.content)
    slack = ml4_token_counter.slack(seen, USAGE_TOKEN_SLACK)
    require(abs(usage["completion_tokens"] - seen) <= slack, "smoke.usage_disagrees_with_text", lambda: (
        f"completion_tokens {usage['completion_tokens']} but the streamed text re-tokenises to {seen} tokens "
        f"(reasoning {len(result.reasoning)} chars, content {len(result.content)} chars; allowed difference "
        f"{slack}; {ml4_token_counter.describe()})"))
    require(len(result.events) >= 3, "stream.too_few_events", "too few SSE events for a streamed answer")


def _expect(target: Target, case: str) -> Expected:
    return expected_for(DATA["errors"], target.serving.stack, case, SMOKE_FILE)


def test_unknown_model_is_refused(ml4_target: Target, http_client: httpx.Client) -> None:
    resp = http_client.post("/chat/completions",
                            json={**_chat_body(ml4_target, "hi", max_tokens=8), "model": "no-such-model"})
    assert_answer_expected(resp, _expect(ml4_target, "unknown_model"), "unknown model")


def test_over_long_prompt_is_refused(ml4_target: Target, http_client: httpx.Client) -> None:
    # "hello " is one Tekken token; 10% over max_model_len guarantees the prompt alone exceeds the context.
    prompt = "hello " * int(ml4_target.engine.max_model_len * 1.1)
    body = _chat_body(ml4_target, prompt, max_tokens=8)
    resp = answer_to_refuse(lambda: http_client.post("/chat/completions", json=body, timeout=120), "over-long prompt")
    assert_answer_expected(resp, _expect(ml4_target, "prompt_too_long"), "over-long prompt")


@pytest.mark.applies_if("endpoint.requires_api_key", why="the deployment asks for no key")
def test_wrong_api_key_is_refused(ml4_target: Target, ml4_endpoint: Endpoint) -> None:
    resp = httpx.post(ml4_endpoint.base_url + "/chat/completions", json=_chat_body(ml4_target, "hi", max_tokens=8),
                      headers={"Authorization": "Bearer wrong-key-for-smoke-test"}, timeout=30)
    assert_answer_expected(resp, _expect(ml4_target, "bad_api_key"), "wrong API key")


def test_parallel_burst_all_succeed(ml4_target: Target, async_openai_client: Any) -> None:
    burst = DATA["burst"]

    async def one() -> str:
        r = await async_openai_client.chat.completions.create(
            **_chat_body(ml4_target, burst["prompt"], max_tokens=QUESTION["max_tokens"]))
        return r.choices[0].message.content or ""

    async def all_of_them() -> list[Any]:
        return await asyncio.gather(*(one() for _ in range(burst["requests"])), return_exceptions=True)

    answers = asyncio.run(all_of_them())
    failures = [repr(a) for a in answers if isinstance(a, BaseException)]
    require(not failures, "chat.burst_failed",
            lambda: f"{len(failures)}/{burst['requests']} parallel requests failed: {failures[:3]}")
    wrong = [a for a in answers if burst["expect_substring"] not in a]
    require(not wrong, "chat.burst_wrong_answer", lambda: f"wrong answers in the burst: {json.dumps(wrong)[:300]}")
