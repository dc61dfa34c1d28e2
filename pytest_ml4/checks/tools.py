"""Tool-calling checks (reference ``vllm.md`` §4): Mistral call ids, arguments against the tool's JSON schema,
which tool ``tool_choice`` should produce, and the ``finish_reason`` / ``content`` rules that go with it; the
:class:`ToolChat` that asks ``suites/test_tools.py``'s questions on a serving stack, and the verdicts on its answers
(parallel calls, a tool result used in the final answer, invalid tool requests refused in the stack's words).

Tool schemas are data: ``pytest_ml4/data/tools/<name>.json`` in OpenAI ``tools`` form.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, field_validator

from pytest_ml4.checks.chat import (
    Answer,
    BadRequest,
    ChatSession,
    send_raw,
    served_by_litellm,
    user,
)
from pytest_ml4.checks.codes import Violation, fail, fails_with, require
from pytest_ml4.checks.expected import assert_answer_expected
from pytest_ml4.checks.protocol import assert_no_control_tokens
from pytest_ml4.client.endpoint import decode_json, quote_body
from pytest_ml4.client.stream_probe import StreamResult
from pytest_ml4.datafile import Strict, read_json, validate
from pytest_ml4.evidence.worker_engine import WorkerEngine
from pytest_ml4.locations import data_file
from pytest_ml4.logs import GrammarSchemaRefused, LogView
from pytest_ml4.stacks import stack_for
from pytest_ml4.stacks.dynamo_versions import (
    ROW_PARSER,
    emulated_grammar_reason,
    guided_refusal_cause,
    tool_call_drop_cause,
)
from pytest_ml4.target.model import Target

if TYPE_CHECKING:
    from pytest_ml4.checks.suite_data import StackAnswers, ToolCase
    from pytest_ml4.client.deployment import Deployment

TOOLS_DIR = data_file("tools")


class ToolFunction(BaseModel):
    """The part of an OpenAI tool's ``function`` this code relies on: its ``name`` (which call answers which tool)
    and ``parameters``, a JSON schema object (the arguments are validated against it). ``description`` and any other
    key are OpenAI's, passed through."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1)
    parameters: dict[str, Any]

    @field_validator("parameters")
    @classmethod
    def _a_json_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            Draft202012Validator.check_schema(value)   # a broken fixture is our bug, say so early
        except SchemaError as err:
            raise ValueError(f"not a JSON schema: {' '.join(err.message.split())}") from None
        return value


class ToolEnvelope(Strict):
    """A tool file's envelope (``{"type": "function", "function": {...}}``); the schema body stays a dict."""

    type: Literal["function"]
    function: ToolFunction


def load_tool(name: str, directory: Path = TOOLS_DIR) -> dict[str, Any]:
    """One tool definition from ``pytest_ml4/data/tools/<name>.json``, exactly as the file has it (it is sent to
    the server as it is), once its envelope is checked; a broken one is a
    :class:`~pytest_ml4.datafile.DataFileError` naming the file, the line and the field."""
    path = directory / f"{name}.json"
    tool = read_json(path)
    validate(path, path.read_text(encoding="utf-8"), tool, ToolEnvelope)
    return tool


def load_tools(names: Iterable[str], directory: Path = TOOLS_DIR) -> list[dict[str, Any]]:
    return [load_tool(n, directory) for n in names]


def tool_name(tool: Mapping[str, Any]) -> str:
    return str((tool.get("function") or {}).get("name", ""))


def is_mistral_tool_id(value: Any) -> bool:
    """vLLM's ``MistralToolCall``: exactly 9 ASCII letters/digits (``vllm/parser/mistral.py``)."""
    return isinstance(value, str) and len(value) == 9 and value.isascii() and value.isalnum()


