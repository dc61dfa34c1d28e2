"""Tool calling through the Mistral tool parser (reference vllm.md §4).

Every check runs non-streamed (openai SDK) and streamed (stream probe, grammar checked); the streamed variant
also asks the same question non-streamed and requires the same tool names, arguments, content, reasoning and
finish_reason. Data: ``pytest_ml4/data/prompts/tools.yaml`` and the schemas in ``pytest_ml4/data/tools/``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from pytest_ml4.checks.chat import (
    Answer,
    ChatSession,
    send_raw,
    served_by_litellm,
    user,
)
from pytest_ml4.checks.expected import assert_answer_expected, expected_for
from pytest_ml4.checks.protocol import assert_no_control_tokens
from pytest_ml4.checks.tools import (
    VLLM_TOOLS,
    ToolConventions,
    assert_arguments_valid,
    assert_mistral_tool_ids,
    assert_tool_choice_obeyed,
    load_tools,
    named,
)
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.client import Endpoint, decode_json, quote_body
from pytest_ml4.dynamo_versions import (
    emulated_grammar_reason,
    guided_refusal_cause,
    tool_call_drop_cause,
    within_every_release,
)
from pytest_ml4.locations import data_file
from pytest_ml4.logs import GrammarSchemaRefused, LogView
from pytest_ml4.probe import StreamResult
from pytest_ml4.targets import Target

pytestmark = pytest.mark.tools

TOOLS_FILE = data_file("prompts", "tools.yaml")
DATA = yaml.safe_load(TOOLS_FILE.read_text())
TOOLSET = load_tools(DATA["toolset"])
#: What tool_choice required/named does is judged on tools every known release's guided-JSON grammar accepts
#: (pytest_ml4/data/dynamo/versions.yaml guided_json_refused_keywords); whether the whole toolset's schemas are accepted
#: is its own check (test_tool_schemas_are_accepted_under_guided_decoding), so one refused keyword is named once
#: and does not read as a broken tool_choice.
GUIDED_TOOLSET = within_every_release(TOOLSET)
STREAM = pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])


class ToolChat(ChatSession):
    """A chat that knows why the stack might return no tool call (the deployment's tool parser, or a Dynamo
    release whose ``mistral`` parser drops Mistral Large 4's ``[TOOL_CALLS]name[ARGS]{...}`` form) and why a
    guided tool choice may be refused (a schema keyword the release's grammar refuses), from
    ``pytest_ml4/data/dynamo/versions.yaml`` and the engine log."""

    no_call_cause: str | None = None
    conventions: ToolConventions = VLLM_TOOLS
    dynamo_version: str | None = None
    logs: Any = None
    #: Why this run cannot judge the declared release's guided-JSON schema limits (its workers are another
    #: release emulating it), or None.
    grammar_not_judged: str | None = None

    def ask(self, body: dict[str, Any], stream: bool) -> Answer:
        started = time.time()
        try:
            return super().ask(body, stream)
        except AssertionError as err:
            cause = self.guided_refusal_cause(body, started)
            if cause is None:
                raise
            # The cause goes before pytest's "assert ..." explanation of the stream check: it is the verdict.
            raise AssertionError(f"{str(err).split(chr(10) + 'assert ', 1)[0]}\n{cause}") from None

    def guided_refusal_cause(self, body: dict[str, Any], since: float) -> str | None:
        """Why a guided tool choice failed where the release refuses a keyword of the tools' schemas (the
        keyword the engine log names since the request, else the one the versions row names)."""
        if self.dynamo_version is None:
            return None
        return guided_refusal_cause(self.dynamo_version, body.get("tool_choice"), body.get("tools") or [],
                                    lambda: refused_keys_logged(self.logs, since))

    def check(self, answer: Answer, tools: list[dict[str, Any]], tool_choice: Any,
              expect_tool: str | None) -> list[Any]:
        """The checks every answer with tools gets; returns the parsed arguments."""
        where = answer.where
        if self.no_call_cause and not answer.tool_calls and tool_choice != "none":
            # Said first: the markup this release leaves in content would otherwise read as "tool parser off".
            raise AssertionError(f"{where}: tool_choice {tool_choice!r} but no tool call came back: "
                                 f"{self.no_call_cause}; content: {quote_body(str(answer.message.get('content')))}")
        assert_no_control_tokens(answer.message, where)
        assert_tool_choice_obeyed(tool_choice, answer.message, answer.finish_reason, expect_tool, where,
                                  answer.via_litellm, no_call_cause=self.no_call_cause,
                                  conventions=self.conventions)
        assert_mistral_tool_ids(answer.tool_calls, where, self.conventions)
        return assert_arguments_valid(answer.tool_calls, tools, where)


def refused_keys_logged(reader: Any, since: float) -> tuple[str, ...]:
    """The keywords of the last ``Grammar error: Unimplemented keys`` line since ``since`` (empty: none, or no
    log to read)."""
    if reader is None:
        return ()
    try:
        records = reader.read(since=since - 1.0)
    except Exception:  # noqa: BLE001 - the log is a better witness, not a precondition: the row names it too
        return ()
    events = LogView(records, reader.describe()).all(GrammarSchemaRefused)
    return events[-1].keys if events else ()


@pytest.fixture
def chat(request: pytest.FixtureRequest, ml4_target: Target, ml4_endpoint: Endpoint, openai_client: Any,
         http_client: httpx.Client, ml4_run_dir: Path) -> ToolChat:
    session = ToolChat(openai_client, http_client, ml4_endpoint.model, DATA["defaults"],
                       ml4_run_dir / "transcripts", request.node.name)
    if ml4_target.is_dynamo and ml4_target.serving.dynamo_version:
        session.dynamo_version = ml4_target.serving.dynamo_version
        # The parser the deployment's workers run (what the target declares for --dyn-tool-call-parser).
        session.no_call_cause = tool_call_drop_cause(session.dynamo_version, ml4_target.engine.tool_call_parser)
        session.logs = engine_log_reader(request)
        session.grammar_not_judged = emulated_grammar_reason(session.dynamo_version, *running_release(request))
    row = (DATA.get("conventions") or {}).get(ml4_target.serving.stack)
    if row:
        session.conventions = ToolConventions.from_row(row)
    return session


def running_release(request: pytest.FixtureRequest) -> tuple[str | None, str]:
    """The Dynamo release the run's real ``dynamo.vllm`` workers are and a note on their vLLM, or ``(None, "")``
    (the simulated worker follows the declared row; a live target is the declared release)."""
    engine = request.getfixturevalue("ml4_worker_engine")
    if not engine:
        return None, ""
    return str(engine["dynamo.vllm"]), f" on vLLM {engine['vllm']}"


def engine_log_reader(request: pytest.FixtureRequest) -> Any:
    """The engine log reader where the run has one (None: no log configured for a live target)."""
    try:
        return request.getfixturevalue("ml4_logs")
    except (Exception, pytest.skip.Exception):  # noqa: BLE001 - no log to read: the versions row names it instead
        return None


@STREAM
@pytest.mark.parametrize("case", sorted(DATA["cases"]))
def test_auto_calls_the_matching_tool_with_valid_arguments(chat: ToolChat, case: str, stream: bool) -> None:
    spec = DATA["cases"][case]
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=TOOLSET), stream)
    args = chat.check(answer, TOOLSET, "auto", spec["expect_tool"])[0]
    for key, value in (spec.get("expect_args") or {}).items():
        assert args.get(key) == value, (f"{answer.where}: {spec['expect_tool']} argument {key!r} is "
                                        f"{args.get(key)!r}, the prompt says {value!r}")


@STREAM
@pytest.mark.parametrize("choice", ["none", "auto", "required", "named"])
def test_tool_choice_is_obeyed(chat: ToolChat, choice: str, stream: bool) -> None:
    spec = DATA["tool_choice"]
    tool_choice: Any = named(spec["expect_tool"]) if choice == "named" else choice
    tools = GUIDED_TOOLSET if choice in ("required", "named") else TOOLSET
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=tools, tool_choice=tool_choice), stream)
    if choice == "none":
        assert_no_control_tokens(answer.message, answer.where)
        assert_tool_choice_obeyed("none", answer.message, answer.finish_reason, None, answer.where,
                                  answer.via_litellm)
    else:
        chat.check(answer, tools, tool_choice, spec["expect_tool"])


@STREAM
def test_required_calls_some_tool_even_when_none_matches(chat: ToolChat, stream: bool) -> None:
    prompt = DATA["tool_choice"]["unmatched_prompt"]
    answer = chat.ask(chat.body(user(prompt), tools=GUIDED_TOOLSET, tool_choice="required"), stream)
    chat.check(answer, GUIDED_TOOLSET, "required", None)


@STREAM
def test_tool_schemas_are_accepted_under_guided_decoding(chat: ToolChat, stream: bool) -> None:
    """The fixture tools' schemas are accepted under a guided tool_choice (required).

    Every schema (``set_alarm`` has ``uniqueItems``) goes into the grammar: Dynamo 1.6.1 passes the raw schemas
    into its guided-JSON grammar, which refuses some keywords; a client sending such a schema fails, and the
    message names the keyword (engine log, else the versions row). Real ``dynamo.vllm`` workers emulating another
    release keep 1.6.1's grammar: not judged there, never passed."""
    if chat.grammar_not_judged:
        not_judged(chat.grammar_not_judged)
    spec = DATA["cases"]["alarm"]
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=TOOLSET, tool_choice="required"), stream)
    chat.check(answer, TOOLSET, "required", None)


