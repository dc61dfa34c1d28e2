"""Every replica answers right (suites/test_replicas.py, pytest_ml4/evidence/replicas.py, pytest_ml4/checks/replicas.py) and
the one-worker faults (``only_worker=K``, harness/pytest_ml4_sim/sim/faults.py).

The verdict's rules are proven on replies built here; the gate itself on the REAL Dynamo 1.6.1 frontend over the
simulated workers (two deployments, about 10 s each): one worker of two with the answer faults fails naming it
while the suites' own verdicts pass on the other, and stripped routing evidence leaves the gate not judged. The kill
matrix (fixtures/killmatrix/gb300-agg.yaml, kills ``one_worker_*``) runs the suite file itself under each fault.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import yaml
from pytest_ml4_sim.sim.faults import ONE_WORKER_FAULTS, ActiveFaults

from pytest_ml4.checks.chat import Answer, ChatSession, user
from pytest_ml4.checks.codes import Violation
from pytest_ml4.checks.reasoning import assert_reasoned_answer
from pytest_ml4.checks.replicas import assert_every_worker_answers_right, judge_with
from pytest_ml4.checks.suite_data import reasoning_data, tools_data
from pytest_ml4.checks.tools import ToolChat
from pytest_ml4.checks.verdict import NotJudged
from pytest_ml4.control.dynamo import PIN_HEADER, PREFILL_PIN_HEADER
from pytest_ml4.datafile import DataFileError
from pytest_ml4.evidence.replicas import (
    Probe,
    Reach,
    Reply,
    Route,
    WorkerRef,
    pinned_routes,
    probe_specs,
    reach_every_worker,
    sender,
)
from pytest_ml4.plugin.markers import _replicas
from pytest_ml4.stacks.dynamo_versions import VERSIONS_FILE, load_table
from pytest_ml4.target.model import load_target

AGG = load_target("gb300-agg")
FAST = {"sim": {"ttft_s": 0.005, "itl_ms": 0.2}}


# ------------------------------------------------------------------------------------------------ the fault
def test_only_worker_confines_the_answer_faults_to_worker_k() -> None:
    faults = ActiveFaults(["only_worker=1", *ONE_WORKER_FAULTS, "slow_decode=2"])
    on_k, elsewhere = faults.for_worker(1), faults.for_worker(0)
    assert all(on_k.has(f) for f in ONE_WORKER_FAULTS)
    assert not any(elsewhere.has(f) for f in ONE_WORKER_FAULTS)
    assert elsewhere.has("slow_decode") and elsewhere.value("slow_decode") == 2.0   # not a one-worker fault
    plain = ActiveFaults(["tool_parser_off"])
    assert plain.for_worker(0).has("tool_parser_off") and plain.for_worker(1).has("tool_parser_off")


def test_only_worker_is_refused_where_there_is_one_engine(capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_ml4_sim.deploy.sim_cli import target_and_faults

    args = argparse.Namespace(target="rtxpro6000-tp8", overrides=[], fault=["only_worker=0", "tool_parser_off"])
    with pytest.raises(SystemExit):
        target_and_faults(args)
    assert "fault only_worker acts on one worker of a Dynamo deployment; target rtxpro6000-tp8 runs one engine" \
        in capsys.readouterr().err


def test_only_worker_must_name_a_worker_that_starts() -> None:
    from pytest_ml4_sim.deploy.dynamo import DynamoStartError, refuse_idle_only_worker

    refuse_idle_only_worker(["only_worker=1"], [("worker", []), ("worker", [])])
    with pytest.raises(DynamoStartError, match=r"only_worker=2: no such worker; the deployment starts 2 aggregated worker\(s\)"):
        refuse_idle_only_worker(["only_worker=2"], [("worker", []), ("worker", [])])


# ------------------------------------------------------------------------------------------------ routes, markers, table
def test_pinned_routes_put_every_worker_of_each_role_on_a_route() -> None:
    agg = pinned_routes({"worker": [7, 9]})
    assert [r.headers for r in agg] == [((PIN_HEADER, "7"),), ((PIN_HEADER, "9"),)]
    disagg = pinned_routes({"prefill": [1, 2, 3], "decode": [8]})
    assert [dict(r.headers) for r in disagg] == [{PREFILL_PIN_HEADER: str(p), PIN_HEADER: "8"} for p in (1, 2, 3)]
    assert {w for r in disagg for w in r.pinned} == {WorkerRef("prefill", p) for p in (1, 2, 3)} | {
        WorkerRef("decode", 8)}


def test_the_check_applies_where_a_role_has_two_workers() -> None:
    mark = pytest.mark.replicas("largest", 2).mark
    assert _replicas(AGG, mark, True) is None
    assert _replicas(load_target("gb300-disagg"), mark, True) is None
    assert _replicas(load_target("vr200-agg"), mark, True) == \
        "vr200-agg has 1 aggregated worker(s) (agg topology); this check needs 2"


def test_pins_workers_is_an_optional_boolean_of_a_versions_row(tmp_path: Any) -> None:
    raw = yaml.safe_load(VERSIONS_FILE.read_text())["versions"]["1.6.1"]
    absent, bad = tmp_path / "absent.yaml", tmp_path / "bad.yaml"  # two files: load_table caches by path
    absent.write_text(yaml.safe_dump({"versions": {"x": {k: v for k, v in raw.items() if k != "pins_workers"}}}))
    assert load_table(absent)["x"].pins_workers is True
    bad.write_text(yaml.safe_dump({"versions": {"x": {**raw, "pins_workers": "no"}}}))
    with pytest.raises(DataFileError, match=r"field 'versions.x.pins_workers': Input should be a valid boolean"):
        load_table(bad)


# ------------------------------------------------------------------------------------------------ the verdict's rules
PROBE = Probe("p-nonstream", "reasoning", {}, False)
W0, W1 = WorkerRef("worker", 100), WorkerRef("worker", 200)


def _reply(worker: WorkerRef | None, text: str = "ok", pinned: WorkerRef | None = None) -> Reply:
    nvext = None if worker is None else {"worker_id": {"prefill_worker_id": worker.instance_id,
                                                      "decode_worker_id": worker.instance_id}}
    return Reply(PROBE, Route(pinned=(pinned,) if pinned else ()), Answer(False, {"content": text}, "stop", None),
                 nvext=nvext)


def _judge(reply: Reply) -> str | None:
    return None if reply.answer.content == "ok" else f"wrong answer {reply.answer.content!r}"


def _reach(*replies: Reply, pinned: bool = True) -> Reach:
    return Reach({"worker": [100, 200]}, list(replies), pinned, [PROBE])


def test_one_worker_wrong_fails_naming_it_and_what_it_answered() -> None:
    with pytest.raises(Violation) as err:
        assert_every_worker_answers_right(_reach(_reply(W0), _reply(W1, "bad")), PROBE.name, _judge)
    assert err.value.code == "replica.worker_answers_wrong"
    assert "worker 200 answered wrong: wrong answer 'bad' (answered right: worker 100)" in err.value.message


def test_answers_are_the_evidence_s_worker_not_the_pin_s() -> None:
    # Both requests were pinned to W1; the deployment ignored the pins and W0 answered both: W1 is not reached.
    reach = _reach(_reply(W0, pinned=W1), _reply(W0, pinned=W1))
    with pytest.raises(NotJudged, match=r"worker 200 listed by /health never answered it \(pinned with the worker "
                                        r"headers, the answers named other workers: the pins were not honoured"):
        assert_every_worker_answers_right(reach, PROBE.name, _judge)


def test_stripped_evidence_is_not_judged_unless_an_answer_is_wrong() -> None:
    with pytest.raises(NotJudged, match=r"2 of 2 answers: the answers carry no nvext.worker_id"):
        assert_every_worker_answers_right(_reach(_reply(None), _reply(None)), PROBE.name, _judge)
    with pytest.raises(Violation) as err:
        assert_every_worker_answers_right(_reach(_reply(None), _reply(None, "bad")), PROBE.name, _judge)
    assert err.value.code == "replica.wrong_answer_unattributed"


def test_every_worker_right_passes_with_a_line_per_worker() -> None:
    lines = assert_every_worker_answers_right(_reach(_reply(W0), _reply(W1)), PROBE.name, _judge)
    assert lines == ["worker 100: 1 answer(s) right", "worker 200: 1 answer(s) right"]


# ------------------------------------------------------------------------------------------------ on the real frontend
def _deployment(faults: list[str]) -> Any:
    from pytest_ml4_sim.deploy.dynamo import DynamoSim

    from pytest_ml4.runtime.installed import ToolMissing, dynamo_python

    try:
        dynamo_python()
    except ToolMissing as err:
        pytest.skip(str(err))
    return DynamoSim(AGG, overrides=FAST, faults=faults)


def _clients(base_url: str) -> tuple[Any, Any, Any]:
    from pytest_ml4.client.endpoint import Endpoint, make_httpx, make_openai

    ep = Endpoint(base_url, model=AGG.serving.served_model_name)
    return ep, make_openai(ep), make_httpx(ep)


def _judge_on(oai: Any, http: Any) -> Any:
    from pytest_ml4.evidence.recount import TokenCounter

    chat = ToolChat(oai, http, AGG.serving.served_model_name, {}).on(AGG, tools_data().conventions, None, None)
    return judge_with(chat, TokenCounter(None, AGG.engine.tokenizer_version))


def test_one_bad_worker_of_two_fails_the_gate_naming_it_while_the_suites_pass_on_the_good_one() -> None:
    from pytest_ml4.client.endpoint import make_httpx

    """gb300-agg, worker #1 with three one-worker faults: the gate fails each faulty probe naming worker #1's
    instance id and passes the others; the tools and reasoning suites' own checks, pinned to worker #0 (the router
    keeping their requests there), pass. Running the suite files themselves under the fault proves nothing either
    way: the KV router sends a request to the worker holding its prefix, else by load, and between idle workers
    its choice varies (measured: six identical requests went to workers 1, 1, 0, 1, 0, 0)."""
    with _deployment(["only_worker=1", "tool_parser_off", "reasoning_parser_off", "min_tokens_ignored"]) as dsim:
        ep, oai, http = _clients(dsim.base_url)
        good, bad = dsim.workers[0].instance_id, dsim.workers[1].instance_id
        health = http.get(ep.root_url + "/health").json()
        reach = reach_every_worker(health, "agg", probe_specs(ep.model), sender(ep, oai), True, 1)
        judge = _judge_on(oai, http)
        failed: dict[str, str] = {}
        for probe in dict.fromkeys(p.name for p in reach.probes):
            try:
                assert_every_worker_answers_right(reach, probe, judge)
            except Violation as err:
                failed[probe] = err.message
        assert set(failed) == {"tool_choice-auto-nonstream", "tool_choice-auto-stream", "parallel-nonstream",
                               "parallel-stream", "reasoning-high-nonstream", "reasoning-high-stream",
                               "fixed_length-64-stream"}, failed
        assert all(f"worker {bad} answered wrong" in m and f"answered right: worker {good})" in m
                   for m in failed.values()), failed
        assert "usage.completion_tokens" in failed["fixed_length-64-stream"]

        # A release that cannot pin: unpinned rounds, each answer attributed from nvext.worker_id; a worker /health
        # lists that the router never picks (here an instance no process serves) is not judged, named. The KV router
        # may keep every round on the worker holding the probe's prefix: a real worker can be named unreached too.
        none_probe = [p for p in reach.probes if p.name == "tool_choice-none-nonstream"]
        ghost = {"instance_id": 4242, "endpoint": "generate", "component": "backend"}
        unpinned = reach_every_worker({**health, "instances": [*health["instances"], ghost]}, "agg", none_probe,
                                      sender(ep, oai), False, 1)
        assert len(unpinned.replies) == 3 and not unpinned.pinned   # 1 round per worker, 3 workers listed
        assert {w for r in unpinned.replies for w in r.answered_by(["worker"])} <= {WorkerRef("worker", good),
                                                                                   WorkerRef("worker", bad)}
        with pytest.raises(NotJudged, match=r"worker 4242(, worker \d+)? listed by /health never answered it \(the release cannot "
                                            r"pin \(pins_workers: false"):
            assert_every_worker_answers_right(unpinned, none_probe[0].name, judge)

        tools, reasoning_q = tools_data(), reasoning_data().question
        spec = tools.tool_choice
        toolset = next(p for p in reach.probes if p.name == "tool_choice-auto-nonstream").expect["tools"]
        for worker, ok in ((good, True), (bad, False)):
            ChatSession._non_stream.clear()  # a streamed answer is compared with the same worker's non-streamed one
            pinned_http = make_httpx(ep)
            pinned_http.headers[PIN_HEADER] = str(worker)
            pinned = ToolChat(oai.with_options(default_headers={PIN_HEADER: str(worker)}), pinned_http, ep.model,
                              dict(tools.defaults)).on(AGG, tools.conventions, None, None)
            for stream in (False, True):
                answer = pinned.ask(pinned.body(user(spec.prompt), tools=toolset), stream)
                reasoned = pinned.ask(pinned.body(user(reasoning_q.prompt), reasoning_effort="high"), stream)
                if ok:
                    pinned.assert_obeyed(answer, toolset, "auto", spec.expect_tool)
                    assert_reasoned_answer(reasoned, reasoning_q.expect_substring)
                else:
                    with pytest.raises(AssertionError, match="tool_choice 'auto' but no tool call came back"):
                        pinned.assert_obeyed(answer, toolset, "auto", spec.expect_tool)
            pinned_http.close()
        http.close()


@pytest.mark.nightly  # a second deployment, ~30 s of CI's two cores, for the rule test_stripped_evidence_... proves
def test_without_routing_evidence_the_gate_is_not_judged_and_says_so() -> None:
    """dynamo_evidence_stripped (the fault gateway drops nvext and the x-dynamo-* headers): no answer says which
    worker served it, so no worker is judged right; a worker listed by /health but never reached is named."""
    with _deployment(["dynamo_evidence_stripped"]) as dsim:
        ep, oai, http = _clients(dsim.base_url)
        health = http.get(ep.root_url + "/health").json()
        probes = [p for p in probe_specs(ep.model) if p.name.startswith("tool_choice-none")]
        reach = reach_every_worker(health, "agg", probes, sender(ep, oai), True, 1)
        for probe in probes:
            with pytest.raises(NotJudged, match=r"answers: the answers carry no nvext.worker_id"):
                assert_every_worker_answers_right(reach, probe.name, _judge_on(oai, http))
        http.close()