@dataclass(frozen=True)
class ToolConventions:
    """What a serving stack does with tool calls where the OpenAI contract leaves it open: the id format and a named
    ``tool_choice``'s finish_reason and content. Defaults: vLLM 0.33 (vllm.md §4.4); other stacks' rows live in
    ``pytest_ml4/data/prompts/tools.yaml`` ``conventions``."""

    id_pattern: str = r"[A-Za-z0-9]{9}"
    id_what: str = "Mistral ids (9 ASCII letters/digits)"
    id_why: str = ("the serving layer is not using the Mistral tool parser's ids (a Mistral tokenizer rejects them "
                   "on the next turn)")
    named_finish_reason: str = "stop"
    named_content: tuple[Any, ...] = ("",)
    source: str = "vllm.md §4.4"

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ToolConventions:
        fields = dict(row)
        if "named_content" in fields:
            fields["named_content"] = tuple(fields["named_content"])
        return cls(**fields)


VLLM_TOOLS = ToolConventions()


@fails_with("tools.bad_ids", "tool-call ids are not in the stack's format (vLLM: Mistral's 9 characters)")
@fails_with("tools.duplicate_ids", "two tool calls of one answer share an id")
def assert_mistral_tool_ids(calls: Sequence[Mapping[str, Any]], where: str,
                            conventions: ToolConventions = VLLM_TOOLS) -> None:
    """Ids in the stack's format (vLLM: Mistral's 9 characters) and unique."""
    bad = [c.get("id") for c in calls
           if not (isinstance(c.get("id"), str) and re.fullmatch(conventions.id_pattern, c["id"]))]
    require(not bad, "tools.bad_ids",
            lambda: f"{where}: tool-call ids {bad} are not {conventions.id_what}; {conventions.id_why}")
    ids = [c.get("id") for c in calls]
    require(len(set(ids)) == len(ids), "tools.duplicate_ids", lambda: f"{where}: duplicate tool-call ids {ids}")


@fails_with("tools.arguments_not_string", "a tool call's arguments are not a JSON string")
@fails_with("tools.invalid_json", "a tool call's arguments are not valid JSON")
def parse_arguments(call: Mapping[str, Any], where: str) -> Any:
    """``function.arguments`` parsed as JSON, or a failure naming the call and quoting the text."""
    fn = call.get("function") or {}
    raw = fn.get("arguments")
    require(isinstance(raw, str), "tools.arguments_not_string",
            lambda: f"{where}: arguments of {fn.get('name')!r} are not a JSON string: {raw!r}")
    try:
        return json.loads(raw)
    except ValueError as err:
        fail("tools.invalid_json", f"{where}: invalid JSON in tool-call arguments of {fn.get('name')!r} ({err}): "
                                   f"{quote_body(raw)}")


def schema_errors(arguments: Any, tool: Mapping[str, Any]) -> list[str]:
    schema = (tool.get("function") or {}).get("parameters") or {"type": "object"}
    validator = Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))]


@fails_with("tools.unknown_tool", "a tool call names a tool the request did not offer")
@fails_with("tools.schema_invalid", "a tool call's arguments do not validate against the tool's JSON schema")
def assert_arguments_valid(calls: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
                           where: str) -> list[Any]:
    """Every call names an offered tool and its arguments are JSON that validates against that tool's schema.

    Returns the parsed arguments, in call order.
    """
    by_name = {tool_name(t): t for t in tools}
    parsed = []
    for i, call in enumerate(calls):
        name = (call.get("function") or {}).get("name")
        if name not in by_name:
            fail("tools.unknown_tool",
                 f"{where}: tool call {i} names {name!r}, which is not among the offered tools {sorted(by_name)}")
        args = parse_arguments(call, where)
        errors = schema_errors(args, by_name[name])
        if errors:
            fail("tools.schema_invalid", f"{where}: arguments of {name!r} do not validate against its JSON schema: "
                                         + "; ".join(errors) + f" (arguments: {quote_body(json.dumps(args))})")
        parsed.append(args)
    return parsed


