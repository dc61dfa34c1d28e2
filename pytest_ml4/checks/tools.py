"""Tool-calling checks (reference ``vllm.md`` §4): Mistral call ids, arguments against the tool's JSON schema,
which tool ``tool_choice`` should produce, and the ``finish_reason`` / ``content`` rules that go with it.

Tool schemas are data: ``pytest_ml4/data/tools/<name>.json`` in OpenAI ``tools`` form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from pytest_ml4.client import quote_body
from pytest_ml4.locations import data_file

TOOLS_DIR = data_file("tools")


def load_tool(name: str, directory: Path = TOOLS_DIR) -> dict[str, Any]:
    """One tool definition (``{"type": "function", "function": {...}}``) from ``pytest_ml4/data/tools/<name>.json``."""
    path = directory / f"{name}.json"
    tool = json.loads(path.read_text())
    Draft202012Validator.check_schema(tool["function"]["parameters"])  # a broken fixture is our bug, say so early
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


def assert_mistral_tool_ids(calls: Sequence[Mapping[str, Any]], where: str,
                            conventions: ToolConventions = VLLM_TOOLS) -> None:
    """Ids in the stack's format (vLLM: Mistral's 9 characters) and unique."""
    bad = [c.get("id") for c in calls
           if not (isinstance(c.get("id"), str) and re.fullmatch(conventions.id_pattern, c["id"]))]
    assert not bad, f"{where}: tool-call ids {bad} are not {conventions.id_what}; {conventions.id_why}"
    ids = [c.get("id") for c in calls]
    assert len(set(ids)) == len(ids), f"{where}: duplicate tool-call ids {ids}"


def parse_arguments(call: Mapping[str, Any], where: str) -> Any:
    """``function.arguments`` parsed as JSON, or a failure naming the call and quoting the text."""
    fn = call.get("function") or {}
    raw = fn.get("arguments")
    assert isinstance(raw, str), f"{where}: arguments of {fn.get('name')!r} are not a JSON string: {raw!r}"
    try:
        return json.loads(raw)
    except ValueError as err:
        raise AssertionError(f"{where}: invalid JSON in tool-call arguments of {fn.get('name')!r} ({err}): "
                             f"{quote_body(raw)}") from None


def schema_errors(arguments: Any, tool: Mapping[str, Any]) -> list[str]:
    schema = (tool.get("function") or {}).get("parameters") or {"type": "object"}
    validator = Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))]


def assert_arguments_valid(calls: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
                           where: str) -> list[Any]:
    """Every call names an offered tool and its arguments are JSON that validates against that tool's schema.

    Returns the parsed arguments, in call order.
    """
    by_name = {tool_name(t): t for t in tools}
    parsed = []
    for i, call in enumerate(calls):
        name = (call.get("function") or {}).get("name")
        assert name in by_name, f"{where}: tool call {i} names {name!r}, which is not among the offered tools {sorted(by_name)}"
        args = parse_arguments(call, where)
        errors = schema_errors(args, by_name[name])
        assert not errors, (f"{where}: arguments of {name!r} do not validate against its JSON schema: "
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
        assert not calls, f"{where}: tool_choice 'none' but the model called {names}"
        assert content, f"{where}: tool_choice 'none' gave no content"
    else:
        label = json.dumps(tool_choice) if isinstance(tool_choice, Mapping) else repr(tool_choice)
        hint = no_call_cause or "tool parser off or not enabled?"
        assert calls, (f"{where}: tool_choice {label} but no tool call came back ({hint}); "
                       f"content: {quote_body(str(content))}")
        if expect_tool is not None:
            assert set(names) == {expect_tool}, f"{where}: tool_choice {label} should call {expect_tool!r}, got {names}"
        if tool_choice == "required" or isinstance(tool_choice, Mapping):
            # Forced calls: content is "" rather than null (message_assembly.keeps_tool_calls). Under "auto" a
            # model may legitimately say something before calling, so content is not judged there.
            assert content in ("", None), f"{where}: forced tool call with content {quote_body(str(content))}"
    want = expected_finish_reason(tool_choice, bool(calls), conventions.named_finish_reason)
    if via_litellm and calls and isinstance(tool_choice, Mapping) and finish_reason == "tool_calls":
        return
    assert finish_reason == want, (f"{where}: finish_reason {finish_reason!r}, expected {want!r} for tool_choice "
                                   f"{tool_choice!r} with {len(calls)} call(s)")
