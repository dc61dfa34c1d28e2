"""Simulator fault injection: parsing of ``--fault`` specs and the wire effect of each registered fault,
plus the legacy reasoning-field profiles (``sim.extra.reasoning_field``)."""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pytest_ml4_sim.deploy.simulator import SimServer
from pytest_ml4_sim.sim.faults import (
    FAULTS,
    ActiveFaults,
    FaultError,
    FaultSpec,
    parse_fault,
)
from test_sim_support import FAST, FAST_NO_SPEC, WEATHER_TOOL, stream_lines

CHAT = {"messages": [{"role": "user", "content": "What is 17 + 25?"}]}
TOOL_CHAT = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [WEATHER_TOOL]}


def _client(target: str, faults: tuple[str, ...] = (), overrides: dict[str, Any] | None = None
            ) -> Iterator[httpx.Client]:
    with SimServer(target, faults=faults, overrides=overrides or FAST) as s, \
            httpx.Client(base_url=s.url, timeout=30) as c:
        yield c


# --------------------------------------------------------------------------- registry and parsing
def test_parse_known_and_valued_faults() -> None:
    assert parse_fault("no_done") == FaultSpec("no_done", None)
    assert parse_fault("slow_decode=2.5") == FaultSpec("slow_decode", 2.5)
    assert parse_fault("ttft_spike").value == FAULTS["ttft_spike"].default
    active = ActiveFaults(["error_rate=0.5", "no_done"])
    assert active.has("no_done") and active.value("error_rate") == 0.5 and not active.has("tool_parser_off")


def test_unknown_fault_lists_known_ones() -> None:
    with pytest.raises(FaultError) as e:
        parse_fault("gpu_on_fire")
    assert "gpu_on_fire" in str(e.value) and "no_done" in str(e.value) and "tool_parser_off" in str(e.value)


@pytest.mark.parametrize("spec", ["no_done=1", "slow_decode=fast"])
def test_bad_fault_values_rejected(spec: str) -> None:
    with pytest.raises(FaultError):
        parse_fault(spec)


def test_every_fault_documented() -> None:
    for f in FAULTS.values():
        assert f.description and f.caught_by


def test_cli_rejects_unknown_fault() -> None:
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "pytest_ml4_sim.deploy.sim_cli", "--target", "gb300-agg", "--port", "1",
                        "--fault", "nope"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "unknown fault 'nope'" in r.stderr and "midstream_error" in r.stderr


# --------------------------------------------------------------------------- wire faults
@pytest.fixture(scope="module")
def broken() -> Iterator[httpx.Client]:
    yield from _client("gb300-agg", ("no_done", "no_usage_chunk", "bad_tool_ids", "invalid_tool_json",
                                     "reasoning_usage_missing"))


