"""The suites' Dynamo expectations, checked against the recorded real
Dynamo 1.6.1 answers (fixtures/transcripts/dynamo-1.6.1/, copied from the reference) and small scripted
transports.

No simulator and no Dynamo process: every request goes through ``httpx.MockTransport``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from checkout import FIXTURES_DIR, REPO_ROOT
from pytest_ml4_sim.deploy.gateway import Gateway

from pytest_ml4.checks.dynamo import (
    AffinityInconclusive,
    assert_prefill_decode_handoff,
    assert_prefix_reused,
    assert_session_affinity,
)
from pytest_ml4.checks.expected import (
    Expected,
    answer_to_refuse,
    assert_answer_expected,
    assert_served,
    expected_for,
)
from pytest_ml4.checks.restart import assert_recovery_within_limit
from pytest_ml4.checks.tools import assert_tool_choice_obeyed, load_tools, named
from pytest_ml4.checks.verdict import NotJudged
from pytest_ml4.client.endpoint import Endpoint, worker_metrics_urls_from_env
from pytest_ml4.client.stream_probe import parse_sse_lines
from pytest_ml4.client.transport import DeadlineExceeded
from pytest_ml4.control.base import Controller
from pytest_ml4.control.dynamo import (
    Turn,
    run_affinity_probe,
    run_conversation,
    worker_instance_ids,
)
from pytest_ml4.control.k8s_restart import NVEXT_ABSENT_CAUSES
from pytest_ml4.control.scenario import (
    RequestOutcome,
    RestartRun,
    StaleInstances,
    build_timeline,
    load_requests,
    missing_identity_evidence,
    probe_body,
)
from pytest_ml4.evidence.kv_load import EngineMetrics
from pytest_ml4.locations import data_file
from pytest_ml4.logs import FileLogReader, GrammarSchemaRefused, LogView
from pytest_ml4.report.environment import read_environment
from pytest_ml4.stacks.dynamo_versions import (
    behaviour,
    emulated_grammar_reason,
    first_schema_keyword,
    guided_refusal_cause,
    image_version,
    load_table,
    refused_by_some_release,
    tool_call_drop_cause,
    within_every_release,
)
from pytest_ml4.target.model import TargetError, load_target

DYNAMO_TARGETS = ("gb300-agg", "gb300-disagg", "vr200-agg", "vr200-disagg")


# ------------------------------------------------------------------------------------- versions and fields
def test_versions_table_rows_say_what_real_1_6_1_does() -> None:
    public = behaviour("1.6.1")
    assert public is not None and public.public
    # reference/real-dynamo.md: the v11 form is dropped, DYN_PARSER_VERSION=2 + mistral is never served.
    assert not public.mistral_v11_tool_calls_parsed and not public.mistral_parser_v2
    assert public.mistral_legacy_tool_calls_parsed
    assert behaviour("1.6.0") is None, "1.6.0 was never tried: no row speaks for it"
    seed = behaviour("1.7.0-mistral-large-4-dev.1")
    assert seed is not None and seed.mistral_v11_tool_calls_parsed and seed.mistral_parser_v2
    assert behaviour("0.1.0") is None
    # real-dynamo-vllm.md 'Guided tool choice and schemas'; agg/reasoning-effort-*.txt: all seven efforts.
    assert public.guided_json_refused_keywords == ("uniqueItems",)
    assert public.reasoning_efforts == ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def test_the_verified_efforts_are_the_real_frontends_enum() -> None:
    """Through Dynamo every effort the frontend's enum lists is accepted (no vLLM-side check): the 1.6.1 row's
    list is the one real 1.6.1 named when it refused `extreme`."""
    text = (REF / "dynamo-vllm-agg-reasoning-effort-bogus.txt").read_text()
    listed = re.search(r"expected one of ((?:`\w+`(?:, )?)+)", text)
    assert listed is not None
    public = behaviour("1.6.1")
    assert public is not None and public.reasoning_efforts == tuple(re.findall(r"`(\w+)`", listed.group(1)))


def test_stale_instance_answers_are_the_recorded_real_ones() -> None:
    """Each answer of the stale-instance table occurs in the real after-SIGKILL requests, then the empty 404; the
    string 'No instances available' does not occur there."""
    text = (REF / "dynamo-vllm-kv-after-kill-requests.txt").read_text()
    stale = StaleInstances.for_dynamo("1.6.1")
    for answer in stale.answers:
        assert any(answer.body in line and f" {answer.status} " in line for line in text.splitlines()), answer
    assert stale.after_window is not None and any(line.split()[1:2] == ["404"] for line in text.splitlines())
    assert "No instances available" not in text


def test_each_row_says_whether_it_is_verified_and_from_what() -> None:
    public, seed = behaviour("1.6.1"), behaviour("1.7.0-mistral-large-4-dev.1")
    assert public is not None and public.verified and "transcripts" in public.source
    assert seed is not None and not seed.verified and seed.status == "estimate"
    assert seed.source.startswith("from seeds/002")
    assert public.describe().startswith("1.6.1 (verified: ")


@pytest.mark.parametrize("row, field", [
    ("    status: maybe\n    source: x\n", "status"),
    ("    status: verified\n", "source"),
    ("    status: verified\n    source: x\n    guided_json_refused_keywords: uniqueItems\n",
     "guided_json_refused_keywords"),
])
def test_versions_table_names_a_bad_status_source_or_list(tmp_path: Path, row: str, field: str) -> None:
    flags = "".join(f"    {f}: true\n" for f in ("public", "mistral_v11_tool_calls_parsed",
                                                  "mistral_legacy_tool_calls_parsed", "mistral_parser_v2",
                                                  "reasoning_split_needs_effort"))
    lists = "".join(f"    {f}: []\n" for f in ("guided_json_refused_keywords", "reasoning_efforts")
                    if f"{f}:" not in row)
    bad = tmp_path / "versions.yaml"
    bad.write_text("versions:\n  '9.9':\n" + flags + lists + row)
    with pytest.raises(ValueError, match=rf"versions\.9\.9\.{field}"):
        load_table(bad)


def test_the_run_names_the_dynamo_row_in_use_in_summary_and_allure(pytester: pytest.Pytester) -> None:
    """summary.json ``versions.dynamo_behaviour`` and the Allure environment name the row and its status."""
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    for version, status in (("1.7.0-mistral-large-4-dev.1", "estimate"), ("1.6.1", "verified")):
        reports = pytester.path / f"r-{status}"
        result = pytester.runpytest_subprocess("--target", "gb300-agg", "--ml4-set",
                                               f"serving.dynamo_version={version}", "--ml4-reports", str(reports),
                                               "-p", "no:cacheprovider")
        result.assert_outcomes(passed=1)
        (run_dir,) = list(reports.iterdir())
        named = json.loads((run_dir / "summary.json").read_text())["versions"]["dynamo_behaviour"]
        assert named.startswith(f"{version} ({status}: ")
        env = read_environment(run_dir / "allure-results" / "environment.properties")
        assert env["Dynamo behaviour"] == named


def test_versions_table_rejects_a_non_boolean(tmp_path: Path) -> None:
    bad = tmp_path / "versions.yaml"
    bad.write_text("versions:\n  '9.9':\n    public: yes-ish\n")
    with pytest.raises(ValueError, match=r"versions\.9\.9\.public"):
        load_table(bad)


@pytest.mark.parametrize("name", DYNAMO_TARGETS)
def test_dynamo_targets_state_the_image_version_of_their_manifests(name: str) -> None:
    target = load_target(name)
    images = set()
    for manifest in target.manifests:
        text = target.resolve(manifest).read_text()
        images |= {line.split("image:", 1)[1].strip() for line in text.splitlines() if "image:" in line
                   and "ai-dynamo" in line}
    assert images, f"{name}: no Dynamo image in its manifests"
    assert {image_version(i) for i in images} == {target.serving.dynamo_version}


def test_dynamo_version_is_required_and_only_for_dynamo() -> None:
    """A release in no versions table is accepted as an assumed estimate (tests/test_team_overlays.py)."""
    with pytest.raises(TargetError, match="needs dynamo_version"):
        load_target("gb300-agg", overrides={"serving": {"dynamo_version": None}})
    with pytest.raises(TargetError, match="only for stack dynamo"):
        load_target("rtxpro6000-tp8", overrides={"serving": {"dynamo_version": "1.6.1"}})


def test_image_version() -> None:
    assert image_version("nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1") == "1.6.1"
    assert image_version("registry:5000/vllm-runtime:1.7.0-x@sha256:abc") == "1.7.0-x"
    assert image_version("registry:5000/vllm-runtime") is None


def test_worker_metrics_urls_from_env() -> None:
    target = load_target("gb300-disagg")
    env = {"ML4_GB300_DISAGG_PREFILL_METRICS": "http://p0:9090/metrics, http://p1:9090/metrics",
           "ML4_GB300_DISAGG_DECODE_METRICS": ""}
    urls = worker_metrics_urls_from_env(target.endpoint.worker_metrics_url_env, env)
    assert urls == {"prefill": ("http://p0:9090/metrics", "http://p1:9090/metrics")}
    ep = Endpoint("http://fe:8000/v1", worker_metrics_urls=urls)
    assert ep.all_worker_metrics_urls() == urls["prefill"]
    with pytest.raises(TargetError, match="worker_metrics_url_env"):
        load_target("gb300-agg", overrides={"endpoint": {"worker_metrics_url_env": {"frontend": "X"}}})


# ------------------------------------------------------------------------------- error answers per stack
#: Verbatim copies of ../shared/reference/real-dynamo-1.6.1-transcripts/, named <folder>-<name> (see its README).
REF = FIXTURES_DIR / "transcripts" / "dynamo-1.6.1"
REQ = httpx.Request("POST", "http://fe:8000/v1/chat/completions")


def recorded(name: str, block: int = 0) -> httpx.Response:
    """The ``block``-th HTTP answer recorded in a transcript (status line, headers, blank line, body)."""
    text = (REF / name).read_text()
    answers = re.findall(r"HTTP/1\.1 (\d{3})[^\n]*\n(.*?)\n\n(.*?)(?:\[(?:curl )?exit=\d+\]|\n===|\Z)", text, re.DOTALL)
    status, head, body = answers[block]
    headers = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
    headers.pop("transfer-encoding", None)
    headers.pop("content-length", None)
    return httpx.Response(int(status), headers=headers, content=body.strip().encode(), request=REQ)


def flat(status: int, message: str, kind: str = "Bad Request") -> httpx.Response:
    return httpx.Response(status, json={"message": message, "type": kind, "code": status}, request=REQ)


def row(file: Path, stack: str, case: str) -> Expected:
    data = yaml.safe_load(file.read_text())
    table = data["errors"] if file.name == "smoke.yaml" else data["errors"]["expect"]
    return expected_for(table, stack, case, file)


SMOKE, TOOLS, REASONING = (data_file("smoke", "smoke.yaml"), data_file("prompts", "tools.yaml"),
                           data_file("prompts", "reasoning.yaml"))
# What real Dynamo 1.6.1 said (transcripts), or its validation texts (reference/real-dynamo.md, the 1.6.1 binary).
DYNAMO_ANSWERS = [
    (SMOKE, "unknown_model", lambda: recorded("mocker-14_bad_model.txt")),
    (SMOKE, "unknown_model", lambda: recorded("mocker-21_bad_model_stream.txt")),
    (SMOKE, "prompt_too_long", lambda: recorded("python-worker-45_q4_context_length_token_budget.txt")),
    (TOOLS, "tool_choice_without_tools", lambda: flat(400, 'Validation: tool_choice is "required" but tools is empty')),
    (TOOLS, "empty_tools", lambda: flat(400, "Validation: tools array cannot be empty; omit the field entirely to "
                                             "disable tool use")),
    (TOOLS, "unknown_named_tool", lambda: flat(400, 'Validation: tool named "book_hotel" in tool_choice is not '
                                                    'present in tools')),
    (REASONING, "unsupported_effort", lambda: flat(400, "unknown variant `extreme`, expected one of `none`, "
                                                        "`minimal`, `low`, `medium`, `high`, `xhigh`, `max`")),
]


@pytest.mark.parametrize("file, case, answer", DYNAMO_ANSWERS, ids=[f"{f.stem}-{c}" for f, c, _ in DYNAMO_ANSWERS])
def test_dynamo_rows_accept_what_real_dynamo_answers(file: Path, case: str, answer: Any) -> None:
    assert_answer_expected(answer(), row(file, "dynamo+vllm", case), case)


@pytest.mark.parametrize("file, case, answer", DYNAMO_ANSWERS, ids=[f"{f.stem}-{c}" for f, c, _ in DYNAMO_ANSWERS])
def test_vllm_rows_refuse_dynamos_answers(file: Path, case: str, answer: Any) -> None:
    """The old false positives: vLLM's wording and shape are not what Dynamo says."""
    with pytest.raises(AssertionError):
        assert_answer_expected(answer(), row(file, "vllm", case), case)