def expected_finish_reason(tool_choice: Any, made_calls: bool, named_finish_reason: str = "stop") -> str:
    """``resolve_finish_reason`` of vLLM 0.33: ``tool_calls`` only for produced calls under a non-named choice; a
    named choice gives ``named_finish_reason`` (vLLM ``stop``, the Dynamo frontend ``tool_calls``)."""
    if made_calls and isinstance(tool_choice, Mapping):
        return named_finish_reason
    if made_calls:
        return "tool_calls"
    return "stop"


def named(tool: str) -> dict[str, Any]:
    """A named ``tool_choice``."""
    return {"type": "function", "function": {"name": tool}}


@fails_with("tools.called_under_none", "tool_choice none, yet the model called a tool")
@fails_with("tools.no_content_under_none", "tool_choice none gave no content")
@fails_with("tools.no_call", "a tool call was due (auto on a matching prompt, required, named) and none came back")
@fails_with("tools.wrong_tool", "the model called another tool than the one the prompt or the named choice asks for")
@fails_with("tools.forced_call_content", "a forced tool call (required, named) came with content")
@fails_with("tools.finish_reason", "the finish_reason is not the one tool_choice and the calls made require")
def assert_tool_choice_obeyed(tool_choice: Any, message: Mapping[str, Any], finish_reason: str | None,
                              expect_tool: str | None, where: str, via_litellm: bool = False,
                              no_call_cause: str | None = None,
                              conventions: ToolConventions = VLLM_TOOLS) -> None:
    """The calls, content and finish_reason that ``tool_choice`` requires (vllm.md §4.4, §4.6).

    ``via_litellm``: LiteLLM 1.108.7 (observed in front of the simulator) reports ``tool_calls`` instead of
    vLLM's ``stop`` for a named choice when not streaming; that proxy rewrite is tolerated, nothing else.
    ``no_call_cause``: what a missing tool call means on this stack when it is known (a serving release whose
    parser drops the model's call format), said instead of the generic parser hint.
    """
    calls = message.get("tool_calls") or []
    names = [(c.get("function") or {}).get("name") for c in calls]
    content = message.get("content")
    if tool_choice == "none":
        require(not calls, "tools.called_under_none", lambda: f"{where}: tool_choice 'none' but the model called {names}")
        require(content, "tools.no_content_under_none", f"{where}: tool_choice 'none' gave no content")
    else:
        label = json.dumps(tool_choice) if isinstance(tool_choice, Mapping) else repr(tool_choice)
        hint = no_call_cause or "tool parser off or not enabled?"
        require(calls, "tools.no_call", lambda: f"{where}: tool_choice {label} but no tool call came back ({hint}); "
                                                f"content: {quote_body(str(content))}")
        if expect_tool is not None:
            require(set(names) == {expect_tool}, "tools.wrong_tool",
                    lambda: f"{where}: tool_choice {label} should call {expect_tool!r}, got {names}")
        if tool_choice == "required" or isinstance(tool_choice, Mapping):
            # Forced calls: content is "" rather than null (message_assembly.keeps_tool_calls). Under "auto" a
            # model may legitimately say something before calling, so content is not judged there.
            require(content in ("", None), "tools.forced_call_content",
                    lambda: f"{where}: forced tool call with content {quote_body(str(content))}")
    want = expected_finish_reason(tool_choice, bool(calls), conventions.named_finish_reason)
    if via_litellm and calls and isinstance(tool_choice, Mapping) and finish_reason == "tool_calls":
        return
    require(finish_reason == want, "tools.finish_reason", lambda: f"{where}: finish_reason {finish_reason!r}, "
                                                                  f"expected {want!r} for tool_choice {tool_choice!r} "
                                                                  f"with {len(calls)} call(s)")


