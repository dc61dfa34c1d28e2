"""Simulator tool calling and reasoning (vllm.md §2-§4): tool_choice modes, parallel calls, ids, schema-valid
arguments, streamed == non-streamed, round trip, reasoning effort and the reasoning share of fixed-length output."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from pytest_ml4_sim.deploy.simulator import SimServer
from test_sim_support import FAST, WEATHER_TOOL, assemble, stream_lines

from pytest_ml4.evidence.tokenizer import CONTROL_MARKERS

FLIGHTS = {"type": "function", "function": {
    "name": "search_flights", "description": "Search flights between two cities",
    "parameters": {"type": "object", "properties": {
        "origin": {"type": "object", "properties": {"city": {"type": "string"}, "code": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False},
        "destination": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"type": "string", "enum": ["economy", "business", "first"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
        "required": ["origin", "destination", "passengers", "tags"], "additionalProperties": False}}}
ALARM = {"type": "function", "function": {
    "name": "set_alarm", "description": "Set an alarm clock",
    "parameters": {"type": "object", "properties": {
        "hour": {"type": "integer", "minimum": 0, "maximum": 23}, "minute": {"type": "integer", "minimum": 0},
        "days": {"type": "array", "items": {"type": "string", "enum": ["monday", "tuesday", "friday"]},
                 "uniqueItems": True},
        "label": {"type": "string"}}, "required": ["hour", "minute"], "additionalProperties": False}}}
TOOLS = [WEATHER_TOOL, FLIGHTS, ALARM]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ID = re.compile(r"^[A-Za-z0-9]{9}$")


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with SimServer("vr200-agg", overrides=FAST) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        yield c


def _both(http: httpx.Client, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(non-streamed message view, streamed assembly) for the same request."""
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lines = stream_lines(http, {**body, "stream": True, "stream_options": {"include_usage": True}})
    return {"choice": choice, "usage": r.json()["usage"]}, assemble(lines)


def _calls(msg: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]


@pytest.mark.parametrize("prompt,tool,expect", [
    ("What is the weather like in Paris right now?", "get_weather", {"city": "Paris"}),
    ("Search flights from Paris to Tokyo for 2 passengers in business class.", "search_flights",
     {"passengers": 2, "cabin": "business", "origin": {"city": "Paris"}, "destination": {"city": "Tokyo"}}),
    ("Set an alarm for 7:30 on monday and friday.", "set_alarm", {"hour": 7, "minute": 30,
                                                                   "days": ["monday", "friday"]}),
])
def test_auto_picks_tool_with_schema_valid_args(http: httpx.Client, prompt: str, tool: str,
                                                expect: dict[str, Any]) -> None:
    ns, st = _both(http, {"messages": [{"role": "user", "content": prompt}], "tools": TOOLS})
    calls = _calls(ns["choice"]["message"])
    assert [c[0] for c in calls] == [tool]
    args = calls[0][1]
    jsonschema.validate(args, SCHEMAS[tool])
    assert {k: args[k] for k in expect} == expect
    assert ns["choice"]["finish_reason"] == "tool_calls" and ns["choice"]["message"]["content"] is None
    assert ID.match(ns["choice"]["message"]["tool_calls"][0]["id"])
    # Streamed assembly equals the non-streamed result (ids are per request).
    assert [(c["name"], json.loads(c["arguments"])) for c in st["tool_calls"]] == calls
    assert st["finish_reason"] == "tool_calls" and ID.match(st["tool_calls"][0]["id"])
    assert st["reasoning"] == ns["choice"]["message"]["reasoning"]


def test_tool_choice_none_answers_in_text(http: httpx.Client) -> None:
    ns, st = _both(http, {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                          "tools": TOOLS, "tool_choice": "none"})
    assert "tool_calls" not in ns["choice"]["message"] and ns["choice"]["finish_reason"] == "stop"
    assert st["tool_calls"] == [] and st["content"] == ns["choice"]["message"]["content"]


def test_tool_choice_required_calls_even_unmatched(http: httpx.Client) -> None:
    ns, st = _both(http, {"messages": [{"role": "user", "content": "Say hello to the team."}], "tools": TOOLS,
                          "tool_choice": "required"})
    msg = ns["choice"]["message"]
    assert len(msg["tool_calls"]) == 1 and msg["content"] == ""
    name, args = _calls(msg)[0]
    jsonschema.validate(args, SCHEMAS[name])
    assert len(st["tool_calls"]) == 1


def test_named_tool_choice_gives_stop_and_empty_content(http: httpx.Client) -> None:
    ns, st = _both(http, {"messages": [{"role": "user", "content": "Wake me at 6:15"}], "tools": TOOLS,
                          "tool_choice": {"type": "function", "function": {"name": "set_alarm"}}})
    assert ns["choice"]["finish_reason"] == "stop" and ns["choice"]["message"]["content"] == ""
    assert _calls(ns["choice"]["message"]) == [("set_alarm", {"hour": 6, "minute": 15})]
    assert st["finish_reason"] == "stop"


