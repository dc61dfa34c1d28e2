"""The smoke suite's evidence and verdicts: the model list, the known question (plain and streamed), usage against
the streamed text, the wrong key and the parallel burst.

Each ``ask``/``list``/``send`` function gathers the evidence (the raw HTTP, the asyncio of the burst) and raises
only where no evidence came back; each ``assert_`` function judges it with the codes of
``pytest_ml4/data/verdicts/codes.yaml``. ``suites/test_smoke.py`` calls one of each per check.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import httpx
import openai

from pytest_ml4.checks.codes import fail, fails_with, require
from pytest_ml4.checks.protocol import assert_stream_clean
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.client.endpoint import decode_json, explain_openai_error, quote_body
from pytest_ml4.client.urls import display_url

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

    from pytest_ml4.checks.suite_data import Burst, KnownQuestion
    from pytest_ml4.client.deployment import Deployment
    from pytest_ml4.client.stream_probe import StreamResult
    from pytest_ml4.evidence.recount import TokenCounter
    from pytest_ml4.target.model import Target

# Real vLLM counts the EOS token and, for reasoning models, the [THINK]/[/THINK] markers that the client never
# sees; with speculative decoding a chunk may carry several tokens. A handful of tokens of slack covers that.
USAGE_TOKEN_SLACK = 4
USAGE_PROMPT = "Write a one-sentence readiness check."
USAGE_MAX_TOKENS = 256
WRONG_KEY = "wrong-key-for-smoke-test"


def chat_body(target: Target, prompt: str, **extra: Any) -> dict[str, Any]:
    """A one-message chat request for the target's served model."""
    return {"model": target.serving.served_model_name, "messages": [{"role": "user", "content": prompt}], **extra}


# --- the model list


@fails_with("models.http_status", "GET /v1/models does not answer 200")
def list_models(http: httpx.Client) -> dict[str, Any]:
    """``GET /v1/models``'s body; an answer other than 200 is the verdict."""
    resp = http.get("/models")
    where = display_url(str(resp.request.url))
    require(resp.status_code == 200, "models.http_status",
            lambda: f"GET {where} answered HTTP {resp.status_code}: {resp.text[:200]!r}")
    return decode_json(resp, "GET /v1/models")


@fails_with("models.served_name_missing", "the served model name is missing from /v1/models")
def assert_served_name_listed(models: dict[str, Any], served_name: str) -> None:
    ids = [card.get("id") for card in models.get("data", [])]
    require(served_name in ids, "models.served_name_missing",
            lambda: f"served model {served_name!r} missing from /v1/models: {ids}")


def _engine_card(ml4: Deployment) -> dict[str, Any] | None:
    """The engine's own model card behind a proxy, found through the engine's metrics URL (same server)."""
    root = ml4.endpoint.engine_root_url
    if root == ml4.endpoint.root_url:
        return None
    resp = httpx.get(root + "/v1/models", headers=ml4.endpoint.auth_headers(), timeout=10)
    if resp.status_code != 200:
        return None
    serving = ml4.target.serving
    name = serving.engine_served_model_name or serving.served_model_name
    return next((c for c in decode_json(resp, "engine GET /v1/models").get("data", []) if c.get("id") == name), None)


def advertised_max_model_len(ml4: Deployment) -> Any:
    """The context length the served model's card states (``max_model_len``, LiteLLM's ``context_window``); behind
    a proxy whose card states none, the engine's card; not judged where neither is readable."""
    body = decode_json(ml4.http.get("/models"), "GET /v1/models")
    card = next(c for c in body["data"] if c.get("id") == ml4.target.serving.served_model_name)
    length = card.get("max_model_len", card.get("context_window"))
    if length is None and ml4.target.has_proxy:
        engine = _engine_card(ml4)
        if engine is None:
            not_judged(f"the {ml4.target.serving.proxy.kind} proxy's model card carries no max_model_len and the "
                       f"engine's is not reachable (set {ml4.target.endpoint.metrics_url_env})")
        length = engine.get("max_model_len")
    return length


@fails_with("models.max_model_len", "the served context length differs from the target's max_model_len")
def assert_max_model_len(length: Any, expected: int) -> None:
    require(length == expected, "models.max_model_len",
            lambda: f"max_model_len {length} on /v1/models differs from the target's {expected}")


# --- the known question


@fails_with("chat.request_failed")
def ask_known_question(ml4: Deployment, question: KnownQuestion) -> ChatCompletion:
    """The non-streamed answer to the known question; an error answer is the verdict (a lost connection is not
    caught: the breaker must see it)."""
    try:
        return ml4.openai.chat.completions.create(
            **chat_body(ml4.target, question.prompt, max_tokens=question.max_tokens))
    except openai.APIStatusError as err:
        fail("chat.request_failed", f"chat request failed: {explain_openai_error(err)}")