@fails_with("tools.argument_value", "a tool call's argument differs from the value the prompt states")
def assert_expected_arguments(arguments: Mapping[str, Any], case: ToolCase, where: str) -> None:
    """The arguments carry the values the case's prompt states (its ``expect_args``)."""
    for key, value in (case.expect_args or {}).items():
        if arguments.get(key) != value:
            fail("tools.argument_value",
                 f"{where}: {case.expect_tool} argument {key!r} is {arguments.get(key)!r}, the prompt says {value!r}")


@fails_with("tools.named_content", "a named tool_choice gave other content than the stack's convention")
def assert_named_content(message: Mapping[str, Any], where: str, conventions: ToolConventions = VLLM_TOOLS) -> None:
    """A named ``tool_choice`` gives the content the stack's conventions name (vLLM: empty)."""
    allowed = conventions.named_content
    require(message.get("content") in allowed, "tools.named_content", lambda: (
        f"{where}: named tool_choice must give content {' or '.join(map(repr, allowed))} "
        f"({conventions.source}), got {message.get('content')!r}"))


@fails_with("tools.parallel_call_count", "a prompt asking for several things got another number of parallel calls")
@fails_with("tools.parallel_call_values", "the parallel calls lack the values the prompt asked about")
def assert_parallel_calls(arguments: Sequence[Mapping[str, Any]], expect_calls: int, expect_values: Sequence[str],
                          where: str) -> None:
    """One call per thing the prompt asks about, each with its value."""
    require(len(arguments) == expect_calls, "tools.parallel_call_count", lambda: f"{where}: expected {expect_calls} "
            f"parallel calls for {expect_values}, got {len(arguments)}: {arguments}")
    values = sorted(v for a in arguments for v in a.values() if isinstance(v, str))
    require(set(expect_values) <= set(values), "tools.parallel_call_values",
            lambda: f"{where}: parallel call arguments {arguments}")


@fails_with("tools.parallel_calls_not_filtered", "parallel_tool_calls=false still returned more than one call")
def assert_single_call(arguments: Sequence[Any], where: str) -> None:
    """``parallel_tool_calls=false`` keeps only the first call."""
    require(len(arguments) == 1, "tools.parallel_calls_not_filtered", lambda: f"{where}: parallel_tool_calls=false "
            f"must keep only the first call (maybe_filter_parallel_tool_calls), got {len(arguments)}: {arguments}")


@fails_with("tools.unexpected_tool", "the model called a tool the round trip has no result for")
def with_tool_results(messages: list[dict[str, Any]], first: Answer,
                      results: Mapping[str, str]) -> list[dict[str, Any]]:
    """The conversation after the model's calls: its assistant turn, then each call's canned result."""
    messages = messages + [{"role": "assistant", "content": first.message.get("content") or "",
                            "tool_calls": [{"id": c["id"], "type": "function", "function": c["function"]}
                                           for c in first.tool_calls]}]
    for call in first.tool_calls:
        name = call["function"]["name"]
        if name not in results:
            fail("tools.unexpected_tool", f"{first.where}: the model called {name!r}, no canned result for it")
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": results[name]})
    return messages


@fails_with("tools.called_again", "after the tool results the model called tools again instead of answering")
@fails_with("tools.final_finish_reason", "the final answer after the tool results did not finish with 'stop'")
@fails_with("tools.result_unused", "the final answer after the tool results does not use them")
def assert_final_answer_uses_results(final: Answer, expect_in_answer: Iterable[str]) -> None:
    """After the tool results the model answers (no further call, ``stop``) with what the results said."""
    assert_no_control_tokens(final.message, final.where)
    require(not final.tool_calls, "tools.called_again",
            lambda: f"{final.where}: the model called tools again instead of answering: {final.tool_calls}")
    require(final.finish_reason == "stop", "tools.final_finish_reason",
            lambda: f"{final.where}: final answer finish_reason {final.finish_reason!r}")
    missing = [needle for needle in expect_in_answer if needle not in final.content]
    require(not missing, "tools.result_unused", lambda: f"{final.where}: the final answer does not use the tool "
            f"result (missing {missing[0]!r}): {final.content!r}")