def test_a_refusal_that_never_comes_says_the_prompt_is_being_computed() -> None:
    """An over-long prompt still unanswered at its deadline is being prefilled (a front cut it to fit): the check
    fails saying so, not with the transport's exception; an answer in time is passed on untouched."""
    def stalled() -> httpx.Response:
        raise DeadlineExceeded("http://127.0.0.1:9/v1/chat/completions: nothing arrived within 120 s")

    with pytest.raises(AssertionError, match=r"^\[answer.computed_not_refused\] over-long prompt: not refused: no answer before the deadline, so "
                                             r"the deployment is computing the prompt .*nothing arrived"):
        answer_to_refuse(stalled, "over-long prompt")
    refused = flat(400, "invalid request", "Bad Request")
    assert answer_to_refuse(lambda: refused, "over-long prompt") is refused


def test_unknown_model_match_is_case_insensitive_and_the_shape_is_checked() -> None:
    expected = row(SMOKE, "dynamo+vllm", "unknown_model")
    assert_answer_expected(flat(404, "MODEL NOT FOUND", "Not Found"), expected, "x")
    nested = httpx.Response(404, json={"error": {"message": "Model not found: no-such-model", "type": "Not Found",
                                                 "code": 404}}, request=REQ)
    with pytest.raises(AssertionError, match="flat"):
        assert_answer_expected(nested, expected, "x")
    with pytest.raises(AssertionError, match="HTTP 400, expected 404"):
        assert_answer_expected(flat(400, "Model not found"), expected, "x")