def test_no_done_and_no_usage_chunk(broken: httpx.Client) -> None:
    lines = stream_lines(broken, {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert lines[-1] != "[DONE]" and "[DONE]" not in lines
    assert all(json.loads(x)["choices"] for x in lines), "no usage-only chunk expected"


def test_bad_ids_and_invalid_json(broken: httpx.Client) -> None:
    call = broken.post("/v1/chat/completions", json=TOOL_CHAT).json()["choices"][0]["message"]["tool_calls"][0]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", call["id"])
    with pytest.raises(json.JSONDecodeError):
        json.loads(call["function"]["arguments"])


def test_reasoning_usage_missing(broken: httpx.Client) -> None:
    body = broken.post("/v1/chat/completions", json=CHAT).json()
    assert body["choices"][0]["message"]["reasoning"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


@pytest.fixture(scope="module")
def parsers_off() -> Iterator[httpx.Client]:
    yield from _client("gb300-agg", ("reasoning_parser_off", "tool_parser_off"))


def test_reasoning_parser_off_leaks_markers(parsers_off: httpx.Client) -> None:
    body = parsers_off.post("/v1/chat/completions", json=CHAT).json()
    msg = body["choices"][0]["message"]
    assert msg["reasoning"] is None and msg["content"].startswith("[THINK]") and "[/THINK]" in msg["content"]
    assert body["usage"]["completion_tokens_details"] is None


def test_tool_parser_off_returns_text(parsers_off: httpx.Client) -> None:
    body = parsers_off.post("/v1/chat/completions", json={**TOOL_CHAT, "reasoning_effort": "none"}).json()
    choice = body["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'


def test_midstream_error_event() -> None:
    for http in _client("gb300-agg", ("midstream_error",)):
        lines = stream_lines(http, {**CHAT, "stream": True})
        assert lines[-1] == "[DONE]"
        err = json.loads(lines[-2])
        assert list(err) == ["error"] and err["error"]["code"] == 500
        assert not any(json.loads(x).get("choices", [{}])[0].get("finish_reason") for x in lines[:-2])


def test_error_rate_answers_engine_error() -> None:
    for http in _client("gb300-agg", ("error_rate=1",)):
        r = http.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 500
        assert r.text == ('{"error":{"message":"The server had an error while processing your request.",'
                          '"type":"InternalServerError","param":null,"code":500}}')
        assert 'finished_reason="error"' in next(x for x in http.get("/metrics").text.splitlines()
                                             if x.startswith("vllm:request_success_total")
                                             and x.endswith(" 1.0"))


def _timed_stream(http: httpx.Client) -> tuple[float, float]:
    """(TTFT, mean gap between content chunks) of one streamed request."""
    t0 = time.monotonic()
    stamps = []
    with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True, "reasoning_effort": "none",
                                                             "min_tokens": 40, "max_tokens": 41}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"role"' not in line:
                stamps.append(time.monotonic())
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return stamps[0] - t0, sum(gaps) / len(gaps)


def test_slow_decode_and_ttft_spike() -> None:
    # Base profile: TTFT 50 ms, ITL 2 ms, one token per step; the faults add 0.5 s and multiply ITL by 8.
    base = {"sim": {"ttft_s": 0.05, "itl_ms": 2.0}, "engine": {"speculative": None}}
    for http in _client("gb300-agg", ("slow_decode=8", "ttft_spike=0.5"), overrides=base):
        ttft, itl = _timed_stream(http)
    assert ttft >= 0.5
    assert itl >= 0.9 * 8 * 0.002


def test_target_file_can_name_faults() -> None:
    """``sim.extra.faults`` in the target (or ``--set``) starts the simulator broken, like ``--fault``."""
    overrides = {**FAST, "sim": {**FAST["sim"], "extra": {"faults": ["no_done", "bad_tool_ids"]}}}
    for http in _client("gb300-agg", overrides=overrides):
        lines = stream_lines(http, {**CHAT, "stream": True})
        call = http.post("/v1/chat/completions", json=TOOL_CHAT).json()["choices"][0]["message"]["tool_calls"][0]
    assert lines[-1] != "[DONE]"
    assert call["id"].startswith("chatcmpl-tool-")


def test_target_faults_must_be_known(tmp_path: Any) -> None:
    from pytest_ml4_sim.deploy.simulator import SimServerError

    overrides = {"sim": {"extra": {"faults": ["no_such_fault"]}}}
    with pytest.raises(SimServerError, match="unknown fault 'no_such_fault'"):
        SimServer("gb300-agg", overrides=overrides, log_file=tmp_path / "e.log").start(timeout=30)


# --------------------------------------------------------------------------- legacy reasoning fields
@pytest.mark.parametrize("mode", ["reasoning_content", "both"])
def test_legacy_reasoning_field_profiles(mode: str) -> None:
    overrides = {**FAST_NO_SPEC, "sim": {**FAST_NO_SPEC["sim"], "extra": {"reasoning_field": mode}}}
    for http in _client("gb300-agg", overrides=overrides):
        msg = http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
        lines = stream_lines(http, {**CHAT, "stream": True})
    deltas = [json.loads(x)["choices"][0]["delta"] for x in lines[:-1]]
    if mode == "reasoning_content":
        assert "reasoning" not in msg and msg["reasoning_content"]
        assert any("reasoning_content" in d for d in deltas) and not any("reasoning" in d for d in deltas)
    else:
        assert msg["reasoning"] == msg["reasoning_content"] and msg["reasoning"]
        assert {"content": deltas[-2]["content"], "reasoning_content": None} == deltas[-2]
        assert any(d.get("reasoning") and d["reasoning_content"] == d["reasoning"] for d in deltas)


def test_v13_tokenizer_ignores_reasoning_effort() -> None:
    """Before tokenizer v15 the effort never reaches the model (vllm.md §3.1): same thinking for every level."""
    overrides = {**FAST_NO_SPEC, "engine": {**FAST_NO_SPEC["engine"], "tokenizer_version": 13}}
    for http in _client("gb300-agg", overrides=overrides):
        counts = {e: http.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": e}).json()["usage"]
                  ["completion_tokens_details"]["reasoning_tokens"] for e in ("none", "high")}
    assert counts["none"] == counts["high"] > 0