# ------------------------------------------------------------------------------ a chat with tools on a stack
#: The answer shows a request refused as invalid: non-streamed HTTP 400, streamed the in-band event with code 400
#: (how a release's guided-JSON grammar refusal reaches the client, real-dynamo-vllm.md "Guided tool choice").
ANSWERED_400 = re.compile(r'HTTP 400\b|["\']code["\']: ?400\b')
#: Mistral Large 4's v11 tool-call form in content: ``[TOOL_CALLS]name[ARGS]{`` (a parser left it as text).
V11_MARKUP = re.compile(r"\[TOOL_CALLS\][A-Za-z0-9_.-]+\[(?:CALL_ID\][A-Za-z0-9]*\[)?ARGS\]\s*\{")
TOOL_CALLS_MARK = "[TOOL_CALLS]"


@dataclass(frozen=True)
class GuidedCause:
    """Why a guided tool choice failed, as far as the evidence goes: ``proven`` when the answer (a 400) or the
    engine log (the grammar's ``Unimplemented keys`` line) shows the refusal; otherwise ``text`` lists the
    possible causes and says none is shown."""

    text: str
    proven: bool


def refusal_evidence(failure: str, logged: tuple[str, ...]) -> str | None:
    """What shows the grammar refused the request: the engine log's line naming the keywords, or a 400 answer;
    None when neither does (a 500, a timeout, a broken stream are not a refusal)."""
    if logged:
        return f"the engine log's 'Grammar error: Unimplemented keys: {list(logged)}'"
    if ANSWERED_400.search(failure):
        return "the 400 answer"
    return None


def no_call_verdict(where: str, tool_choice: Any, answer: Answer, parser_cause: str | None,
                    row_cause: str | None) -> str:
    """The message for an answer without the tool call ``tool_choice`` asks for on a stack whose configuration or
    versions row explains one: a cause only where the answer proves it, otherwise what came back and the causes it
    may have.

    * ``parser_cause``: the deployment declares a parser other than ``mistral`` (its own configuration says so).
    * content starting with ``[TOOL_CALLS]``: no ``mistral`` parser read it (one parses the call or, on 1.6.1, drops
      the v11 form whole: ``content: null``), so the workers run another parser or none, whatever is declared.
    * v11 markup later in content (after ``[/THINK]``): the form the row says the release's parser drops.
    """
    content = answer.message.get("content")
    text = str(content or "")
    came_back = (f"tool_choice {tool_choice!r} but no tool call came back (finish_reason {answer.finish_reason!r}; "
                 f"content: {quote_body(str(content))})")
    if parser_cause:
        return f"{where}: {came_back}: {parser_cause}"
    if text.lstrip().startswith(TOOL_CALLS_MARK):
        return (f"{where}: {came_back}: the content starts with the {TOOL_CALLS_MARK} markup unparsed, which a "
                f"`{ROW_PARSER}` tool parser never leaves (it parses the call, or drops a form it cannot read): "
                f"the workers run another tool-call parser or none, whatever the target declares; run them with "
                f"--dyn-tool-call-parser {ROW_PARSER}")
    if row_cause and V11_MARKUP.search(text):
        return f"{where}: {came_back}: {row_cause}"
    possible = [(f"the workers' tool-call parser is not `{ROW_PARSER}` or none is registered (the content would "
                 f"then usually hold the {TOOL_CALLS_MARK} markup)"), "the model answered without calling a tool"]
    if row_cause:
        possible.insert(0, row_cause)
    return (f"{where}: {came_back}; the answer shows no cause; possible causes: "
            + "; ".join(f"({i}) {c}" for i, c in enumerate(possible, 1)))