def test_over_long_prompt_without_a_token_budget_is_reported_as_that_deviation() -> None:
    expected = row(SMOKE, "dynamo+vllm", "prompt_too_long")
    mocker_500 = flat(500, "Internal server error", "Internal Server Error")
    with pytest.raises(AssertionError, match="no token budget.*the stack said.*Internal server error"):
        assert_answer_expected(mocker_500, expected, "over-long prompt")
    with pytest.raises(AssertionError, match="enforced no context length"):
        assert_answer_expected(recorded("python-worker-44_q4_context_length.txt"), expected, "over-long prompt")


def test_chat_template_kwargs_is_served_on_dynamo_and_refused_on_vllm() -> None:
    ok = httpx.Response(200, json={"choices": [{"message": {"content": "132"}}]}, request=REQ)
    assert_answer_expected(ok, row(REASONING, "dynamo+vllm", "chat_template_kwargs"), "x")
    with pytest.raises(AssertionError, match="accepted"):
        assert_answer_expected(ok, row(REASONING, "vllm", "chat_template_kwargs"), "x")
    with pytest.raises(AssertionError, match="expected 200"):
        assert_answer_expected(flat(400, "nope"), row(REASONING, "dynamo+vllm", "chat_template_kwargs"), "x")


def test_an_accepted_stream_that_ends_in_an_error_event_was_not_served() -> None:
    """Accepted means served: HTTP 200 followed by an in-band error (a worker failing the request) must fail."""
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "1"},
                                                                         "finish_reason": None}]}
    served = parse_sse_lines([f"data: {json.dumps(chunk)}", "", "data: [DONE]", ""])
    failed = parse_sse_lines([f"data: {json.dumps(chunk)}", "",
                              'data: {"error": {"message": "simulated engine error", "code": 500}}', "",
                              "data: [DONE]", ""])
    row_ = row(REASONING, "dynamo+vllm", "chat_template_kwargs")
    for answer in (served, failed):
        assert_answer_expected(answer, row_, "x")      # both are a 200: what the row says
    assert_served(served, "x")
    with pytest.raises(AssertionError, match="HTTP 200 but the stream carried an in-band error event.*simulated"):
        assert_served(failed, "x")


def test_litellm_inherits_vllm_rows_and_overrides_its_own() -> None:
    assert row(TOOLS, "vllm+litellm", "empty_tools") == row(TOOLS, "vllm", "empty_tools")
    assert row(TOOLS, "vllm+litellm", "tool_choice_without_tools").accepted
    with pytest.raises(ValueError, match="no expectation for case 'nope'"):
        row(TOOLS, "vllm+litellm", "nope")


def test_health_readiness_counts_generate_instances_only() -> None:
    body = json.loads(recorded("mocker-01_health.txt").text)
    assert worker_instance_ids(body) == {5470118659194256688}
    assert worker_instance_ids(json.loads(recorded("mocker-68_no_workers_health.txt").text)) == set()


# ------------------------------------------------------------------------ tools on a Dynamo that drops v11
def _dropped_v11_message() -> tuple[dict[str, Any], str]:
    """What real Dynamo 1.6.1 returned for a worker that emitted ``[TOOL_CALLS]get_weather[ARGS]{...}``."""
    text = (REF / "python-worker-30_auto_tool_v11_unary_noeffort.txt").read_text()
    body = json.loads(text.split("HTTP 200\n", 1)[1])
    return body["choices"][0]["message"], body["choices"][0]["finish_reason"]


