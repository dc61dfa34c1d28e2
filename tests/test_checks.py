"""The assertion helpers in ``pytest_ml4.checks``: each failure names the defect, healthy shapes pass.

Healthy shapes come from the reference transcripts (``fixtures/probe/``); defective ones are those shapes with
one thing broken, as the simulator's faults break them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from ml4_http_stub import Scripted, StubServer

from pytest_ml4.checks.chat import Answer, ask
from pytest_ml4.checks.protocol import (
    Assembled,
    assert_no_control_tokens,
    assert_rejected,
    assert_stream_equals_non_stream,
    error_message,
)
from pytest_ml4.checks.reasoning import (
    assert_reasoning_separated,
    assert_reasoning_tokens_agree,
    count_tokens,
    reasoning_share,
)
from pytest_ml4.checks.tools import (
    assert_arguments_valid,
    assert_final_answer_uses_results,
    assert_mistral_tool_ids,
    assert_parallel_calls,
    assert_tool_choice_obeyed,
    is_mistral_tool_id,
    load_tool,
    named,
    with_tool_results,
)
from pytest_ml4.client.endpoint import Endpoint, make_httpx, make_openai
from pytest_ml4.client.stream_probe import parse_sse_text

PROBE = Path(__file__).resolve().parent.parent / "fixtures" / "probe"


def choice(name: str) -> dict[str, Any]:
    return json.loads((PROBE / f"{name}.json").read_text())["non_stream_body"]["choices"][0]


WEATHER = load_tool("get_weather")


def test_reference_tool_call_passes_every_tool_check() -> None:
    c = choice("tool_call_v13")
    assert_no_control_tokens(c["message"], "ref")
    assert_tool_choice_obeyed("auto", c["message"], c["finish_reason"], "get_weather", "ref")
    assert_mistral_tool_ids(c["message"]["tool_calls"], "ref")
    assert assert_arguments_valid(c["message"]["tool_calls"], [WEATHER], "ref") == [{"city": "Paris"}]
    n = choice("named_tool_choice")
    assert_tool_choice_obeyed(named("get_weather"), n["message"], n["finish_reason"], "get_weather", "ref")


def test_a_round_trip_sends_each_result_and_judges_the_final_answer() -> None:
    """The reference call's turn and its canned result go back in OpenAI's shape; a call without a canned result,
    an answer that ignores the result and parallel calls that miss a value are named."""
    c = choice("tool_call_v13")
    first = Answer(False, c["message"], c["finish_reason"], None)
    call_id = first.tool_calls[0]["id"]
    turn = with_tool_results([], first, {"get_weather": "18 C, sunny"})
    assert [m["role"] for m in turn] == ["assistant", "tool"] and turn[1]["tool_call_id"] == call_id
    assert turn[0]["tool_calls"][0]["function"] == first.tool_calls[0]["function"]
    with pytest.raises(AssertionError, match="the model called 'get_weather', no canned result for it"):
        with_tool_results([], first, {"other": "x"})
    final = Answer(False, {"role": "assistant", "content": "It is 18 C and sunny."}, "stop", None)
    assert_final_answer_uses_results(final, ["18 C"])
    with pytest.raises(AssertionError, match="does not use the tool result \\(missing '21 C'\\)"):
        assert_final_answer_uses_results(final, ["21 C"])
    assert_parallel_calls([{"city": "Paris"}, {"city": "Rome"}], 2, ["Paris", "Rome"], "ref")
    with pytest.raises(AssertionError, match="expected 2 parallel calls for \\['Paris', 'Rome'\\], got 1"):
        assert_parallel_calls([{"city": "Paris"}], 2, ["Paris", "Rome"], "ref")


def test_tool_parser_off_is_named() -> None:
    msg = {"role": "assistant", "content": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "tool_calls": []}
    with pytest.raises(AssertionError, match=r"tool parser off: '\[TOOL_CALLS\]' leaked into content"):
        assert_no_control_tokens(msg, "x")
    with pytest.raises(AssertionError, match="no tool call came back"):
        assert_tool_choice_obeyed("auto", msg, "stop", "get_weather", "x")


@pytest.mark.parametrize("value, ok", [("HBCVNbW3f", True), ("3QA4PDWM7", True), ("chatcmpl-tool-1a2b", False),
                                       ("abc12345", False), ("abcd_1234", False), ("ÄBCDEFGH1", False), (None, False)])
def test_mistral_tool_id_rule(value: Any, ok: bool) -> None:
    assert is_mistral_tool_id(value) is ok


def test_bad_ids_and_bad_arguments_are_named() -> None:
    call = {"id": "chatcmpl-tool-0123456789abcdef", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"'}}
    with pytest.raises(AssertionError, match="are not Mistral ids"):
        assert_mistral_tool_ids([call], "x")
    with pytest.raises(AssertionError, match="invalid JSON in tool-call arguments of 'get_weather'"):
        assert_arguments_valid([call], [WEATHER], "x")
    wrong = {**call, "function": {"name": "get_weather", "arguments": '{"city": 7, "unit": "kelvin"}'}}
    with pytest.raises(AssertionError, match=r"do not validate.*city: 7 is not of type 'string'.*unit: 'kelvin'"):
        assert_arguments_valid([wrong], [WEATHER], "x")
    other = {**call, "function": {"name": "book_hotel", "arguments": "{}"}}
    with pytest.raises(AssertionError, match="not among the offered tools"):
        assert_arguments_valid([other], [WEATHER], "x")


def test_finish_reason_rules() -> None:
    c = choice("tool_call_v13")
    with pytest.raises(AssertionError, match="finish_reason 'tool_calls', expected 'stop'"):
        assert_tool_choice_obeyed(named("get_weather"), {**c["message"], "content": ""}, "tool_calls", None, "x")
    with pytest.raises(AssertionError, match="tool_choice 'none' but the model called"):
        assert_tool_choice_obeyed("none", c["message"], "tool_calls", None, "x")


def test_reasoning_checks_on_the_reference() -> None:
    c = choice("reasoning_content")
    reasoning = assert_reasoning_separated(c["message"], "ref")
    # The reference counts 4 tokens for "Let me think." with a v13 Tekken; the simulator's tokenizer agrees.
    assert count_tokens(reasoning, 13) == 4
    usage = json.loads((PROBE / "reasoning_content.json").read_text())["non_stream_body"]["usage"]
    assert assert_reasoning_tokens_agree(reasoning, usage, 13, "ref") == 4
    assert reasoning_share(usage) == 4 / 12


def test_reasoning_defects_are_named() -> None:
    leaked = {"role": "assistant", "content": "[THINK]Let me think.[/THINK]The answer is 4.", "reasoning": None}
    with pytest.raises(AssertionError, match=r"reasoning parser off: '\[THINK\]' leaked into content"):
        assert_reasoning_separated(leaked, "x")
    with pytest.raises(AssertionError, match="reasoning tokens missing from usage"):
        assert_reasoning_tokens_agree("Let me think about it.", {"completion_tokens": 20,
                                      "completion_tokens_details": {"reasoning_tokens": 0}}, 15, "x")
    with pytest.raises(AssertionError, match="no completion_tokens_details.reasoning_tokens"):
        assert_reasoning_tokens_agree("Let me think.", {"completion_tokens": 20}, 15, "x")
    legacy = {"role": "assistant", "content": "4.", "reasoning_content": "Let me think."}
    assert assert_reasoning_separated(legacy, "x") == "Let me think."


def test_streamed_and_non_streamed_compare_with_null_content() -> None:
    streamed = Assembled.from_stream(parse_sse_text((PROBE / "tool_call_v13.sse").read_text()))
    whole = Assembled.from_message(choice("tool_call_v13")["message"], "tool_calls")
    assert_stream_equals_non_stream(streamed, whole)  # content "" vs null, different ids: equal
    changed = Assembled.from_message({**choice("tool_call_v13")["message"], "tool_calls": [
        {"id": "x", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]}, "tool_calls")
    with pytest.raises(AssertionError, match=r"tool_calls\[0\].arguments: streamed"):
        assert_stream_equals_non_stream(streamed, changed)


def test_rejection_shapes_of_each_stack() -> None:
    req = httpx.Request("POST", "http://h/v1/chat/completions")
    vllm = httpx.Response(400, request=req, json={"error": {
        "message": "When using `tool_choice`, `tools` must be set. (parameter=tool_choice)",
        "type": "BadRequestError", "param": "tool_choice", "code": 400}})
    assert_rejected(vllm, 400, "When using `tool_choice`, `tools` must be set.", "x")
    litellm = httpx.Response(400, request=req, json={"error": {
        "message": 'litellm.BadRequestError: Hosted_vllmException - {"error":{"message":"`tools` must not be an '
                   'empty array."}}', "type": "invalid_request_error", "param": None, "code": "400"}})
    assert_rejected(litellm, 400, "`tools` must not be an empty array", "x")
    assert error_message({"error": "Unauthorized"}) == "Unauthorized"
    accepted = httpx.Response(200, request=req, json={"choices": []})
    with pytest.raises(AssertionError, match="accepted \\(HTTP 200"):
        assert_rejected(accepted, 400, "tools", "x")
    with pytest.raises(AssertionError, match="HTTP 500, expected 400"):
        assert_rejected(httpx.Response(500, request=req, json={"error": {"message": "boom"}}), 400, "tools", "x")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("ctype, body", [("text/html", b"<html><h1>Sign in</h1></html>"),
                                         ("application/json", b'{"id": "x", "choices": [')])
def test_non_json_answers_fail_quoting_the_body(ctype: str, body: bytes, stream: bool) -> None:
    with StubServer({"/v1/chat/completions": Scripted(200, ctype, [body])}) as srv:
        ep = Endpoint(srv.base_url, api_key="k", model="m")
        with make_openai(ep) as oai, make_httpx(ep) as http, pytest.raises(AssertionError) as info:
            ask(oai, http, {"model": "m", "messages": []}, stream)
    assert body.decode()[:20] in str(info.value) and ctype in str(info.value)
