"""The simulator's deterministic "model": what it thinks, says and calls for a chat request.

It answers simple arithmetic correctly, answers from tool results when the conversation ends with ``tool``
messages, calls the best-matching tool when tools are offered, and otherwise replies with a readiness sentence.
Unless ``reasoning_effort`` is ``"none"`` it thinks first, longer for higher effort.  Texts come from
``pytest_ml4/data/sim/responder.json``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field

from pytest_ml4.datafile import Strict, load_json
from pytest_ml4.evidence.tokenizer import message_text
from pytest_ml4.locations import data_file
from pytest_ml4_sim.sim import toolgen
from pytest_ml4_sim.sim.faults import ActiveFaults

RESPONDER_DATA = data_file("sim", "responder.json")

_ARITH = re.compile(r"(-?\d+(?:\.\d+)?)\s*(\+|-|\*|/|x|×|÷|plus|minus|times|multiplied by|divided by)\s*(-?\d+(?:\.\d+)?)",
                    re.IGNORECASE)
_OPS = {"+": "+", "plus": "+", "-": "-", "minus": "-", "*": "*", "x": "*", "×": "*", "times": "*",
        "multiplied by": "*", "/": "/", "÷": "/", "divided by": "/"}


@dataclass
class ToolCallPlan:
    name: str
    arguments: str


@dataclass
class Plan:
    """Raw model output before tokenisation: reasoning (None = no thinking), content, tool calls."""

    reasoning: str | None
    content: str
    tool_calls: list[ToolCallPlan] = field(default_factory=list)
    #: Deterministic reasoning share (0.52-0.66) used when output is padded to a fixed length.
    reasoning_share: float = 0.58
    #: Reasoning tokens the model writes beyond the plan's reasoning text (``reasoning_len``: a model that thinks
    #: at length, still longer at a higher effort); None: as long as the plan's reasoning text.
    reasoning_len: int | None = None
    #: Change of the reasoning share of an answer that is not padded (``reasoning_share_shift``).
    share_shift: float = 0.0


class ResponderData(Strict):
    """``pytest_ml4/data/sim/responder.json``: what the simulated model says (its ``_about`` says how)."""

    about: str = Field(alias="_about")
    readiness: str
    arithmetic_answer: str
    tool_result_answer: str
    tool_result_unseen_answer: str
    reasoning_sentences_by_effort: dict[str, int]
    default_effort: str
    #: Reasoning sentences by the kind of question (``arithmetic``, ``tool``, ``tool_result``, ``general``).
    reasoning: dict[str, list[str]]
    reasoning_filler: str
    content_filler: str
    stop_words: frozenset[str]


@lru_cache(maxsize=4)
def load_data(path: Path = RESPONDER_DATA) -> ResponderData:
    return load_json(path, ResponderData)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def arithmetic(text: str) -> dict[str, str] | None:
    """``{"a", "op", "b", "result"}`` for the first ``a <op> b`` in ``text``, else None."""
    m = _ARITH.search(text)
    if not m:
        return None
    a, op, b = float(m.group(1)), _OPS[m.group(2).lower()], float(m.group(3))
    if op == "/" and b == 0:
        return None
    result = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0.0}[op]
    return {"a": _fmt(a), "op": op, "b": _fmt(b), "result": _fmt(result)}


def _last_user_text(messages: list[Any]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return message_text(m)
    return ""


def _trailing_tool_results(messages: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "tool":
            out.append(m)
        else:
            break
    return list(reversed(out))


def _tool_name_for(messages: list[Any], call_id: str | None) -> str:
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant":
            for tc in m.get("tool_calls") or []:
                if call_id is None or tc.get("id") == call_id:
                    return str((tc.get("function") or {}).get("name", "the tool"))
    return "the tool"


def _share(seed_text: str) -> float:
    # Stable per prompt, spread over the inside of the seed's observed 50-68% band (52-66%, so rounding and
    # the two marker tokens never push a measured share across the band's edges).
    h = int(hashlib.sha256(seed_text.encode()).hexdigest()[:8], 16)
    return 0.52 + (h % 15) / 100.0


def _reasoning(kind: str, effort: str, fill: dict[str, str]) -> str:
    data = load_data()
    n = data.reasoning_sentences_by_effort.get(effort, 2)
    sentences = data.reasoning[kind][:n]
    return " ".join(s.format(**fill) for s in sentences)


def plan_response(body: dict[str, Any], tool_choice: Any, faults: ActiveFaults | None = None) -> Plan:
    """Decide what the model outputs for a validated request; ``tool_choice`` is already resolved.

    Every server that answers chat requests (the vLLM-style server, the Dynamo workers) passes its faults, so
    answer-level faults (``accuracy_drop``) behave the same on every stack."""
    plan = _plan(body, tool_choice, faults)
    drop = faults.value("accuracy_drop") if faults is not None and faults.has("accuracy_drop") else 0.0
    if faults is not None and faults.has("reasoning_share_shift"):
        # Thinking takes more (or less) of a fixed-length answer, as after a template or effort-default change.
        shift = faults.value("reasoning_share_shift")
        plan = replace(plan, reasoning_share=min(max(plan.reasoning_share + shift, 0.0), 0.98), share_shift=shift)
    if faults is not None and faults.has("reasoning_len") and plan.reasoning is not None:
        n = int(faults.value("reasoning_len"))
        plan = replace(plan, reasoning=None) if n <= 0 else replace(plan, reasoning_len=n)
    return degrade(plan, body, tool_choice, drop) if drop > 0 else plan


def _has(faults: ActiveFaults | None, name: str) -> bool:
    return faults is not None and faults.has(name)


def _plan(body: dict[str, Any], tool_choice: Any, faults: ActiveFaults | None = None) -> Plan:
    data = load_data()
    messages = body.get("messages") or []
    user = _last_user_text(messages)
    effort = body.get("reasoning_effort") or data.default_effort
    thinks = effort != "none"
    tools = body.get("tools") or []
    stop = data.stop_words
    share = _share(user)

    results = _trailing_tool_results(messages)
    if results:
        name = _tool_name_for(messages, results[0].get("tool_call_id"))
        text = " ".join(message_text(r) for r in results).strip()
        reasoning = _reasoning("tool_result", effort, {"tool": name}) if thinks else None
        if _has(faults, "tool_result_ignored"):   # the results never reached the prompt
            return Plan(reasoning, data.tool_result_unseen_answer.format(tool=name), [], share)
        return Plan(reasoning, data.tool_result_answer.format(tool=name, result=text), [], share)

    tool = _choose_tool(tools, tool_choice, user, stop)
    if tool is not None:
        exclude = set(toolgen.words(toolgen.tool_name(tool)))
        facts = toolgen.PromptFacts.of(user, stop, exclude)
        calls = [ToolCallPlan(toolgen.tool_name(tool), json.dumps(args, ensure_ascii=False))
                 for args in toolgen.generate_calls(tool, facts)]
        if _has(faults, "parallel_calls_collapsed"):
            calls = calls[:1]
        reasoning = _reasoning("tool", effort, {"tool": toolgen.tool_name(tool)}) if thinks else None
        return Plan(reasoning, "", calls, share)

    arith = arithmetic(user)
    if arith and _has(faults, "wrong_answer"):
        arith = {**arith, "result": _fmt(float(arith["result"]) + 1)}
    if arith:
        reasoning = _reasoning("arithmetic", effort, arith) if thinks else None
        return Plan(reasoning, data.arithmetic_answer.format(**arith), [], share)
    reasoning = _reasoning("general", effort, {}) if thinks else None
    return Plan(reasoning, data.readiness, [], share)


def _choose_tool(tools: list[dict[str, Any]], tool_choice: Any, prompt: str,
                 stop: frozenset[str]) -> dict[str, Any] | None:
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        wanted = (tool_choice.get("function") or {}).get("name")
        return next((t for t in tools if toolgen.tool_name(t) == wanted), None)
    best = toolgen.pick_tool(tools, prompt, stop)
    if best is None and tool_choice == "required":
        return tools[0]
    return best


def _unit(*parts: str) -> float:
    """A stable number in [0, 1) for the given strings (same request -> same decision, run after run)."""
    return int(hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12], 16) / float(1 << 48)


def _perturb(value: Any) -> Any:
    # The kind of damage changed numerics do: a number off by one, a string altered, a flag flipped.
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + " (approx.)"
    if isinstance(value, list):
        return [_perturb(value[0]), *value[1:]] if value else ["?"]
    if isinstance(value, dict):
        return {k: _perturb(v) if i == 0 else v for i, (k, v) in enumerate(value.items())} or {"?": "?"}
    return "?"


def _corrupt_call(call: ToolCallPlan) -> ToolCallPlan:
    args = json.loads(call.arguments)
    if not isinstance(args, dict) or not args:
        return ToolCallPlan(call.name + "_v2", call.arguments)
    first = next(iter(args))
    return ToolCallPlan(call.name, json.dumps({**args, first: _perturb(args[first])}, ensure_ascii=False))


def degrade(plan: Plan, body: dict[str, Any], tool_choice: Any, fraction: float) -> Plan:
    """Fault ``accuracy_drop=P``: a deterministic fraction P of the answers goes wrong. A call gets a wrong
    argument value (or name); a reply that called nothing calls an offered tool anyway (a spurious call), so
    relevance detection degrades as well. Which answers is fixed by a hash of the request's user text."""
    user = _last_user_text(body.get("messages") or [])
    if plan.tool_calls:
        calls = [_corrupt_call(c) if _unit(user, str(i), c.name) < fraction else c
                 for i, c in enumerate(plan.tool_calls)]
        return replace(plan, tool_calls=calls)
    tools = body.get("tools") or []
    if not tools or tool_choice == "none" or _unit(user, "spurious") >= fraction:
        return plan
    tool = tools[0]
    args = toolgen.ArgGenerator(toolgen.PromptFacts.of(user, frozenset(), set()), None).object(
        (tool.get("function") or {}).get("parameters") or {})
    return replace(plan, content="",
                   tool_calls=[ToolCallPlan(toolgen.tool_name(tool), json.dumps(args, ensure_ascii=False))])