def test_tools_failure_names_the_dynamo_version_that_drops_the_v11_form() -> None:
    message, finish = _dropped_v11_message()
    cause = tool_call_drop_cause(load_target("gb300-agg", overrides={"serving": {"dynamo_version": "1.6.1"}})
                                 .serving.dynamo_version)
    assert cause is not None
    with pytest.raises(AssertionError) as info:
        assert_tool_choice_obeyed("auto", message, finish, "get_weather", "x", no_call_cause=cause)
    text = str(info.value)
    assert "Dynamo 1.6.1" in text and "[TOOL_CALLS]name[ARGS]" in text and "not enabled?" not in text
    assert "1.7.0-mistral-large-4-dev.1" in text, "the fix names a version that parses the form"


def test_no_cause_where_the_version_parses_the_v11_form() -> None:
    assert tool_call_drop_cause("1.7.0-mistral-large-4-dev.1") is None
    message, finish = _dropped_v11_message()
    with pytest.raises(AssertionError, match="tool parser off or not enabled"):
        assert_tool_choice_obeyed("auto", message, finish, "get_weather", "x", no_call_cause=None)


@pytest.mark.parametrize("version", ["1.6.1", "1.7.0-mistral-large-4-dev.1"])
def test_tools_failure_names_the_parser_the_workers_run_not_the_version(version: str) -> None:
    """With the workers on the ``hermes`` parser the cause is that parser, whatever the release (the
    suite once blamed 1.6.1's mistral parser for a hermes deployment)."""
    message, finish = _dropped_v11_message()
    cause = tool_call_drop_cause(version, "hermes")
    assert cause is not None
    with pytest.raises(AssertionError) as info:
        assert_tool_choice_obeyed("auto", message, finish, "get_weather", "x", no_call_cause=cause)
    text = str(info.value)
    assert "`hermes` tool-call parser" in text and "--dyn-tool-call-parser mistral" in text
    assert "mistral` tool parser silently drops" not in text
    assert "register no tool-call parser" in (tool_call_drop_cause(version, None) or "")


SET_ALARM = load_tools(["set_alarm"])


def test_guided_refusal_names_the_refused_keyword_from_the_log_else_the_row() -> None:
    """1.6.1 passes the raw tool schema into guided JSON and vLLM 0.31's grammar refuses uniqueItems
    (real-dynamo-vllm.md 'Guided tool choice and schemas'): the cause names the keyword and its witness."""
    from_log = guided_refusal_cause("1.6.1", "required", SET_ALARM, lambda: ("uniqueItems",))
    assert from_log is not None and "refuses the keyword `uniqueItems` (tool set_alarm; engine log: " in from_log
    from_row = guided_refusal_cause("1.6.1", named("set_alarm"), SET_ALARM)
    assert from_row is not None and "guided_json_refused_keywords of 1.6.1" in from_row
    toolset = load_tools(["get_weather", "set_alarm"])
    assert guided_refusal_cause("1.6.1", named("get_weather"), toolset) is None, "named: only that tool's schema"
    assert guided_refusal_cause("1.6.1", "required", toolset) is not None, "required: every tool's schema"
    assert guided_refusal_cause("1.6.1", "auto", SET_ALARM) is None, "auto: no guided grammar"
    assert guided_refusal_cause("1.7.0-mistral-large-4-dev.1", "required", SET_ALARM) is None, "row: none refused"
    weather = load_tools(["get_weather"])
    assert guided_refusal_cause("1.6.1", "required", weather) is None, "no refused keyword in that schema"


def test_a_keyword_the_log_names_is_named_even_where_the_row_knows_none() -> None:
    """A release whose row refuses nothing (an estimate) but whose engine logged a grammar refusal: the log names
    the keyword and the tool using it."""
    cause = guided_refusal_cause("1.7.0-mistral-large-4-dev.1", "required", load_tools(["get_weather", "set_alarm"]),
                                 lambda: ("uniqueItems",))
    assert cause is not None and "refuses the keyword `uniqueItems` (tool set_alarm; engine log: " in cause


def test_guided_tool_choice_checks_use_tools_within_every_release() -> None:
    """set_alarm's uniqueItems is refused by 1.6.1's grammar: the tool_choice checks leave it to the schema check."""
    tools = load_tools(["get_weather", "set_alarm", "search_flights"])
    assert "uniqueItems" in refused_by_some_release()
    assert [t["function"]["name"] for t in within_every_release(tools)] == ["get_weather", "search_flights"]


def test_schema_limits_of_an_emulation_are_not_judged_as_the_declared_releases() -> None:
    """Real dynamo.vllm 1.6.1 workers emulating the 1.7.0 row refuse uniqueItems, which that row does not: the
    schema check cannot judge 1.7.0 there; the simulated worker (no running release) and 1.6.1 itself can."""
    reason = emulated_grammar_reason("1.7.0-mistral-large-4-dev.1", "1.6.1", " on vLLM 0.31.0")
    assert reason is not None
    assert reason.startswith("the run's workers are dynamo.vllm 1.6.1 on vLLM 0.31.0 emulating Dynamo "
                             "1.7.0-mistral-large-4-dev.1: their guided-JSON grammar refuses ['uniqueItems']")
    assert "(estimate) no keyword" in reason
    assert emulated_grammar_reason("1.6.1", "1.6.1") is None
    assert emulated_grammar_reason("1.7.0-mistral-large-4-dev.1", None) is None


def test_a_property_named_like_a_keyword_is_not_the_keyword() -> None:
    schema = {"type": "object", "properties": {"uniqueItems": {"type": "boolean"}}}
    assert first_schema_keyword(schema, ("uniqueItems",)) is None
    assert first_schema_keyword({"type": "array", "items": {"anyOf": [{"uniqueItems": True}]}},
                                ("uniqueItems",)) == "uniqueItems"