def test_parallel_calls_and_parallel_false(http: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "What is the weather in Paris and in Rome?"}],
            "tools": [WEATHER_TOOL]}
    ns, st = _both(http, body)
    assert [a["city"] for _, a in _calls(ns["choice"]["message"])] == ["Paris", "Rome"]
    assert [json.loads(c["arguments"])["city"] for c in st["tool_calls"]] == ["Paris", "Rome"]
    ids = [c["id"] for c in ns["choice"]["message"]["tool_calls"]]
    assert len(set(ids)) == 2 and all(ID.match(i) for i in ids)
    ns1, st1 = _both(http, {**body, "parallel_tool_calls": False})
    assert [a["city"] for _, a in _calls(ns1["choice"]["message"])] == ["Paris"]
    assert [json.loads(c["arguments"])["city"] for c in st1["tool_calls"]] == ["Paris"]


def test_round_trip_uses_tool_result(http: httpx.Client) -> None:
    first = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": TOOLS}).json()
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages = [{"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature_c": 18, "sky": "sunny"}'}]
    ns, st = _both(http, {"messages": messages, "tools": TOOLS})
    content = ns["choice"]["message"]["content"]
    assert "18" in content and "sunny" in content and ns["choice"]["finish_reason"] == "stop"
    assert st["content"] == content


def test_no_control_tokens_reach_the_client(http: httpx.Client) -> None:
    lines = stream_lines(http, {"messages": [{"role": "user", "content": "Weather in Paris and Rome?"}],
                                "tools": TOOLS, "stream": True, "reasoning_effort": "high"})
    joined = "".join(lines)
    assert not any(m in joined for m in CONTROL_MARKERS)


# --------------------------------------------------------------------------- reasoning
def _reasoning_tokens(http: httpx.Client, effort: str | None) -> tuple[int, dict[str, Any]]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "What is 12 * 11?"}]}
    if effort is not None:
        body["reasoning_effort"] = effort
    r = http.post("/v1/chat/completions", json=body).json()
    return r["usage"]["completion_tokens_details"]["reasoning_tokens"], r["choices"][0]["message"]


def test_effort_levels_order_reasoning_length(http: httpx.Client) -> None:
    counts = {e: _reasoning_tokens(http, e)[0] for e in ("none", "minimal", "low", "medium", "high", "xhigh", "max")}
    assert counts["none"] == 0
    assert 0 < counts["low"] <= counts["medium"] < counts["high"] < counts["xhigh"] < counts["max"]
    _, msg = _reasoning_tokens(http, "none")
    assert msg["reasoning"] is None and "132" in msg["content"]


def test_reasoning_stream_equals_non_stream(http: httpx.Client) -> None:
    ns, st = _both(http, {"messages": [{"role": "user", "content": "What is 12 * 11?"}], "reasoning_effort": "high"})
    assert st["reasoning"] == ns["choice"]["message"]["reasoning"]
    assert st["content"] == ns["choice"]["message"]["content"]
    assert st["usage"]["completion_tokens_details"]["reasoning_tokens"] == \
        ns["usage"]["completion_tokens_details"]["reasoning_tokens"]


@pytest.mark.parametrize("prompt", ["Explain step by step how a KV cache speeds up decoding.", "What is 123 + 456?"])
def test_reasoning_share_of_fixed_length_output(http: httpx.Client, prompt: str) -> None:
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": prompt}],
                                                 "min_tokens": 1024, "max_tokens": 1024}).json()
    u = r["usage"]
    assert u["completion_tokens"] == 1024 and r["choices"][0]["finish_reason"] == "length"
    share = u["completion_tokens_details"]["reasoning_tokens"] / u["completion_tokens"]
    assert 0.50 <= share <= 0.68, share


def test_include_reasoning_false_hides_text_not_tokens(http: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "What is 12 * 11?"}], "reasoning_effort": "high",
            "include_reasoning": False}
    ns, st = _both(http, body)
    assert ns["choice"]["message"]["reasoning"] is None and st["reasoning"] == ""
    assert ns["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    assert "132" in ns["choice"]["message"]["content"] and st["content"] == ns["choice"]["message"]["content"]


def test_thinking_token_budget_caps_reasoning(http: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "What is 12 * 11?"}], "reasoning_effort": "max"}
    full = http.post("/v1/chat/completions", json=body).json()["usage"]["completion_tokens_details"]
    capped = http.post("/v1/chat/completions", json={**body, "thinking_token_budget": 5}).json()
    assert full["reasoning_tokens"] > 5
    assert capped["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5
    assert "132" in capped["choices"][0]["message"]["content"]
