"""The Dynamo bridge option: bad combinations are usage errors; with the bridge off the embedded deployment does
what public Dynamo 1.6.1 does with Mistral Large 4's ``[THINK]...[/THINK][TOOL_CALLS]name[ARGS]`` output (no
tool call; the markup stays in content; shared/reference/real-dynamo.md), and the target then says ``serving.dynamo_version: "1.6.1"``."""

from __future__ import annotations

import json

import pytest
from pytest_ml4_sim.sim.dynamo_bridge import BRIDGED, GUIDED, UNBRIDGED, tool_calls_text

from pytest_ml4.runtime.installed import ToolMissing, dynamo_python


def test_legacy_form_is_one_json_array_and_v11_is_per_call() -> None:
    calls = [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Berlin"}')]
    legacy = tool_calls_text(calls, BRIDGED.tool_form)
    assert legacy[0] == "[TOOL_CALLS]" and json.loads(legacy[1]) == [
        {"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Berlin"}}]
    assert tool_calls_text(calls, UNBRIDGED.tool_form) == [
        "[TOOL_CALLS]", "get_weather", "[ARGS]", '{"city": "Paris"}', "[TOOL_CALLS]", "get_weather", "[ARGS]",
        '{"city": "Berlin"}']
    # Invalid arguments (the invalid_tool_json fault) stay invalid in the legacy form.
    broken = tool_calls_text([("f", '{"a": 1,}')], BRIDGED.tool_form)[1]
    with pytest.raises(ValueError):
        json.loads(broken)


def test_guided_form_is_what_the_frontends_required_schema_allows() -> None:
    """``tool_choice: required`` reaches the worker as the guided-decoding schema recorded from the real 1.6.1
    frontend; the worker's output must satisfy it (no ``[TOOL_CALLS]`` token, ``parameters``), else 1.6.1 streams
    two finish chunks (the same capture, BEFORE/AFTER)."""
    import jsonschema
    from checkout import FIXTURES_DIR

    text = (FIXTURES_DIR / "transcripts/dynamo-1.6.1/ml4-90_required_stream_guided.txt").read_text()
    schema = json.loads(text.split("=== guided_decoding\n", 1)[1].split("\n", 1)[0])["json"]
    calls = [("get_weather", '{"city": "Paris"}'), ("get_time", '{"city": "Berlin"}')]
    (array,) = tool_calls_text(calls, GUIDED)
    jsonschema.validate(json.loads(array), schema)
    with pytest.raises(jsonschema.ValidationError):  # the legacy form is outside the schema
        jsonschema.validate(json.loads(tool_calls_text(calls, BRIDGED.tool_form)[1]), schema)
    before, after = text.split("=== BEFORE", 1)[1].split("=== AFTER", 1)
    assert (before.count('"finish_reason":"tool_calls"'), after.count('"finish_reason":"tool_calls"')) == (2, 1)


@pytest.mark.parametrize("args, words", [
    (["--target", "gb300-agg", "--ml4-no-dynamo-bridge"], "needs --sim"),
    (["--target", "rtxpro6000-tp8", "--sim", "--ml4-no-dynamo-bridge"], "not served by Dynamo"),
])
def test_bad_combinations_are_usage_errors(pytester: pytest.Pytester, args: list[str], words: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--ml4-no-dynamo-bridge*{words}*"])


BRIDGE_OFF = """
import httpx

def test_public_1_6_1(ml4_target, ml4_endpoint):
    assert ml4_target.serving.dynamo_version == "1.6.1"
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    r = httpx.post(ml4_endpoint.base_url + "/chat/completions", timeout=60, json={
        "model": ml4_endpoint.model, "tools": [tool],
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}]})
    choice = r.json()["choices"][0]
    # 1.6.1 parses neither: without reasoning_effort [THINK] stays in content and the v11 call is not a
    # tool call (python-worker transcript 30_auto_think_tool_unary_noeffort: the same content, finish stop).
    assert choice["message"].get("tool_calls") is None and choice["finish_reason"] == "stop", choice
    assert choice["message"]["content"].startswith("[THINK]"), choice
    assert '[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}' in choice["message"]["content"], choice
"""


def test_bridge_off_behaves_as_public_1_6_1(pytester: pytest.Pytester) -> None:
    try:
        dynamo_python()
    except ToolMissing as err:
        pytest.skip(str(err))
    pytester.makepyfile(BRIDGE_OFF)
    result = pytester.runpytest("--target", "gb300-agg", "--sim", "--ml4-no-dynamo-bridge", "-p", "no:randomly",
                                "--ml4-set", "topology.workers=1")
    result.assert_outcomes(passed=1)
    assert any("real dynamo.frontend 1.6.1" in line and "bridge off" in line for line in result.outlines)