def test_grammar_refusal_line_is_read_from_the_engine_log() -> None:
    view = LogView(FileLogReader(FIXTURES_DIR / "logs" / "dynamo-guided-schema.log").read(), "recorded")
    assert [e.keys for e in view.all(GrammarSchemaRefused)] == [("uniqueItems",)]


# ---------------------------------------------------------------------- preflight: DYN_PARSER_VERSION=2
@pytest.mark.parametrize("name", ["gb300-disagg", "vr200-agg"])
def test_seed_manifests_on_a_public_1_6_image_are_never_served(name: str, tmp_path: Path) -> None:
    """The seed's own manifests pass; the same files on the public 1.6.1 image are flagged on every frontend."""
    from pytest_ml4.preflight import lint_paths

    target = load_target(name)
    deploy = target.resolve(next(m for m in target.manifests if m.endswith("deploy.yaml")))
    assert not lint_paths([deploy], target=target).by_rule("dynamo-parser-v2-unserved")
    public = tmp_path / "deploy.yaml"
    public.write_text(deploy.read_text().replace("vllm-runtime:1.7.0-mistral-large-4-dev.1", "vllm-runtime:1.6.1"))
    findings = lint_paths([public], target=target).by_rule("dynamo-parser-v2-unserved")
    assert findings and all("Dynamo 1.6.1" in f.message and f.severity.value == "error" for f in findings)


# ------------------------------------------------------------------------ vllm:* metrics live on the workers
def test_kv_cross_checks_read_the_workers_and_name_the_missing_field() -> None:
    disagg = load_target("gb300-disagg")
    live = Endpoint("http://fe:8000/v1", worker_metrics_urls={"prefill": ("http://p:1/metrics",),
                                                              "decode": ("http://d0:1/metrics", "http://d1:1/metrics")})
    m = EngineMetrics.of(live, disagg)
    assert m.missing is None and "http://fe:8000/metrics" not in m.urls
    assert set(m.urls) == {"http://p:1/metrics", "http://d0:1/metrics", "http://d1:1/metrics"}
    assert m.engine_urls == ("http://d0:1/metrics", "http://d1:1/metrics")
    unknown = EngineMetrics.of(Endpoint("http://fe:8000/v1"), disagg)
    assert unknown.urls == () and "ML4_GB300_DISAGG_DECODE_METRICS" in unknown.missing
    assert "endpoint.worker_metrics_url_env" in unknown.missing
    vllm = EngineMetrics.of(Endpoint("http://e:8000/v1"), load_target("rtxpro6000-tp8"))
    assert vllm.urls == ("http://e:8000/metrics",) and vllm.missing is None


