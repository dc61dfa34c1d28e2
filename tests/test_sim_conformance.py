"""The simulator against vLLM 0.33's own transcripts: same keys, nulls, key order and event order.

One simulator per module (gb300-agg: served name ``mistral-large-4``, no API key), without speculative decoding
so every step carries one token like the transcripts' harness, and with max_model_len 4096 like errors.txt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pytest_ml4_sim.deploy.simulator import SimServer
from test_sim_support import (
    WEATHER_TOOL,
    collapse,
    drop_key,
    error_cases,
    get,
    pairs,
    shape,
    stream_lines,
    transcript_cases,
)

OVERRIDES = {"sim": {"ttft_s": 0.01, "itl_ms": 0.5}, "engine": {"speculative": None, "max_model_len": 4096}}
FP = re.compile(r"^vllm-0\.33\.0-tp\d+-[0-9a-f]{8}$")
CASES = transcript_cases()
ERRORS = error_cases()


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("gb300-agg", overrides=OVERRIDES) as s:
        yield s


@pytest.fixture(scope="module")
def http(sim: SimServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=30) as c:
        yield c


def _chat(http: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return http.post("/v1/chat/completions", json=body)


def _stream_shapes(lines: list[str], *, sim_side: bool) -> list[Any]:
    """Collapsed chunk shapes; on the simulator side the terminal chunk's fingerprint is checked and removed."""
    assert lines[-1] == "[DONE]"
    shapes = []
    for i, line in enumerate(lines[:-1]):
        ev = pairs(line)
        if sim_side and i == len(lines) - 2:
            assert FP.match(get(ev, "system_fingerprint") or ""), line
            ev = drop_key(ev, "system_fingerprint")
        shapes.append(shape(ev))
    return collapse(shapes) + ["[DONE]"]


def _body_shape(text: str) -> Any:
    body = pairs(text)
    assert FP.match(get(body, "system_fingerprint") or "")
    return shape(body)


def _ref_body_shape(case: str) -> Any:
    body = CASES[case]["body"]
    # The harness passed system_fingerprint=None; a real 0.33 server fills it (vllm.md §1.2).
    return shape(("obj", [(k, "fp" if k == "system_fingerprint" else v) for k, v in body[1]]))