@fails_with("chat.finish_reason", "a plain answer did not finish with stop")
@fails_with("chat.no_usage", "a non-streamed answer carries no usage")
@fails_with("chat.usage_sum", "prompt_tokens + completion_tokens != total_tokens")
@fails_with("smoke.wrong_answer", "the known question got a wrong answer")
def assert_known_answer(resp: ChatCompletion, question: KnownQuestion) -> None:
    """The answer finished, holds the known answer and reports usage that adds up."""
    choice = resp.choices[0]
    require(choice.finish_reason == "stop", "chat.finish_reason",
            lambda: f"finish_reason {choice.finish_reason!r}, content {choice.message.content!r}")
    require(question.expect_substring in (choice.message.content or ""), "smoke.wrong_answer",
            lambda: f"wrong answer to {question.prompt!r}: {choice.message.content!r}")
    usage = resp.usage
    require(usage is not None, "chat.no_usage", "no usage in a non-streamed response")
    require(usage.prompt_tokens + usage.completion_tokens == usage.total_tokens, "chat.usage_sum",
            lambda: f"usage does not add up: {usage}")


def stream_chat(ml4: Deployment, prompt: str, max_tokens: int) -> StreamResult:
    """A streamed answer with its usage chunk, read by the stream probe (grammar, timings, events)."""
    from pytest_ml4.client.stream_probe import probe_chat_stream

    body = chat_body(ml4.target, prompt, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True})
    return probe_chat_stream(ml4.http, body)


@fails_with("stream.error_event", "a stream carried an in-band error event")
@fails_with("stream.finish_reason", "a plain streamed answer did not finish with stop")
@fails_with("stream.no_first_token", "no time to first token was measured for a stream")
@fails_with("smoke.wrong_answer")
def assert_streamed_known_answer(result: StreamResult, question: KnownQuestion) -> None:
    """A clean stream (one line naming the URL: "stream from URL: HTTP 503: ..." or "...: no answer: ..."), no
    in-band error, the known answer, finished, and a first token timed."""
    assert_stream_clean(result)
    require(not result.error_events, "stream.error_event", lambda: f"in-band error events in the stream: "
                                                                   f"{result.error_events}")
    require(question.expect_substring in result.content, "smoke.wrong_answer",
            lambda: f"wrong streamed answer: {result.content!r}")
    require(result.finish_reason == "stop", "stream.finish_reason", lambda: f"finish_reason {result.finish_reason!r}")
    require(result.ttft_s is not None and result.ttft_s > 0, "stream.no_first_token",
            lambda: f"no time to first token measured (ttft {result.ttft_s})")


@fails_with("stream.no_usage", "no usage chunk although stream_options.include_usage was set")
@fails_with("stream.usage_sum", "a stream's usage does not add up")
@fails_with("stream.too_few_events", "a streamed answer has too few SSE events to be streamed")
@fails_with("smoke.usage_disagrees_with_text", "usage.completion_tokens disagrees with the streamed text's token count")
def assert_stream_usage_agrees(result: StreamResult, counter: TokenCounter) -> None:
    """The stream's usage chunk is there, adds up, and its completion_tokens re-count from the streamed text."""
    usage = result.usage
    require(usage, "stream.no_usage", lambda: (
        f"no usage chunk although stream_options.include_usage was set (stream from {result.url}: HTTP "
        f"{result.status_code}: {result.transport_error or quote_body(result.http_error_text or '')})"))
    require(usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"], "stream.usage_sum",
            lambda: f"usage does not add up: {usage}")
    seen = counter.count(result.reasoning) + counter.count(result.content)
    slack = counter.slack(seen, USAGE_TOKEN_SLACK)
    require(abs(usage["completion_tokens"] - seen) <= slack, "smoke.usage_disagrees_with_text", lambda: (
        f"completion_tokens {usage['completion_tokens']} but the streamed text re-tokenises to {seen} tokens "
        f"(reasoning {len(result.reasoning)} chars, content {len(result.content)} chars; allowed difference "
        f"{slack}; {counter.describe()})"))
    require(len(result.events) >= 3, "stream.too_few_events", "too few SSE events for a streamed answer")


# --- refusals and the burst


def send_with_wrong_key(ml4: Deployment) -> httpx.Response:
    """A chat request carrying a key the deployment never issued (a fresh client: the session's carries the right
    one)."""
    return httpx.post(ml4.endpoint.base_url + "/chat/completions", json=chat_body(ml4.target, "hi", max_tokens=8),
                      headers={"Authorization": f"Bearer {WRONG_KEY}"}, timeout=30)


def send_burst(ml4: Deployment, burst: Burst, max_tokens: int) -> list[str | BaseException]:
    """``burst.requests`` parallel chats (one event loop, one async client); each answer's content or its error."""
    client = ml4.async_openai()

    async def one() -> str:
        r = await client.chat.completions.create(**chat_body(ml4.target, burst.prompt, max_tokens=max_tokens))
        return r.choices[0].message.content or ""

    async def all_of_them() -> list[str | BaseException]:
        return await asyncio.gather(*(one() for _ in range(burst.requests)), return_exceptions=True)

    return asyncio.run(all_of_them())


@fails_with("chat.burst_failed", "requests of a parallel burst failed")
@fails_with("chat.burst_wrong_answer", "answers of a parallel burst do not hold the known answer")
def assert_burst_answered(answers: list[str | BaseException], burst: Burst) -> None:
    """Every request of the burst answered, each with the known answer."""
    failures = [repr(a) for a in answers if isinstance(a, BaseException)]
    require(not failures, "chat.burst_failed",
            lambda: f"{len(failures)}/{burst.requests} parallel requests failed: {failures[:3]}")
    wrong = [a for a in answers if burst.expect_substring not in a]
    require(not wrong, "chat.burst_wrong_answer", lambda: f"wrong answers in the burst: {json.dumps(wrong)[:300]}")