# ------------------------------------------------------------------- session affinity and prefix reuse
class FakeFrontend:
    """A Dynamo frontend in front of two workers, as far as the affinity and prefix checks can see it: KV routing
    by cached-prefix overlap (4-word blocks, hashes chained like a KV cache), optional session affinity, the
    worker-pin header, and the router's cached_tokens / kv_hit_rate (or a fabricated clamped figure).

    ``disagg``: two prefill and two decode workers as real 1.6.1 serves them (ml4-91_disagg_pin_headers.txt): the
    prefix cache the router scores is the prefill workers', decode is placed by load (round robin here), each
    phase has its own session binding, ``x-dynamo-prefill-instance-id`` pins the prefill phase and
    ``x-dynamo-worker-instance-id`` alone is refused with the recorded 400."""

    BLOCK = 4
    REFUSED = (400, '{"message":"Invalid request","type":"Bad Request","code":400}')

    def __init__(self, affinity: bool = True, kv_routing: bool = True, honour_pin: bool = True,
                 fabricated: bool = False, disagg: bool = False, decode_affinity: bool = True) -> None:
        self.affinity, self.kv_routing, self.honour_pin, self.fabricated = affinity, kv_routing, honour_pin, fabricated
        self.disagg, self.decode_affinity = disagg, decode_affinity
        self.workers = [101, 202]
        self.prefill_workers = [11, 22] if disagg else []
        routed = self.prefill_workers or self.workers
        self.cache: dict[int, set[int]] = {w: set() for w in routed}
        self.sessions: dict[str, int] = {}
        self.decode_sessions: dict[str, int] = {}
        self.decode_turn = 0

    def blocks(self, words: list[str]) -> list[int]:
        out, parent = [], 0
        for i in range(0, len(words) - len(words) % self.BLOCK, self.BLOCK):
            parent = hash((parent, tuple(words[i:i + self.BLOCK])))
            out.append(parent)
        return out

    def overlap(self, worker: int, blocks: list[int]) -> int:
        return next((i for i, b in enumerate(blocks) if b not in self.cache[worker]), len(blocks))

    def health(self) -> httpx.Response:
        instances = [{"component": "backend", "endpoint": "generate", "instance_id": w} for w in self.workers]
        instances += [{"component": "prefill", "endpoint": "generate", "instance_id": w} for w in self.prefill_workers]
        return httpx.Response(200, json={"status": "healthy", "instances": instances})

    def routed(self, blocks: list[int], session: str | None, pin: str | None) -> int:
        """The worker of the KV-routed phase (the worker itself, or the prefill worker when disaggregated)."""
        candidates = self.prefill_workers or self.workers
        if pin and self.honour_pin:
            worker = int(pin)
        elif self.affinity and session in self.sessions:
            worker = self.sessions[session]
        elif self.kv_routing:
            worker = max(candidates, key=lambda w: self.overlap(w, blocks))  # ties: the first worker
        else:
            worker = candidates[0]
        if self.affinity and session:
            self.sessions.setdefault(session, worker)
        return worker

    def decode(self, session: str | None, pin: str | None) -> int:
        if pin:
            return int(pin)
        if self.affinity and self.decode_affinity and session in self.decode_sessions:
            return self.decode_sessions[session]
        worker = self.workers[self.decode_turn % len(self.workers)]
        self.decode_turn += 1
        if self.affinity and self.decode_affinity and session:
            self.decode_sessions[session] = worker
        return worker

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return self.health()
        body = json.loads(request.content)
        words = " ".join(m["content"] for m in body["messages"]).split()
        blocks = self.blocks(words)
        session = request.headers.get("x-dynamo-session-id")
        pin, prefill_pin = request.headers.get("x-dynamo-worker-instance-id"), \
            request.headers.get("x-dynamo-prefill-instance-id")
        if self.disagg and pin and not prefill_pin:
            return httpx.Response(self.REFUSED[0], text=self.REFUSED[1])
        if self.disagg:
            worker = self.routed(blocks, session, prefill_pin)
            ids = {"prefill_worker_id": worker, "decode_worker_id": self.decode(session, pin)}
        else:
            worker = self.routed(blocks, session, pin)
            ids = {"prefill_worker_id": worker, "decode_worker_id": worker}
        hit = self.overlap(worker, blocks)
        self.cache[worker].update(blocks)
        cached = min(len(words) - 1, 16) if self.fabricated else hit * self.BLOCK
        rate = round(hit / max(1, -(-len(words) // self.BLOCK)), 2)
        return httpx.Response(200, json={
            "choices": [{"message": {"content": "42"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(words), "completion_tokens": 1,
                      "prompt_tokens_details": {"cached_tokens": cached}},
            "nvext": {"worker_id": ids, "timing": {"kv_hit_rate": rate}}})


RESTART = load_requests()
FRONT = Endpoint("http://fe:8000/v1", model="mistral-large-4")


def fake(**kw: bool) -> tuple[httpx.Client, FakeFrontend]:
    frontend = FakeFrontend(**kw)
    return httpx.Client(transport=httpx.MockTransport(frontend), base_url=FRONT.base_url + "/"), frontend


def test_shared_prefix_turns_stay_together_without_affinity_so_they_prove_nothing() -> None:
    """Why the old check could not fail: KV routing alone co-locates continuation turns."""
    http, _ = fake(affinity=False)
    turns = run_conversation(FRONT, RESTART.conversation, http=http)
    assert len({t.decode_worker for t in turns}) == 1


def test_affinity_check_passes_with_affinity_and_fails_without() -> None:
    http, _ = fake(affinity=True)
    run = run_affinity_probe(FRONT, RESTART.affinity, http=http)
    assert assert_session_affinity(run) == run.turns[0].decode_worker
    http, _ = fake(affinity=False)
    with pytest.raises(AssertionError, match="session affinity is off") as info:
        assert_session_affinity(run_affinity_probe(FRONT, RESTART.affinity, http=http))
    assert not isinstance(info.value, AffinityInconclusive)


@pytest.mark.parametrize("kw, why", [({"kv_routing": False}, "does not follow cached prefixes"),
                                     ({"honour_pin": False}, "not honoured")])
def test_affinity_check_says_when_it_cannot_tell(kw: dict[str, bool], why: str) -> None:
    http, _ = fake(**kw)
    with pytest.raises(AffinityInconclusive, match=why):
        assert_session_affinity(run_affinity_probe(FRONT, RESTART.affinity, http=http))


def test_affinity_needs_two_decode_workers() -> None:
    http, frontend = fake()
    frontend.workers = [101]
    assert "1 decode worker" in (run_affinity_probe(FRONT, RESTART.affinity, http=http).not_applicable or "")


def _recorded_answer(label: str) -> tuple[int, str]:
    """Status and body of one case of the real-1.6.1 disagg pin capture."""
    text = (REF / "ml4-91_disagg_pin_headers.txt").read_text()
    m = re.search(rf"^=== {re.escape(label)}\n.*\nHTTP (\d+) (.*)$", text, re.MULTILINE)
    assert m, f"no case {label!r} in ml4-91_disagg_pin_headers.txt"
    return int(m.group(1)), m.group(2)


def test_disagg_fake_answers_the_pins_as_recorded_on_1_6_1() -> None:
    """The disagg fake refuses and accepts the pins the real frontend did (the tests below rely on it)."""
    frontend = FakeFrontend(disagg=True)
    http = httpx.Client(transport=httpx.MockTransport(frontend), base_url=FRONT.base_url + "/")
    body = {"model": "m", "messages": [{"role": "user", "content": "What is 17 + 25?"}]}
    refused = http.post("chat/completions", json=body, headers={"x-dynamo-worker-instance-id": "202"})
    assert (refused.status_code, refused.text) == _recorded_answer("x-dynamo-worker-instance-id = decode 1")
    assert _recorded_answer("x-dynamo-worker-instance-id = prefill 1")[0] == 400
    ok = http.post("chat/completions", json=body, headers={"x-dynamo-prefill-instance-id": "22"})
    status, recorded = _recorded_answer("x-dynamo-prefill-instance-id = prefill 1")
    assert ok.status_code == status == 200
    assert set(ok.json()["nvext"]["worker_id"]) <= set(json.loads(recorded))
    assert ok.json()["nvext"]["worker_id"]["prefill_worker_id"] == 22


def test_disagg_affinity_is_judged_on_the_prefill_phase() -> None:
    http, _ = fake(disagg=True)
    run = run_affinity_probe(FRONT, RESTART.affinity, http=http, topology="disagg")
    assert run.phase.id_field == "prefill_worker_id"
    assert assert_session_affinity(run) == run.turns[0].prefill_worker in (11, 22)
    http, _ = fake(disagg=True, affinity=False)
    with pytest.raises(AssertionError, match="served by prefill workers .* session affinity is off") as info:
        assert_session_affinity(run_affinity_probe(FRONT, RESTART.affinity, http=http, topology="disagg"))
    assert not isinstance(info.value, AffinityInconclusive)


def test_disagg_session_must_keep_its_decode_worker_too() -> None:
    http, _ = fake(disagg=True, decode_affinity=False)
    with pytest.raises(AssertionError, match="not its binding of the other phase.*decode_worker_id"):
        assert_session_affinity(run_affinity_probe(FRONT, RESTART.affinity, http=http, topology="disagg"))


def test_the_aggregated_pin_on_a_disagg_deployment_is_a_failed_request_not_missing_ids() -> None:
    """The defect found at merge: the probe pinned with x-dynamo-worker-instance-id on gb300-disagg, 1.6.1 said
    400, and the check reported 'did not get worker ids back'. Now it names the failed request."""
    http, _ = fake(disagg=True)
    with pytest.raises(AssertionError, match=r"1 request\(s\) failed \(priming part 2 on decode worker .*HTTP 400") \
            as info:
        assert_session_affinity(run_affinity_probe(FRONT, RESTART.affinity, http=http))
    assert "did not get worker ids back" not in str(info.value)


def test_prefix_reuse_passes_on_router_figures_and_fails_on_fabricated_ones() -> None:
    http, _ = fake()
    turns = run_conversation(FRONT, RESTART.conversation, http=http)
    assert assert_prefix_reused(turns, FakeFrontend.BLOCK) >= turns[0].prompt_tokens - 2 * FakeFrontend.BLOCK
    http, _ = fake(fabricated=True)
    with pytest.raises(AssertionError, match="never-seen prefix yet reports"):
        assert_prefix_reused(run_conversation(FRONT, RESTART.conversation, http=http), FakeFrontend.BLOCK)


def test_prefix_reuse_fails_without_reuse_or_with_a_hit_rate_that_disagrees() -> None:
    cold = Turn(200, "42", {"decode_worker_id": 1}, 782, 0, kv_hit_rate=0.0, label="turn 1")
    # 70_kv_routing.txt: a 782-token prompt again on the same worker: 768 cached, kv_hit_rate 0.92 (12/13 blocks).
    warm = Turn(200, "42", {"decode_worker_id": 1}, 782, 768, kv_hit_rate=0.92, label="turn 2")
    assert assert_prefix_reused([cold, warm], 64) == 768
    with pytest.raises(AssertionError, match="no prefix reuse"):
        assert_prefix_reused([cold, Turn(200, "42", {"decode_worker_id": 2}, 800, 0, kv_hit_rate=0.0)], 64)
    with pytest.raises(AssertionError, match="kv_hit_rate 0.5 disagrees"):
        assert_prefix_reused([cold, Turn(200, "42", {"decode_worker_id": 1}, 782, 768, kv_hit_rate=0.5)], 64)
    with pytest.raises(AssertionError, match="768 cached tokens of a 700-token prompt"):
        assert_prefix_reused([cold, Turn(200, "42", {"decode_worker_id": 1}, 700, 768)], 64)


def test_recorded_kv_routing_figures_fit_the_hit_rate_rule() -> None:
    text = (REF / "mocker-70_kv_routing.txt").read_text()
    rows = re.findall(r"'prompt_tokens': (\d+).*?'cached_tokens': (\d+).*?'kv_hit_rate': ([\d.]+)", text)
    assert len(rows) == 6
    for prompt, cached, rate in rows:
        assert abs(float(rate) - (int(cached) // 64) / -(-int(prompt) // 64)) <= 0.02


# ------------------------------------------------------- evidence absent (nvext / x-dynamo-* stripped): not judged
def _through_stripping_ingress(frontend: FakeFrontend) -> httpx.Client:
    """``frontend`` behind the fault gateway's ``dynamo_evidence_stripped`` rewrites (harness/pytest_ml4_sim/deploy/gateway.py):
    no nvext in answers, no x-dynamo-* request headers, as with DYN_DISABLE_FRONTEND_NVEXT=1 or a stripping ingress."""
    gateway = Gateway("http://fe:8000", "mistral-large-4", ["dynamo_evidence_stripped"])

    def handle(request: httpx.Request) -> httpx.Response:
        inner = httpx.Request(request.method, request.url, headers=gateway.forwarded_headers(request.headers),
                              content=request.content)
        answer = frontend(inner)
        if not request.url.path.endswith("/chat/completions"):
            return answer
        return httpx.Response(answer.status_code, content=gateway.rewrite_answer(answer.content))

    return httpx.Client(transport=httpx.MockTransport(handle), base_url=FRONT.base_url + "/")


@pytest.mark.parametrize("disagg", [False, True], ids=["agg", "disagg"])
def test_affinity_without_nvext_is_not_judged_and_judged_with_it(disagg: bool) -> None:
    topology = "disagg" if disagg else "agg"
    with pytest.raises(NotJudged, match=r"session affinity: .* carry no nvext.worker_id.*DYN_DISABLE_FRONTEND_NVEXT=1"):
        assert_session_affinity(run_affinity_probe(FRONT, RESTART.affinity, topology=topology,
                                          http=_through_stripping_ingress(FakeFrontend(disagg=disagg))))
    http, _ = fake(disagg=disagg)
    assert assert_session_affinity(run_affinity_probe(FRONT, RESTART.affinity, http=http, topology=topology)) is not None


def test_handoff_without_nvext_is_not_judged_and_judged_with_it() -> None:
    frontend = FakeFrontend(disagg=True)
    instances = frontend.health().json()["instances"]
    blind = run_conversation(FRONT, RESTART.conversation, http=_through_stripping_ingress(frontend))
    with pytest.raises(NotJudged, match=r"prefill -> decode handoff: 2 of 2 answers carry no nvext.worker_id"):
        assert_prefill_decode_handoff(blind, instances)
    http, _ = fake(disagg=True)
    pairs = assert_prefill_decode_handoff(run_conversation(FRONT, RESTART.conversation, http=http), instances)
    assert len(pairs) == 2 and all(p in (11, 22) and d in (101, 202) for p, d in pairs), pairs


def test_a_turn_prefilled_on_its_decode_worker_fails_the_handoff() -> None:
    """Dynamo's conditional disaggregation serves a continuation turn (its prefix cached on the decode worker)
    without a prefill worker: nvext.worker_id then names the decode worker alone (the real 1.6.1 frontend's bypass,
    fixtures/transcripts/dynamo-1.6.1/ml4-92_conditional_disagg_bypass.txt). The first turn alone would have passed."""
    frontend = FakeFrontend(disagg=True)
    instances = frontend.health().json()["instances"]
    first = Turn(200, "42", {"prefill_worker_id": 11, "prefill_dp_rank": 0, "decode_worker_id": 101,
                             "decode_dp_rank": 0}, 190, 0)
    bypassed = Turn(200, "42", {"decode_worker_id": 101, "decode_dp_rank": 0}, 250, 192)
    assert assert_prefill_decode_handoff([first], instances) == [(11, 101)]
    with pytest.raises(AssertionError, match=r"no prefill -> decode handoff: turn 2: prefill_worker_id=None "
                                             r"decode_worker_id=101: no separate prefill"):
        assert_prefill_decode_handoff([first, bypassed], instances)


def test_prefix_reuse_without_nvext_is_judged_on_usage_and_not_judged_without_either() -> None:
    """The usage figure (cached_tokens) survives a stripped nvext and still judges reuse; with neither figure
    nothing shows what was reused: not judged, not a failure."""
    turns = run_conversation(FRONT, RESTART.conversation, http=_through_stripping_ingress(FakeFrontend()))
    assert all(t.worker_id is None and t.kv_hit_rate is None for t in turns)
    assert assert_prefix_reused(turns, FakeFrontend.BLOCK) >= turns[0].prompt_tokens - 2 * FakeFrontend.BLOCK
    bare = [Turn(200, "42", None, 782, None, label="turn 1"), Turn(200, "42", None, 800, None, label="turn 2")]
    with pytest.raises(NotJudged, match="prefix reuse: 2 of 2 answers carry no nvext.worker_id"):
        assert_prefix_reused(bare, 64)


class _Blind(Controller):
    """A controller that asks for nvext evidence (as Kubernetes does for Dynamo) and has no incarnation."""

    kind = "blind"
    evidence_absent_cause = NVEXT_ABSENT_CAUSES

    def describe(self) -> str:
        return "a controller whose answers name no engine"

    def trigger(self, progress: Any = None) -> dict[str, Any]:  # pragma: no cover - never restarted here
        raise NotImplementedError

    def ready_checks(self) -> list[Any]:
        return []

    def probe_extras(self) -> dict[str, Any]:
        return {"nvext": {"extra_fields": ["worker_id"]}}


def test_restart_identity_without_evidence_is_not_judged() -> None:
    blind = _Blind(timeout_s=1.0)
    body = probe_body("m", RESTART.probe, blind.probe_extras())
    reason = missing_identity_evidence(blind, body, None)
    assert reason is not None and "nvext=" in reason and "DYN_DISABLE_FRONTEND_NVEXT=1" in reason
    assert missing_identity_evidence(blind, body, "7") is None, "an answer that names its worker is evidence"
    run = RestartRun("blind", None, None, 0.0, requests=[RequestOutcome(0, 0.5, 0.1, 200, None, None)],
                     recovery_s=0.6)
    run.timeline = build_timeline(None, run.requests)
    assert assert_recovery_within_limit(run, limit_s=10) == pytest.approx(0.6), "the control: judged where evidence is not missing"
    run.evidence_missing = reason
    with pytest.raises(NotJudged, match="restart identity: the answer before the restart named no engine"):
        assert_recovery_within_limit(run, limit_s=10)


# --------------------------------------------------------------------------- OSL engine counter on live runs
def test_osl_engine_counter_runs_on_a_live_endpoint(pytester: pytest.Pytester, tmp_path: Path,
                                                    rtx_api_key: str) -> None:
    """``--endpoint`` at a running engine (no ``--sim``, no metrics variable): the counter is still read, at the
    endpoint's own /metrics (it used to need ``metrics_url``, which only ``--sim`` set)."""
    from pytest_ml4_sim.deploy.simulator import SimServer

    target = load_target("rtxpro6000-tp8")
    with SimServer(target, overrides={"sim": {"ttft_s": 0.005, "itl_ms": 0.2}}, log_file=tmp_path / "e.log") as sim:
        result = pytester.runpytest_subprocess(
            str(REPO_ROOT / "suites" / "test_osl.py"), "--target", "rtxpro6000-tp8", "--endpoint", sim.base_url,
            "--ml4-no-proxy", "--ml4-log-file", str(tmp_path / "e.log"), "-k", "streamed_token_count", "-s",
            "--ml4-reports", str(tmp_path / "reports"), timeout=240)
        port = sim.url.rsplit(":", 1)[1]
    result.assert_outcomes(passed=1)
    line = f"*engine token counter: 768 tokens generated (vllm:generation_tokens_total at http://127.0.0.1:{port}/metrics)*"
    result.stdout.fnmatch_lines([line])


def test_dynamo_tool_conventions_accept_the_recorded_named_call_and_vllm_ones_do_not() -> None:
    """55_replay_tool_named.txt: a named tool_choice on real Dynamo: id call-<uuid4>, finish tool_calls, content null."""
    from pytest_ml4.checks.tools import (
        VLLM_TOOLS,
        ToolConventions,
        assert_mistral_tool_ids,
        named,
    )

    body = json.loads(recorded("mocker-55_replay_tool_named.txt").text)
    message, finish = body["choices"][0]["message"], body["choices"][0]["finish_reason"]
    dynamo = ToolConventions.from_row(yaml.safe_load(TOOLS.read_text())["conventions"]["dynamo+vllm"])
    assert_mistral_tool_ids(message["tool_calls"], "x", dynamo)
    assert_tool_choice_obeyed(named("get_weather"), message, finish, "get_weather", "x", conventions=dynamo)
    with pytest.raises(AssertionError, match="not Mistral ids"):
        assert_mistral_tool_ids(message["tool_calls"], "x", VLLM_TOOLS)
    with pytest.raises(AssertionError, match="expected 'stop'"):
        assert_tool_choice_obeyed(named("get_weather"), message, finish, "get_weather", "x")
    with pytest.raises(AssertionError, match="not the Dynamo frontend's ids"):
        assert_mistral_tool_ids([{"id": "abcDEF123"}], "x", dynamo)