# --------------------------------------------------------------------------- non-streaming bodies
def test_plain_body_matches_transcript(http: httpx.Client) -> None:
    r = _chat(http, {"model": "mistral-large-4", "messages": [{"role": "user", "content": "What is 17 + 25?"}],
                     "reasoning_effort": "none"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json" and r.headers["server"] == "uvicorn"
    assert "42" in r.json()["choices"][0]["message"]["content"]
    assert ": " not in r.text.split('"content"')[0], "wire JSON must be compact"
    assert _body_shape(r.text) == _ref_body_shape("plain content")
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", r.json()["id"])


def test_reasoning_body_matches_transcript(http: httpx.Client) -> None:
    r = _chat(http, {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "reasoning_effort": "low"})
    body = r.json()
    assert _body_shape(r.text) == _ref_body_shape("reasoning + content")
    msg = body["choices"][0]["message"]
    assert msg["reasoning"] and "[THINK]" not in msg["reasoning"] and "[THINK]" not in msg["content"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_tool_call_body_matches_transcript(http: httpx.Client) -> None:
    r = _chat(http, {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                     "tools": [WEATHER_TOOL], "reasoning_effort": "none"})
    body = r.json()
    assert _body_shape(r.text) == _ref_body_shape("tool call v13")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", call["id"])
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert call["function"]["arguments"] == '{"city": "Paris"}'


def test_parallel_tool_calls_with_reasoning_body(http: httpx.Client) -> None:
    r = _chat(http, {"messages": [{"role": "user", "content": "What is the weather in Paris and Rome?"}],
                     "tools": [WEATHER_TOOL], "reasoning_effort": "low"})
    assert _body_shape(r.text) == _ref_body_shape("reasoning + parallel tool calls")
    msg = r.json()["choices"][0]["message"]
    assert [json.loads(c["function"]["arguments"])["city"] for c in msg["tool_calls"]] == ["Paris", "Rome"]


def test_named_tool_choice_body(http: httpx.Client) -> None:
    r = _chat(http, {"messages": [{"role": "user", "content": "Weather in Paris please"}], "tools": [WEATHER_TOOL],
                     "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                     "reasoning_effort": "none"})
    assert _body_shape(r.text) == _ref_body_shape("named tool choice")
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == ""


# --------------------------------------------------------------------------- streams
def test_plain_stream_matches_transcript(http: httpx.Client) -> None:
    lines = stream_lines(http, {"messages": [{"role": "user", "content": "Hello"}], "stream": True,
                                "stream_options": {"include_usage": True}, "reasoning_effort": "none"})
    ref = _stream_shapes(CASES["plain content"]["sse"], sim_side=False)
    assert _stream_shapes(lines, sim_side=True) == ref


def test_reasoning_stream_matches_transcript(http: httpx.Client) -> None:
    lines = stream_lines(http, {"messages": [{"role": "user", "content": "What is 3 + 4?"}], "stream": True,
                                "stream_options": {"include_usage": True}, "reasoning_effort": "low"})
    assert _stream_shapes(lines, sim_side=True) == _stream_shapes(CASES["reasoning + content"]["sse"],
                                                                  sim_side=False)
    assert not any("[THINK]" in line or "[/THINK]" in line for line in lines)


def test_tool_call_stream_matches_transcript(http: httpx.Client) -> None:
    lines = stream_lines(http, {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                                "tools": [WEATHER_TOOL], "stream": True, "stream_options": {"include_usage": True},
                                "reasoning_effort": "none"})
    assert _stream_shapes(lines, sim_side=True) == _stream_shapes(CASES["tool call v13"]["sse"], sim_side=False)
    # The argument fragments are the transcript's exactly (same Tekken token boundaries, "}" on the finish chunk).
    frags = [tc["function"]["arguments"] for line in lines[:-1] for ch in json.loads(line)["choices"]
             for tc in ch["delta"].get("tool_calls", [])]
    assert frags == ['{"', "city", '":', ' "', "Paris", '"', "}"]


def test_parallel_tool_stream_matches_transcript(http: httpx.Client) -> None:
    lines = stream_lines(http, {"messages": [{"role": "user", "content": "What is the weather in Paris and Rome?"}],
                                "tools": [WEATHER_TOOL], "stream": True, "reasoning_effort": "low"})
    assert _stream_shapes(lines, sim_side=True) == _stream_shapes(CASES["reasoning + parallel tool calls"]["sse"],
                                                                  sim_side=False)


def test_continuous_usage_on_every_chunk(http: httpx.Client) -> None:
    lines = stream_lines(http, {"messages": [{"role": "user", "content": "Hello"}], "stream": True,
                                "reasoning_effort": "none",
                                "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    events = [json.loads(x) for x in lines[:-1]]
    assert all("usage" in e for e in events)
    assert events[0]["usage"]["completion_tokens"] == 0
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == counts[-2]
    assert list(events[1]["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]


def test_finish_chunk_carries_fingerprint_without_usage(http: httpx.Client) -> None:
    lines = stream_lines(http, {"messages": [{"role": "user", "content": "Hello"}], "stream": True,
                                "reasoning_effort": "none"})
    last = json.loads(lines[-2])
    assert last["choices"][0]["finish_reason"] == "stop" and FP.match(last["system_fingerprint"])
    assert all("system_fingerprint" not in json.loads(x) for x in lines[:-2])


def test_request_id_header_replaces_random_part(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", headers={"X-Request-Id": "abc123"},
                  json={"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "none"})
    assert r.json()["id"] == "chatcmpl-abc123"


# --------------------------------------------------------------------------- errors (errors.txt)
@pytest.mark.parametrize("case,body", [
    ("max_completion_tokens > max_model_len",
     {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10000}),
    ("tool_choice without tools", {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"}),
    ("empty tools", {"messages": [{"role": "user", "content": "hi"}], "tools": []}),
    ("stream_options without stream",
     {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}}),
    ("bad type temperature", {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
    ("missing messages", {"model": "mistral-large-4"}),
])
def test_error_bodies_exact(http: httpx.Client, case: str, body: dict[str, Any]) -> None:
    status, expected = ERRORS[case]
    r = _chat(http, body)
    assert (r.status_code, r.text) == (status, expected)


def test_prompt_too_long_error(http: httpx.Client) -> None:
    r = _chat(http, {"messages": [{"role": "user", "content": "word " * 6000}]})
    status, ref = ERRORS["prompt too long"]
    assert r.status_code == status
    n = int(re.search(r"contains (\d+) input tokens", r.text).group(1))
    assert n > 4096
    assert r.text == ref.replace("5000", str(n))


def test_prompt_over_the_character_bound_is_refused_before_tokenising(http: httpx.Client) -> None:
    """0.33's _text_len_check: more characters than max_model_len tokens could hold -> 400, param input_text."""
    from pytest_ml4.evidence.tokenizer import get_tokenizer

    bound = 4096 * get_tokenizer(15).max_chars_per_token
    text = "x" * (bound + 1)
    r = _chat(http, {"messages": [{"role": "user", "content": text}]})
    assert r.status_code == 400
    assert r.text == (
        '{"error":{"message":"This model\'s maximum context length is 4096 tokens. However, your prompt contains '
        f'{bound + 1} characters (more than {bound} characters, which is the upper bound for 4096 input tokens). '
        f'Please reduce the length of the input prompt. (parameter=input_text, value={bound + 1})",'
        '"type":"BadRequestError","param":"input_text","code":400}}')
    # Just under the bound the request is tokenised and refused by the token check instead.
    r = _chat(http, {"messages": [{"role": "user", "content": "x" * (bound - 64)}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_tokens"


def _words_for_tokens(n: int) -> str:
    """A user prompt whose chat encoding is exactly ``n`` Tekken tokens."""
    from pytest_ml4.evidence.tokenizer import get_tokenizer

    tok = get_tokenizer(15)
    overhead = tok.prompt_tokens({"messages": [{"role": "user", "content": "word"}]}) - 1
    text = "word" + " word" * (n - overhead - 1)
    assert tok.prompt_tokens({"messages": [{"role": "user", "content": text}]}) == n
    return text


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_prompt_of_exactly_max_model_len_gets_the_engine_wording(http: httpx.Client, stream: bool) -> None:
    """The renderer passes a prompt == max_model_len; the engine's input processor refuses it (vllm.md §6.3)."""
    r = _chat(http, {"messages": [{"role": "user", "content": _words_for_tokens(4096)}], "stream": stream})
    assert r.status_code == 400
    assert r.json() == {"error": {
        "message": "The decoder prompt (length 4096) plus the number of requested output tokens (at least 1) is "
                   "longer than the maximum model length of 4096. Make sure that `max_model_len` is no smaller "
                   "than the number of text tokens (prompt + requested output tokens).",
        "type": "BadRequestError", "param": None, "code": 400}}
    ok = _chat(http, {"messages": [{"role": "user", "content": _words_for_tokens(4095)}], "max_tokens": 1,
                      "reasoning_effort": "none"})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize(("truncate", "kept"), [(-1, 4095), (1000, 1000)])
def test_truncate_prompt_tokens_serves_an_over_long_prompt_cut(http: httpx.Client, truncate: int, kept: int) -> None:
    """vLLM 0.32's TokenizeParams: N keeps N prompt tokens, -1 keeps max_model_len - 1 (room for one output token);
    the character pre-check does not refuse a prompt that asks to be cut. A 6000-token prompt is served."""
    r = _chat(http, {"messages": [{"role": "user", "content": _words_for_tokens(6000)}], "max_tokens": 8,
                     "reasoning_effort": "none", "truncate_prompt_tokens": truncate})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == kept
    assert usage["completion_tokens"] == min(8, 4096 - kept)
    over_chars = _chat(http, {"messages": [{"role": "user", "content": "x " * 40000}], "max_tokens": 1,
                              "truncate_prompt_tokens": truncate})
    assert over_chars.status_code == 200, over_chars.text


def test_truncate_prompt_tokens_over_the_context_is_refused(http: httpx.Client) -> None:
    r = _chat(http, {"messages": [{"role": "user", "content": "hi"}], "truncate_prompt_tokens": 4097})
    assert (r.status_code, r.json()) == (400, {"error": {
        "message": "truncate_prompt_tokens=4097 cannot be greater than max_model_len = 4096. Please request a "
                   "smaller truncation size. (parameter=truncate_prompt_tokens, value=4097)",
        "type": "BadRequestError", "param": "truncate_prompt_tokens", "code": 400}})


def test_unknown_model_404(http: httpx.Client) -> None:
    r = _chat(http, {"model": "foo", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404
    assert r.text == ('{"error":{"message":"The model `foo` does not exist. Valid aliases: mistral-large-4.",'
                      '"type":"NotFoundError","param":"model","code":404}}')


@pytest.mark.parametrize("body,param,needle", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER_TOOL]}, "tool_choice",
     "does not match any of the specified `tools`"),
    ({"tool_choice": "sometimes", "tools": [WEATHER_TOOL]}, "tool_choice", "Invalid value for `tool_choice`"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort", "is not supported by Mistral models"),
    ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template",
     "chat_template is not supported for Mistral tokenizers."),
    ({"temperature": 3}, "temperature", "temperature must be in [0, 2], got 3.0."),
    ({"top_p": 0}, "top_p", "top_p must be in (0, 1]"),
    ({"min_tokens": 50, "max_tokens": 10}, "min_tokens", "min_tokens must be less than or equal to max_tokens=10"),
    ({"max_tokens": 0}, "max_tokens", "max_tokens must be at least 1, got 0."),
])
def test_validation_errors(http: httpx.Client, body: dict[str, Any], param: str, needle: str) -> None:
    r = _chat(http, {"messages": [{"role": "user", "content": "hi"}], **body})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "BadRequestError" and err["code"] == 400
    assert err["param"] == param and needle in err["message"] and f"(parameter={param}" in err["message"]
    assert list(r.json()["error"]) == ["message", "type", "param", "code"]


# --------------------------------------------------------------------------- token limits
def _usage(http: httpx.Client, **extra: Any) -> dict[str, Any]:
    r = _chat(http, {"messages": [{"role": "user", "content": "Hello"}], "reasoning_effort": "none", **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_tokens_count_eos(http: httpx.Client) -> None:
    body = _usage(http)
    u = body["usage"]
    assert u["prompt_tokens"] + u["completion_tokens"] == u["total_tokens"]
    content = body["choices"][0]["message"]["content"]
    from pytest_ml4.evidence.tokenizer import get_tokenizer
    assert u["completion_tokens"] == get_tokenizer(15).count(content) + 1


def test_min_tokens_pads_then_stops(http: httpx.Client) -> None:
    body = _usage(http, min_tokens=60, max_tokens=200)
    assert body["usage"]["completion_tokens"] == 61 and body["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_cuts_with_length(http: httpx.Client) -> None:
    body = _usage(http, max_tokens=5)
    assert body["usage"]["completion_tokens"] == 5 and body["choices"][0]["finish_reason"] == "length"


def test_max_completion_tokens_wins(http: httpx.Client) -> None:
    body = _usage(http, max_tokens=5, max_completion_tokens=7, ignore_eos=True)
    assert body["usage"]["completion_tokens"] == 7


def test_ignore_eos_runs_to_max(http: httpx.Client) -> None:
    body = _usage(http, max_tokens=80, ignore_eos=True)
    assert body["usage"]["completion_tokens"] == 80 and body["choices"][0]["finish_reason"] == "length"


def test_max_tokens_clamped_to_context(http: httpx.Client) -> None:
    prompt = "word " * 4000
    r = _chat(http, {"messages": [{"role": "user", "content": prompt}], "ignore_eos": True, "max_tokens": 4000,
                     "reasoning_effort": "none"})
    u = r.json()["usage"]
    assert r.status_code == 200 and u["total_tokens"] == 4096


# --------------------------------------------------------------------------- other endpoints
def test_models_card(http: httpx.Client, sim: SimServer) -> None:
    r = http.get("/v1/models")
    card = r.json()["data"][0]
    assert list(card) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"]
    assert card["id"] == "mistral-large-4" and card["max_model_len"] == 4096
    assert card["root"] == "/shared-model-cache/mistral-large-4-nvfp4"
    assert re.fullmatch(r"modelperm-[0-9a-f]{16}", card["permission"][0]["id"])


def test_health_ping_version_load(http: httpx.Client) -> None:
    h = http.get("/health")
    assert h.status_code == 200 and h.content == b""
    assert http.get("/ping").status_code == 200 and http.post("/ping").status_code == 200
    assert http.get("/version").text == '{"version":"0.33.0"}'
    assert list(http.get("/load").json()) == ["server_load"]


def test_conversation_refused_by_mistral_common(http: httpx.Client) -> None:
    r = _chat(http, {"messages": [{"role": "tool", "tool_call_id": "abcdefghi", "content": "x"}]})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "BadRequestError"
    assert "must start with a user message or system message" in err["message"]


def test_vllm_0_22_keeps_empty_tool_calls_in_the_message() -> None:
    """<= 0.22 serialises ``"tool_calls": []`` in a message without calls (vllm.md §1.1); 0.33 drops it."""
    with SimServer("gb300-agg", overrides={**OVERRIDES, "engine": {**OVERRIDES["engine"], "version": "0.22.0"}}) as s:
        r = httpx.post(s.base_url + "/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "Hello"}], "reasoning_effort": "none"})
    msg = r.json()["choices"][0]["message"]
    assert list(msg) == ["role", "content", "refusal", "annotations", "audio", "function_call", "tool_calls",
                         "reasoning"]
    assert msg["tool_calls"] == []


def test_vllm_0_33_drops_empty_tool_calls(http: httpx.Client) -> None:
    msg = _chat(http, {"messages": [{"role": "user", "content": "Hello"}], "reasoning_effort": "none"}).json()
    assert "tool_calls" not in msg["choices"][0]["message"]