@STREAM
def test_named_tool_choice_gives_stop_and_empty_content(chat: ToolChat, stream: bool) -> None:
    spec = DATA["cases"]["flights"]
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=GUIDED_TOOLSET, tool_choice=named("search_flights")),
                      stream)
    chat.check(answer, GUIDED_TOOLSET, named("search_flights"), "search_flights")
    allowed = chat.conventions.named_content
    assert answer.message.get("content") in allowed, (
        f"{answer.where}: named tool_choice must give content {' or '.join(map(repr, allowed))} "
        f"({chat.conventions.source}), got {answer.message.get('content')!r}")


@STREAM
def test_parallel_calls(chat: ToolChat, stream: bool) -> None:
    spec = DATA["parallel"]
    tools = load_tools(spec["tools"])
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=tools), stream)
    args = chat.check(answer, tools, "auto", spec["expect_tool"])
    assert len(args) == spec["expect_calls"], (f"{answer.where}: expected {spec['expect_calls']} parallel calls "
                                               f"for {spec['expect_values']}, got {len(args)}: {args}")
    values = sorted(v for a in args for v in a.values() if isinstance(v, str))
    assert set(spec["expect_values"]) <= set(values), f"{answer.where}: parallel call arguments {args}"


@STREAM
def test_parallel_tool_calls_false_keeps_one_call(chat: ToolChat, stream: bool) -> None:
    spec = DATA["parallel"]
    tools = load_tools(spec["tools"])
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=tools, parallel_tool_calls=False), stream)
    args = chat.check(answer, tools, "auto", spec["expect_tool"])
    assert len(args) == 1, (f"{answer.where}: parallel_tool_calls=false must keep only the first call "
                            f"(maybe_filter_parallel_tool_calls), got {len(args)}: {args}")


