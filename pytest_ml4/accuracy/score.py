"""Scoring one reply the way BFCL does: its ``tool_calls`` in BFCL's call format, judged by BFCL's checker."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pytest_ml4.accuracy.bfcl import CHECKER_MODEL, Bfcl, category_specs
from pytest_ml4.accuracy.data import Item


@dataclass(frozen=True)
class ItemResult:
    id: str
    category: str
    valid: bool
    #: BFCL's ``error_type`` (e.g. ``value_error:others``) or this module's for what BFCL never sees
    #: (``http_error:500``, ``decode_error:arguments``, ``relevance:...``).
    error_type: str = ""
    errors: list[str] = field(default_factory=list)
    question: str = ""
    expected: Any = None
    got: Any = None


def calls_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """``[{name: {arg: value}}]`` from an OpenAI message's ``tool_calls``; ValueError when arguments are not
    a JSON object (BFCL's decoder would fail the item the same way)."""
    out: list[dict[str, Any]] = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {}
        raw = fn.get("arguments") or "{}"
        args = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(args, dict):
            raise ValueError(f"arguments of {fn.get('name')!r} are not a JSON object: {raw!r}")  # noqa: TRY004 - one error type for every undecodable reply
        out.append({str(fn.get("name", "")): args})
    return out


def _question(item: Item) -> str:
    return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in item.messages)


def score_reply(bfcl: Bfcl, item: Item, message: dict[str, Any], answer: list[dict[str, Any]] | None) -> ItemResult:
    """One item's verdict from the reply's message (``choices[0].message``)."""
    base = {"id": item.id, "category": item.category, "question": _question(item), "expected": answer}
    try:
        calls = calls_of(message)
    except ValueError as e:
        return ItemResult(valid=False, error_type="decode_error:arguments", errors=[str(e)],
                          got=message.get("tool_calls"), **base)
    scoring = category_specs()[item.category].scoring
    if scoring == "no_call":
        ok = not calls
        return ItemResult(valid=ok, error_type="" if ok else "irrelevance:called_a_function",
                          got=calls or message.get("content"), **{**base, "expected": "no function call"})
    if scoring == "any_call":
        ok = bool(calls)
        return ItemResult(valid=ok, error_type="" if ok else "relevance:no_function_call",
                          got=calls or message.get("content"), **{**base, "expected": "at least one function call"})
    if not calls:
        return ItemResult(valid=False, error_type="ast_decoder:no_function_call", errors=["no tool_calls in reply"],
                          got=message.get("content"), **base)
    verdict = bfcl.ast_checker(item.functions, calls, answer, bfcl.language_python, item.category, CHECKER_MODEL)
    return ItemResult(valid=bool(verdict["valid"]), error_type=str(verdict.get("error_type") or ""),
                      errors=[str(e) for e in verdict.get("error") or []], got=calls, **base)


def failed_request(item: Item, answer: list[dict[str, Any]] | None, kind: str, detail: str) -> ItemResult:
    """An item whose request failed (HTTP error, bad body): it counts as wrong, as a user would see it."""
    return ItemResult(item.id, item.category, False, kind, [detail], _question(item), answer, None)
