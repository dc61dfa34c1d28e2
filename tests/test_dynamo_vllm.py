"""Real Dynamo 1.6.1 vLLM workers behind the real frontend (``--sim-engine vllm`` on the Dynamo targets).

The unit tests need nothing installed. ``test_real_worker_deployment_serves`` starts the real deployment with ONE
``python -m dynamo.vllm`` worker (vr200-agg's count): about 3.7 GiB and one to three minutes here, the cheap proof
that runs in CI; the suites on the real workers (several workers, minutes each) are nightly
(``test_suites_on_real_workers``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from pytest_ml4_sim.deploy.dynamo import DynamoStartError
from pytest_ml4_sim.deploy.real_dynamo import (
    RealDynamoDeployment,
    group_members,
)
from pytest_ml4_sim.deploy.worker_plan import WorkerPlan, declared_workers, plan_workers
from pytest_ml4_sim.realdynamo.scripted import guided_text, tool_choice_from_schema

from pytest_ml4.checks.verdict import EXIT_NOT_JUDGED
from pytest_ml4.datafile import DataFileError
from pytest_ml4.evidence.worker_engine import WorkerEngine
from pytest_ml4.runtime.installed import (
    DYNAMO_VLLM_ENGINE_VERSION,
    ToolMissing,
    dynamo_vllm_python,
)
from pytest_ml4.stacks.dynamo_versions import load_table, model_output
from pytest_ml4.target.model import load_target

REPO = Path(__file__).resolve().parents[1]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def _installed() -> bool:
    try:
        dynamo_vllm_python()
    except ToolMissing:
        return False
    return True


needs_real_worker = pytest.mark.skipif(not _installed(), reason="needs scripts/install.d/65-dynamo-vllm.sh")


# ----------------------------------------------------------------------------------------- memory plan
def test_plan_keeps_the_declared_workers_when_memory_allows() -> None:
    plan = plan_workers({"worker": 2}, free_gib=20.0)
    assert plan.started == {"worker": 2} and not plan.reduced and plan.note() is None


def test_plan_reduces_disagg_to_one_prefill_and_one_decode_and_says_so() -> None:
    plan = plan_workers({"prefill": 2, "decode": 2}, free_gib=10.0)
    assert plan.started == {"prefill": 1, "decode": 1}
    assert plan.note() == ("reduced to the memory here: prefill 1 of 2, decode 1 of 2 real dynamo.vllm workers "
                           "(3.7 GiB each, 10.0 GiB available)")


def test_not_enough_memory_is_one_line_before_anything_starts() -> None:
    target = load_target("gb300-agg")
    with pytest.raises(DynamoStartError) as err:
        RealDynamoDeployment(target, free_gib=4.0)
    message = str(err.value)
    assert "\n" not in message
    assert message == ("not enough memory for real dynamo.vllm workers: 1 worker(s) (worker) need 5.7 GiB "
                       "(3.7 GiB each + 2.0 GiB reserve), MemAvailable is 4.0 GiB")


def test_declared_workers_per_role() -> None:
    assert declared_workers(load_target("gb300-agg")) == {"worker": 2}
    assert declared_workers(load_target("gb300-disagg")) == {"prefill": 2, "decode": 2}
    assert isinstance(plan_workers({"worker": 1}, 8.0), WorkerPlan)


# ----------------------------------------------------------------------------------------- the scripted model
def test_tool_choice_read_back_from_the_guided_schema_1_6_1_sends() -> None:
    required = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": []}}
    assert tool_choice_from_schema(None, [WEATHER]) == "auto"
    assert tool_choice_from_schema(required, [WEATHER]) == "required"
    named = tool_choice_from_schema(WEATHER["function"]["parameters"], [WEATHER])
    assert named == {"type": "function", "function": {"name": "get_weather"}}


def test_guided_output_is_what_the_grammar_admits() -> None:
    calls = [("get_weather", '{"city": "Paris"}')]
    assert json.loads(guided_text(calls, "required")) == [{"name": "get_weather", "parameters": {"city": "Paris"}}]
    assert json.loads(guided_text(calls, {"type": "function", "function": {"name": "get_weather"}})) == {"city": "Paris"}


def test_emulation_lives_in_the_versions_row() -> None:
    assert model_output("1.6.1") == {"tool_form": "v11", "think_before_tool_call": True}
    assert model_output("1.7.0-mistral-large-4-dev.1") == {"tool_form": "legacy", "think_before_tool_call": False}


def test_bad_emulation_row_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "versions.yaml"
    bad.write_text("versions:\n  '9.9':\n    public: true\n    mistral_v11_tool_calls_parsed: true\n"
                   "    mistral_legacy_tool_calls_parsed: true\n    mistral_parser_v2: true\n"
                   "    reasoning_split_needs_effort: true\n    status: estimate\n    source: a test\n"
                   "    reasoning_efforts: [high]\n    guided_json_refused_keywords: []\n"
                   "    emulation: {tool_form: hermes}\n")
    with pytest.raises(DataFileError, match=r"line 12: field 'versions\.9\.9\.emulation\.tool_form': Input should be "
                                           r"'legacy' or 'v11'"):
        load_table(bad)


# ----------------------------------------------------------------------------------------- the real deployment
def _tiny(name: str):
    from pytest_ml4_sim.deploy.real_vllm import tiny_overrides

    from pytest_ml4.target.model import deep_merge

    return load_target(name, overrides=deep_merge(tiny_overrides(), {"engine": {"version": DYNAMO_VLLM_ENGINE_VERSION}}))


@needs_real_worker
@pytest.mark.nightly   # CI's one real worker is the conformance test's (tests/test_dynamo_vllm_conformance.py)
def test_real_worker_deployment_serves(tmp_path: Path) -> None:
    """vr200-agg (one worker): real dynamo.vllm serves the scripted model through the real frontend; tool calls
    of the emulated 1.7.0 row parse; the worker's own vllm:* metrics; stop leaves no process of its group."""
    target = _tiny("vr200-agg")
    dep = RealDynamoDeployment(target, log_file=tmp_path / "engine.log")
    groups: list[int] = []
    try:
        dep.start(timeout=900)
        worker = dep.workers[0]
        groups.append(worker.pid or -1)
        assert "dynamo.vllm" in worker.command and worker.instance_id is not None
        model = target.serving.served_model_name
        chat = httpx.post(dep.base_url + "/chat/completions", timeout=300,
                          json={"model": model, "messages": [{"role": "user", "content": "Hello, who are you?"}],
                                "max_tokens": 40}).json()
        assert chat["choices"][0]["message"]["content"], chat
        tools = httpx.post(dep.base_url + "/chat/completions", timeout=300,
                           json={"model": model, "tools": [WEATHER], "max_tokens": 100,
                                 "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}).json()
        calls = tools["choices"][0]["message"].get("tool_calls") or []
        assert [c["function"]["name"] for c in calls] == ["get_weather"], tools
        metrics = httpx.get(worker.metrics_url, timeout=10).text
        assert "vllm:cache_config_info" in metrics
        assert "CPU KV cache size" in worker.log_file.read_text(errors="replace")
        record = WorkerEngine.of(dep.info())
        assert record is not None and record.dynamo_vllm == "1.6.1" and record.vllm == "0.31.0"
        assert record.reduced is None
    finally:
        dep.stop()
    assert all(not group_members(g) for g in groups), "a worker's EngineCore/Worker outlived the stop"


@needs_real_worker
def test_worker_failing_to_start_gives_its_command_and_log_tail(tmp_path: Path) -> None:
    """The worker process dies at start (here an interpreter that prints an error and exits): one error with the
    worker, its exit code, its command and its log tail; the real frontend that did start is stopped."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'RuntimeError: Engine core initialization failed (test)'\nexit 3\n")
    fake.chmod(0o755)
    dep = RealDynamoDeployment(_tiny("vr200-agg"), log_file=tmp_path / "engine.log")
    dep.python = fake      # the workers' interpreter only: the frontend keeps the real one
    with pytest.raises(DynamoStartError) as err:
        dep.start(timeout=120)
    message = str(err.value)
    assert message.startswith("dynamo.vllm worker worker #0 exited with code 3 before becoming healthy on http://")
    assert f"command: {fake} -m dynamo.vllm --model" in message
    assert "RuntimeError: Engine core initialization failed (test)" in message
    assert not dep.frontend.alive()


SUITE_RUN = ["-m", "smoke or tools or reasoning or osl or kv"]


@pytest.mark.nightly
@needs_real_worker
@pytest.mark.parametrize("target", ["gb300-agg", "vr200-agg"])
def test_suites_on_real_workers(target: str, tmp_path: Path) -> None:
    """The functional suites on the real deployment (gb300-agg: two workers, ~8 GiB, several minutes): nightly, too
    heavy for .ci/run. Every check passes but one: whether the tools' schemas are accepted under guided decoding is
    not judged, because the workers are 1.6.1 (whose grammar refuses ``uniqueItems``) emulating the declared
    1.7.0 row (which refuses nothing): neither a pass nor the 1.6.1 engine's failure would be the truth about 1.7.0."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "pytest", "suites", "--target", target, "--sim", "--sim-engine", "vllm",
           *SUITE_RUN, "-p", "no:cacheprovider", "-q", "--ml4-run-dir", str(run_dir)]
    proc = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=3000,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    # Not judged checks (below) make the run's exit status the not-judged one, never 0.
    assert proc.returncode == EXIT_NOT_JUDGED, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    versions = summary["versions"]
    assert versions["dynamo_worker"] == "dynamo.vllm 1.6.1" and versions["dynamo_worker_vllm"] == "0.31.0"
    assert "1.7.0-mistral-large-4-dev.1 emulated on 1.6.1" in versions["dynamo_emulation"]
    outcomes = {c["nodeid"]: c for c in summary["checks"]}
    assert not [n for n, c in outcomes.items() if c["outcome"] in ("failed", "broken")]
    # Also not judged here, for reasons of their own: the reasoning share (the baseline file is the simulator's).
    schema = [outcomes[f"suites/test_tools.py::test_tool_schemas_are_accepted_under_guided_decoding[{v}]"]
              for v in ("nonstream", "stream")]
    assert all(c["outcome"] == "not_judged" and "their guided-JSON grammar refuses ['uniqueItems']" in c["message"]
               for c in schema), schema


@pytest.mark.nightly
@needs_real_worker
def test_declared_1_6_1_without_emulation_fails_tools_naming_the_parser(tmp_path: Path) -> None:
    """Dynamo 1.6.1 declared, no emulation (--ml4-no-dynamo-bridge): the real worker emits Mistral Large 4's v11 tool
    form, the real 1.6.1 `mistral` parser drops it, and the tools suite fails naming that parser. Nightly: it starts
    its own real worker (minutes here)."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "pytest", "suites", "--target", "vr200-agg", "--sim", "--sim-engine", "vllm",
           "--ml4-no-dynamo-bridge", "-m", "tools", "-p", "no:cacheprovider", "-q", "--ml4-run-dir", str(run_dir)]
    proc = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=3000,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "dynamo_emulation" not in summary["versions"]
    failed = [c for c in summary["checks"] if c["outcome"] == "failed"]
    assert any("1.6.1's `mistral` tool parser" in c["message"] for c in failed), failed
    schema = [c for c in failed if "test_tool_schemas_are_accepted_under_guided_decoding" in c["nodeid"]]
    assert len(schema) == 2 and all("refuses the keyword `uniqueItems` (tool set_alarm; engine log: "
                                    in c["message"] for c in schema), schema


def test_frontend_tokenizer_with_another_id_for_a_parser_token_is_refused(tmp_path: Path) -> None:
    from pytest_ml4_sim.deploy.dynamo_model import PARSER_TOKENS
    from pytest_ml4_sim.realdynamo.model import check_same_ids

    from pytest_ml4.evidence.tokenizer import SPECIAL_TOKENS

    added = [{"content": m, "id": SPECIAL_TOKENS.index(m)} for m in PARSER_TOKENS]
    vocab = {f"t{i}": i for i in range(40)}
    (tmp_path / "tekken.json").write_text(json.dumps({"config": {"default_vocab_size": 40}}))
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": added, "model": {"vocab": vocab}}))
    check_same_ids(tmp_path)   # same ids, same size: accepted
    added[0]["id"] = 39
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": added, "model": {"vocab": vocab}}))
    with pytest.raises(SystemExit, match=r"tokenizer\.json: \[THINK\] has id 39, the worker's tekken\.json 22$"):
        check_same_ids(tmp_path)


def test_stopped_group_leaves_no_live_member() -> None:
    """The group stop's bookkeeping on a real process group: a shell and its child, killed as a group."""
    from pytest_ml4_sim.deploy.real_dynamo import wait_group_gone

    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(group_members(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(group_members(proc.pid)) >= 2
        os.killpg(proc.pid, 9)
        proc.wait(5)
        assert wait_group_gone(proc.pid, 10.0) == []
    finally:
        if proc.poll() is None:
            proc.kill()
