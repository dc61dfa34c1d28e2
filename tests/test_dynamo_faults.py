"""Dynamo-relevant simulator faults on the real frontend: each one shows up where a client (and the suites'
checks) sees it. One 1-worker agg deployment per fault (about 10 s each on two cores).

Faults the Dynamo frontend itself owns in a real deployment (``bad_tool_ids``, ``no_done``, ``no_usage_chunk``,
``reasoning_usage_missing``: ids, stream framing and usage are rendered by the frontend) have no Dynamo form.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_ml4_sim.deploy.dynamo import DynamoSim

from pytest_ml4.client.stream_probe import parse_sse_lines
from pytest_ml4.runtime.installed import ToolMissing, dynamo_python
from pytest_ml4.target.model import load_target

try:
    dynamo_python()
except ToolMissing as err:
    pytest.skip(str(err), allow_module_level=True)

AGG = load_target("gb300-agg")
MODEL = AGG.serving.served_model_name
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOL_ASK = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [WEATHER]}
THINK_ASK = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "reasoning_effort": "high"}


def _post(dsim: DynamoSim, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(dsim.base_url + "/chat/completions", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json()["choices"][0])


def _tool_parser_off(dsim: DynamoSim) -> None:
    choice = _post(dsim, TOOL_ASK)
    assert not choice["message"].get("tool_calls") and "[TOOL_CALLS]" in choice["message"]["content"], choice


def _tool_parser_hermes(dsim: DynamoSim) -> None:
    # The worker registers hermes: the real frontend's hermes parser leaves the call at the start of content.
    choice = _post(dsim, TOOL_ASK)
    assert not choice["message"].get("tool_calls"), choice
    assert choice["message"]["content"].startswith("[TOOL_CALLS]"), choice


def _reasoning_parser_off(dsim: DynamoSim) -> None:
    msg = _post(dsim, THINK_ASK)["message"]
    # No reasoning field (the reasoning suite's "no reasoning field" check). Without a reasoning parser the frontend
    # does not pass reasoning_effort on, so the bridged model does not think at all.
    assert "reasoning_content" not in msg and "reasoning" not in msg, msg


def _invalid_tool_json(dsim: DynamoSim) -> None:
    msg = _post(dsim, TOOL_ASK)["message"]
    calls = msg.get("tool_calls") or []
    # 1.6.1 drops a call whose JSON does not parse (content null, no tool_calls): no valid call reaches the client.
    for call in calls:
        with pytest.raises(ValueError):
            json.loads(call["function"]["arguments"])
    assert calls or not msg["content"], msg


def _midstream_error(dsim: DynamoSim) -> None:
    body = {"model": MODEL, "messages": THINK_ASK["messages"], "max_tokens": 100, "min_tokens": 100, "stream": True}
    with httpx.stream("POST", dsim.base_url + "/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        result = parse_sse_lines(list(r.iter_lines()), request=body)
    assert result.error_events and result.content, result.describe()


def _error_rate(dsim: DynamoSim) -> None:
    codes = {httpx.post(dsim.base_url + "/chat/completions", timeout=60,
                        json={"model": MODEL, **THINK_ASK, "max_tokens": 5}).status_code for _ in range(6)}
    assert 500 in codes, codes


def _guided_decoding_ignored(dsim: DynamoSim) -> None:
    # 1.6.1 sends tool_choice required as guided_decoding.json; an engine that ignores it answers a prompt no
    # tool matches with text, so no call comes back although one was required.
    msg = _post(dsim, {"messages": [{"role": "user", "content": "Say hello to the team."}], "tools": [WEATHER],
                       "tool_choice": "required"})["message"]
    assert not msg.get("tool_calls") and msg["content"], msg


def _metrics_unreadable(dsim: DynamoSim) -> None:
    # The worker's engine-metrics callback fails: the runtime still answers its system port, without vllm:*.
    (url,) = dsim.worker_metrics_urls["worker"]
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200 and "vllm:" not in r.text, r.text[:500]


CASES = {"tool_parser_off": _tool_parser_off, "tool_parser_hermes": _tool_parser_hermes, "guided_decoding_ignored": _guided_decoding_ignored,
         "metrics_unreadable": _metrics_unreadable, "reasoning_parser_off": _reasoning_parser_off,
         "invalid_tool_json": _invalid_tool_json, "midstream_error": _midstream_error,
         "error_rate=1.0": _error_rate}


@pytest.mark.parametrize("fault", sorted(CASES))
def test_fault_is_visible_through_the_real_frontend(fault: str, tmp_path: Path) -> None:
    with DynamoSim(AGG, faults=(fault,), agg_workers=1, log_file=tmp_path / "engine.log") as dsim:
        CASES[fault](dsim)