class ToolChat(ChatSession):
    """A chat that knows why the stack might return no tool call (the deployment's tool parser, or a Dynamo
    release whose ``mistral`` parser drops Mistral Large 4's ``[TOOL_CALLS]name[ARGS]{...}`` form) and why a
    guided tool choice may be refused (a schema keyword the release's grammar refuses), from
    ``pytest_ml4/data/dynamo/versions.yaml`` and the engine log. A cause is named only where the answer or the
    log proves it; otherwise the failure lists it among the possible causes."""

    #: Why no call comes back as the deployment's declared configuration says (a parser other than ``mistral``).
    parser_cause: str | None = None
    #: Why no call may come back per the release's versions row (its ``mistral`` parser drops the v11 form).
    row_drop_cause: str | None = None
    conventions: ToolConventions = VLLM_TOOLS
    dynamo_version: str | None = None
    logs: Any = None
    #: Why this run cannot judge the declared release's guided-JSON schema limits (its workers are another
    #: release emulating it), or None.
    grammar_not_judged: str | None = None
    #: The repository whose dynamo/versions.yaml rows take precedence (the target's root).
    versions_root: Path | None = None

    @property
    def no_call_cause(self) -> str | None:
        """Either cause, where one applies to the stack (the one the configuration states first)."""
        return self.parser_cause or self.row_drop_cause

    def on(self, target: Target, conventions: Mapping[str, Any] | None, worker_engine: WorkerEngine | None,
           logs: Any) -> ToolChat:
        """Follow ``target``'s stack: its row of ``conventions`` (``tools.yaml``) and, on a Dynamo release, why
        a call may not come back. ``worker_engine``: what real ``dynamo.vllm`` workers serve the run (the plugin's
        ``ml4_worker_engine``); ``logs``: the engine log reader, or None."""
        stack = stack_for(target)
        release = stack.release(target)  # a frontend's release (Dynamo's): its rows say what its parser drops
        if release:
            self.dynamo_version = release
            # The parser the deployment's workers run (what the target declares for --dyn-tool-call-parser).
            self.versions_root = target.root  # a team's dynamo/versions.yaml rows come first
            parser = target.engine.tool_call_parser
            cause = tool_call_drop_cause(self.dynamo_version, parser, self.versions_root)
            if parser == ROW_PARSER:
                self.row_drop_cause = cause
            else:
                self.parser_cause = cause
            self.logs = logs
            # The release the run's real dynamo.vllm workers are; none: the declared release (simulated worker, live).
            running = worker_engine.release() if worker_engine else (None, "")
            self.grammar_not_judged = emulated_grammar_reason(self.dynamo_version, *running)
        row = (conventions or {}).get(stack.name)
        if row:
            self.conventions = ToolConventions.from_row(row)
        return self

    @fails_with("tools.guided_refused",
                "a guided tool_choice (required, named) was refused because the grammar refused a keyword of the "
                "tools' schemas, shown by the 400 or the grammar's log line")
    def ask(self, body: dict[str, Any], stream: bool) -> Answer:
        started = time.time()
        try:
            return super().ask(body, stream)
        except AssertionError as err:
            failure = str(err).split(chr(10) + "assert ", 1)[0]
            cause = self.guided_refusal_cause(body, started, failure)
            if cause is None:
                raise
            # The cause goes before pytest's "assert ..." explanation of the stream check: it is the verdict.
            text = f"{failure}\n{cause.text}"
            if cause.proven:
                raise Violation("tools.guided_refused", text) from None
            if isinstance(err, Violation):
                raise Violation(err.code, text.removeprefix(f"[{err.code}] "), origin=err.origin) from None
            raise AssertionError(text) from None

    def guided_refusal_cause(self, body: dict[str, Any], since: float, failure: str = "") -> GuidedCause | None:
        """Why a guided tool choice failed where the release refuses a keyword of the tools' schemas: proven
        when the engine log names the keyword since the request or the answer (``failure``) is a 400, else the
        refusal listed as one possible cause; None for a stack, choice or schema the row does not concern."""
        if self.dynamo_version is None:
            return None
        logged = refused_keys_logged(self.logs, since)
        cause = guided_refusal_cause(self.dynamo_version, body.get("tool_choice"), body.get("tools") or [],
                                     lambda: logged, self.versions_root)
        if cause is None:
            return None
        evidence = refusal_evidence(failure, logged)
        if evidence is not None:
            return GuidedCause(f"{cause} (shown by {evidence})", True)
        return GuidedCause(
            f"not shown to be the grammar's refusal (no 400 answer, no 'Grammar error: Unimplemented keys' line in "
            f"the engine log since the request); possible causes: (1) the {cause.removeprefix('cause: ')}; "
            f"(2) the engine or the frontend failed the request for another reason (the failure above says what "
            f"came back)", False)

    @fails_with("tools.no_call")
    def assert_obeyed(self, answer: Answer, tools: list[dict[str, Any]], tool_choice: Any,
                      expect_tool: str | None) -> list[Any]:
        """The checks every answer with tools gets: no control tokens, ``tool_choice`` obeyed, the stack's ids,
        arguments valid against the schemas. Returns the parsed arguments."""
        where = answer.where
        if self.no_call_cause and not answer.tool_calls and tool_choice != "none":
            # Said first: the markup this release leaves in content would otherwise read as "tool parser off".
            raise Violation("tools.no_call", no_call_verdict(where, tool_choice, answer, self.parser_cause,
                                                             self.row_drop_cause))
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