@STREAM
def test_round_trip_answer_uses_the_tool_result(chat: ToolChat, stream: bool) -> None:
    spec = DATA["round_trip"]
    tools = load_tools(spec["tools"])
    messages = user(spec["prompt"])
    first = chat.ask(chat.body(messages, tools=tools), stream)
    chat.check(first, tools, "auto", None)
    messages = messages + [{"role": "assistant", "content": first.message.get("content") or "",
                            "tool_calls": [{"id": c["id"], "type": "function", "function": c["function"]}
                                           for c in first.tool_calls]}]
    for call in first.tool_calls:
        name = call["function"]["name"]
        assert name in spec["results"], f"{first.where}: the model called {name!r}, no canned result for it"
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": spec["results"][name]})
    final = chat.ask(chat.body(messages, tools=tools), stream)
    assert_no_control_tokens(final.message, final.where)
    assert not final.tool_calls, f"{final.where}: the model called tools again instead of answering: {final.tool_calls}"
    assert final.finish_reason == "stop", f"{final.where}: final answer finish_reason {final.finish_reason!r}"
    for needle in spec["expect_in_answer"]:
        assert needle in final.content, (f"{final.where}: the final answer does not use the tool result "
                                         f"(missing {needle!r}): {final.content!r}")


@STREAM
@pytest.mark.parametrize("case", sorted(DATA["errors"]["cases"]))
def test_invalid_tool_requests_are_rejected(ml4_target: Target, ml4_endpoint: Endpoint, http_client: httpx.Client,
                                            case: str, stream: bool) -> None:
    """Each stack refuses these requests in its own words (``pytest_ml4/data/prompts/tools.yaml`` errors.expect); a stack
    whose row says it accepts one must at least not call a tool it was never given.

    Through LiteLLM (``drop_params``) a request without tools loses its ``tool_choice`` and is served: the proxy's
    documented answer is accepted there, but a 200 proves nothing about the deployment's validation, so the
    same request is then sent to the engine behind the proxy, which must refuse it in the engine's words
    (the proxy's 200 alone would pass a deployment that validates nothing)."""
    spec = DATA["errors"]["cases"][case]
    body: dict[str, Any] = {"model": ml4_endpoint.model, "messages": user("What is the weather in Paris?"),
                            "max_tokens": 64, **{k: v for k, v in spec.items() if k != "tools_from"}}
    if "tools_from" in spec:
        body["tools"] = load_tools(spec["tools_from"])
    expected = expected_for(DATA["errors"]["expect"], ml4_target.serving.stack, case, TOOLS_FILE)
    resp = send_raw(http_client, body, stream)
    what = f"{case} ({'streamed' if stream else 'non-streamed'})"
    assert_answer_expected(resp, expected, what)
    if expected.accepted and not body.get("tools"):
        message = (resp.message() if isinstance(resp, StreamResult)
                   else decode_json(resp, what)["choices"][0]["message"])
        assert not message.get("tool_calls"), f"{what}: no tools were sent yet the model called {message}"
    if expected.accepted and served_by_litellm(resp.headers):
        engine_root = ml4_endpoint.engine_root_url
        assert engine_root != ml4_endpoint.root_url, (
            f"{what}: the proxy served it; to check the engine refuses it set {ml4_target.endpoint.metrics_url_env} "
            f"to the engine's /metrics URL")
        engine_stack = ml4_target.serving.stack.split("+", 1)[0]
        engine_expected = expected_for(DATA["errors"]["expect"], engine_stack, case, TOOLS_FILE)
        engine_body = {**body, "model": ml4_target.serving.engine_served_model_name or body["model"]}
        with httpx.Client(base_url=engine_root + "/v1/", headers=ml4_endpoint.auth_headers(), timeout=60) as engine:
            resp = send_raw(engine, engine_body, stream)
        assert_answer_expected(resp, engine_expected, f"{what} at the engine behind the proxy")
