"""Tool calling through the Mistral tool parser (reference vllm.md §4).

Every check runs non-streamed (openai SDK) and streamed (stream probe, grammar checked); the streamed variant
also asks the same question non-streamed and requires the same tool names, arguments, content, reasoning and
finish_reason. Data: ``pytest_ml4/data/prompts/tools.yaml`` and the schemas in ``pytest_ml4/data/tools/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from pytest_ml4.checks.chat import user
from pytest_ml4.checks.tools import (
    ToolChat,
    assert_expected_arguments,
    assert_final_answer_uses_results,
    assert_invalid_request_refused,
    assert_named_content,
    assert_parallel_calls,
    assert_single_call,
    invalid_request_body,
    load_tools,
    named,
    with_tool_results,
)
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.evidence.worker_engine import WorkerEngine
from pytest_ml4.locations import data_file
from pytest_ml4.plugin.logs import log_reader_if_any
from pytest_ml4.stacks.dynamo_versions import within_every_release
from pytest_ml4.target.model import Target

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


@pytest.fixture
def chat(request: pytest.FixtureRequest, ml4_target: Target, ml4_endpoint: Endpoint, openai_client: Any,
         http_client: httpx.Client, ml4_run_dir: Path, ml4_worker_engine: WorkerEngine | None) -> ToolChat:
    # The engine log names a keyword a Dynamo release's grammar refused; only Dynamo's checks read it.
    logs = log_reader_if_any(request) if ml4_target.is_dynamo else None
    return ToolChat(openai_client, http_client, ml4_endpoint.model, DATA["defaults"], ml4_run_dir / "transcripts",
                    request.node.name).on(ml4_target, DATA.get("conventions"), ml4_worker_engine, logs)


@STREAM
@pytest.mark.parametrize("case", sorted(DATA["cases"]))
def test_auto_calls_the_matching_tool_with_valid_arguments(chat: ToolChat, case: str, stream: bool) -> None:
    spec = DATA["cases"][case]
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=TOOLSET), stream)
    args = chat.assert_obeyed(answer, TOOLSET, "auto", spec["expect_tool"])[0]
    assert_expected_arguments(args, spec.get("expect_args"), spec["expect_tool"], answer.where)


@STREAM
@pytest.mark.parametrize("choice", ["none", "auto", "required", "named"])
def test_tool_choice_is_obeyed(chat: ToolChat, choice: str, stream: bool) -> None:
    spec = DATA["tool_choice"]
    tool_choice: Any = named(spec["expect_tool"]) if choice == "named" else choice
    tools = GUIDED_TOOLSET if choice in ("required", "named") else TOOLSET
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=tools, tool_choice=tool_choice), stream)
    chat.assert_obeyed(answer, tools, tool_choice, None if choice == "none" else spec["expect_tool"])


@STREAM
def test_required_calls_some_tool_even_when_none_matches(chat: ToolChat, stream: bool) -> None:
    prompt = DATA["tool_choice"]["unmatched_prompt"]
    answer = chat.ask(chat.body(user(prompt), tools=GUIDED_TOOLSET, tool_choice="required"), stream)
    chat.assert_obeyed(answer, GUIDED_TOOLSET, "required", None)


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
    chat.assert_obeyed(answer, TOOLSET, "required", None)


@STREAM
def test_named_tool_choice_gives_stop_and_empty_content(chat: ToolChat, stream: bool) -> None:
    spec = DATA["cases"]["flights"]
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=GUIDED_TOOLSET, tool_choice=named("search_flights")),
                      stream)
    chat.assert_obeyed(answer, GUIDED_TOOLSET, named("search_flights"), "search_flights")
    assert_named_content(answer.message, answer.where, chat.conventions)


@STREAM
def test_parallel_calls(chat: ToolChat, stream: bool) -> None:
    spec = DATA["parallel"]
    tools = load_tools(spec["tools"])
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=tools), stream)
    args = chat.assert_obeyed(answer, tools, "auto", spec["expect_tool"])
    assert_parallel_calls(args, spec["expect_calls"], spec["expect_values"], answer.where)


@STREAM
def test_parallel_tool_calls_false_keeps_one_call(chat: ToolChat, stream: bool) -> None:
    spec = DATA["parallel"]
    tools = load_tools(spec["tools"])
    answer = chat.ask(chat.body(user(spec["prompt"]), tools=tools, parallel_tool_calls=False), stream)
    args = chat.assert_obeyed(answer, tools, "auto", spec["expect_tool"])
    assert_single_call(args, answer.where)


@STREAM
def test_round_trip_answer_uses_the_tool_result(chat: ToolChat, stream: bool) -> None:
    spec = DATA["round_trip"]
    tools = load_tools(spec["tools"])
    messages = user(spec["prompt"])
    first = chat.ask(chat.body(messages, tools=tools), stream)
    chat.assert_obeyed(first, tools, "auto", None)
    final = chat.ask(chat.body(with_tool_results(messages, first, spec["results"]), tools=tools), stream)
    assert_final_answer_uses_results(final, spec["expect_in_answer"])


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
    body = invalid_request_body(ml4_endpoint.model, DATA["errors"]["cases"][case])
    assert_invalid_request_refused(http_client, ml4_endpoint, ml4_target, case, body, DATA["errors"]["expect"],
                                   TOOLS_FILE, stream)