# ------------------------------------------------------------------------------------- invalid tool requests
def invalid_tool_request(model: str, case: str, fields: Mapping[str, Any], stream: bool) -> BadRequest:
    """A request of ``tools.yaml`` ``errors.cases``: a weather question carrying the case's ``fields``
    (``tools_from`` names the tools it offers)."""
    body: dict[str, Any] = {"model": model, "messages": user("What is the weather in Paris?"),
                            "max_tokens": 64, **{k: v for k, v in fields.items() if k != "tools_from"}}
    if "tools_from" in fields:
        body["tools"] = load_tools(fields["tools_from"])
    return BadRequest(case, body, stream, label=case)


@fails_with("tools.called_without_tools", "a request without tools that the stack accepts got a tool call")
@fails_with("tools.engine_unreachable",
            "the engine behind the proxy cannot be reached to ask it to refuse what the proxy served")
def assert_invalid_request_refused(ml4: Deployment, request: BadRequest, answers: StackAnswers) -> None:
    """The stack answers ``request`` as its row of ``answers`` (``tools.yaml`` ``errors.expect``) says; an accepted
    request without tools calls no tool; one a LiteLLM proxy served is then sent to the engine behind it, which
    must refuse it in the engine's words."""
    target, endpoint, body, what = ml4.target, ml4.endpoint, request.body, request.what
    stack = stack_for(target)
    expected = answers.expected(stack.name, request.case)
    resp = send_raw(ml4.http, body, request.stream)
    assert_answer_expected(resp, expected, what)
    if expected.accepted and not body.get("tools"):
        message = (resp.message() if isinstance(resp, StreamResult)
                   else decode_json(resp, what)["choices"][0]["message"])
        require(not message.get("tool_calls"), "tools.called_without_tools",
                lambda: f"{what}: no tools were sent yet the model called {message}")
    if expected.accepted and served_by_litellm(resp.headers):
        engine_root = endpoint.engine_root_url
        require(engine_root != endpoint.root_url, "tools.engine_unreachable", lambda: (
            f"{what}: the proxy served it; to check the engine refuses it set {target.endpoint.metrics_url_env} "
            f"to the engine's /metrics URL"))
        engine_expected = answers.expected(stack.engine, request.case)
        engine_body = {**body, "model": target.serving.engine_served_model_name or body["model"]}
        with httpx.Client(base_url=engine_root + "/v1/", headers=endpoint.auth_headers(), timeout=60) as engine:
            resp = send_raw(engine, engine_body, request.stream)
        assert_answer_expected(resp, engine_expected, f"{what} at the engine behind the proxy")
