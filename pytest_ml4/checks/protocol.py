"""Protocol-level checks: control tokens, stream grammar, streamed == non-streamed, vLLM error bodies.

Control tokens are Mistral tokenizer specials that the reasoning and tool parsers must consume (reference
``vllm.md`` §3, §4.2, §3.1): when one reaches a client-visible field, the failure names the parser or layer
that let it through.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_ml4.checks.codes import fails_with, require
from pytest_ml4.checks.expected import Expected, assert_answer_expected, error_object
from pytest_ml4.client.endpoint import quote_body
from pytest_ml4.client.stream_probe import StreamResult

#: Each Mistral control token and the defect its appearance in client-visible output means.
CONTROL_TOKENS: dict[str, str] = {
    "[THINK]": "reasoning parser off",
    "[/THINK]": "reasoning parser off",
    "[TOOL_CALLS]": "tool parser off",
    "[ARGS]": "tool parser off",
    "[CALL_ID]": "tool parser off",
    "[MODEL_SETTINGS]": "model-settings block leaked (tokenizer/chat-template mismatch)",
    "[/MODEL_SETTINGS]": "model-settings block leaked (tokenizer/chat-template mismatch)",
}


#: Finish reasons a proxy may use interchangeably for an answer with tool calls.
TOOL_FINISH = frozenset({"stop", "tool_calls"})


def _excerpt(text: str, at: int, width: int = 60) -> str:
    lo = max(0, at - width)
    return repr(("..." if lo else "") + text[lo: at + width] + ("..." if at + width < len(text) else ""))


def visible_fields(message: Mapping[str, Any]) -> dict[str, str]:
    """Every client-visible string of an assistant message (non-streaming shape or :meth:`StreamResult.message`)."""
    out: dict[str, str] = {}
    for key in ("content", "reasoning", "reasoning_content", "refusal"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        for key in ("name", "arguments"):
            if isinstance(fn.get(key), str):
                out[f"tool_calls[{i}].function.{key}"] = fn[key]
        if isinstance(call.get("id"), str):
            out[f"tool_calls[{i}].id"] = call["id"]
    return out


def control_token_leaks(fields: Mapping[str, str]) -> list[str]:
    """One message per leaked token, e.g. ``reasoning parser off: '[THINK]' leaked into content: '...'``."""
    found: list[str] = []
    for name, text in fields.items():
        for token, defect in CONTROL_TOKENS.items():
            at = text.find(token)
            if at >= 0:
                found.append(f"{defect}: {token!r} leaked into {name}: {_excerpt(text, at)}")
    return found


@fails_with("protocol.control_tokens", "a control token (a parser's markup) leaked into a client-visible field")
def assert_no_control_tokens(message: Mapping[str, Any], where: str) -> None:
    leaks = control_token_leaks(visible_fields(message))
    require(not leaks, "protocol.control_tokens", lambda: f"{where}: " + "; ".join(leaks))


@fails_with("stream.no_answer", "a stream got no HTTP answer")
@fails_with("stream.http_status", "a stream was answered with other than HTTP 200")
@fails_with("stream.grammar",
            "the SSE stream breaks vLLM's grammar (no [DONE], events after it, malformed chunks, an in-band error)")
def assert_stream_clean(result: StreamResult, where: str | None = None) -> None:
    """HTTP 200, no grammar violation, no in-band error; the message (one line, naming the URL unless ``where``
    says otherwise) lists every problem found."""
    where = where or f"stream from {result.url or 'the endpoint'}"
    require(result.status_code is not None, "stream.no_answer",
            lambda: f"{where}: no answer: {result.transport_error or 'nothing arrived'}")
    require(result.status_code == 200, "stream.http_status",
            lambda: f"{where}: HTTP {result.status_code}: {quote_body(result.http_error_text or '')}")
    problems = list(result.violations)
    require(not problems, "stream.grammar", lambda: f"{where}: stream grammar violated: " + "; ".join(problems))


@dataclass
class Assembled:
    """What a client ends up with, normalised so a streamed and a non-streamed answer compare equal.

    ``None`` and ``""`` are the same for content/reasoning (the stream's role chunk always carries
    ``content: ""``, the non-streamed tool-call message has ``content: null``); ids are not compared (each
    request gets fresh ones).
    """

    content: str
    reasoning: str
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    tool_ids: list[str | None] = field(default_factory=list)
    finish_reason: str | None = None

    @classmethod
    def from_message(cls, message: Mapping[str, Any], finish_reason: str | None = None) -> Assembled:
        reasoning = message.get("reasoning")
        if reasoning is None:
            reasoning = message.get("reasoning_content")  # vLLM <= 0.11 name
        calls = message.get("tool_calls") or []
        return cls(content=message.get("content") or "", reasoning=reasoning or "",
                   tool_calls=[((c.get("function") or {}).get("name") or "",
                                (c.get("function") or {}).get("arguments") or "") for c in calls],
                   tool_ids=[c.get("id") for c in calls], finish_reason=finish_reason)

    @classmethod
    def from_completion(cls, completion: Any) -> Assembled:
        """From an openai SDK ``ChatCompletion`` (or its ``model_dump()``), first choice."""
        body = completion if isinstance(completion, Mapping) else completion.model_dump()
        choice = body["choices"][0]
        return cls.from_message(choice["message"], choice.get("finish_reason"))

    @classmethod
    def from_stream(cls, result: StreamResult) -> Assembled:
        return cls.from_message(result.message(), result.finish_reason)

    def differences(self, other: Assembled, lenient_tool_finish: bool = False) -> list[str]:
        """Human-readable differences (self = streamed, other = non-streamed by convention).

        ``lenient_tool_finish``: with tool calls present, ``stop`` and ``tool_calls`` count as the same finish
        reason (a LiteLLM proxy rewrites a named choice's ``stop`` to ``tool_calls`` only when not streaming).

        Reasoning is compared by presence, not text: at temperature 0 an engine with batching
        and speculative decoding does not guarantee the same thinking tokens run to run, and the reasoning text
        is not what a client acts on; whether the parser separated reasoning at all must agree, and the answer
        (content, tool calls, finish reason) must be the same.
        """
        out = []
        if bool(self.reasoning) != bool(other.reasoning):
            out.append(f"reasoning: streamed {'present' if self.reasoning else 'absent'}, non-streamed "
                       f"{'present' if other.reasoning else 'absent'} ({quote_body(self.reasoning or other.reasoning)})")
        for key in ("content", "finish_reason"):
            a, b = getattr(self, key), getattr(other, key)
            if key == "finish_reason" and lenient_tool_finish and self.tool_calls and {a, b} <= TOOL_FINISH:
                continue
            if a != b:
                out.append(f"{key}: streamed {quote_body(str(a))} vs non-streamed {quote_body(str(b))}")
        if [n for n, _ in self.tool_calls] != [n for n, _ in other.tool_calls]:
            out.append(f"tool names: streamed {[n for n, _ in self.tool_calls]} vs "
                       f"non-streamed {[n for n, _ in other.tool_calls]}")
        else:
            for i, ((_, a), (_, b)) in enumerate(zip(self.tool_calls, other.tool_calls)):
                if a != b:
                    out.append(f"tool_calls[{i}].arguments: streamed {quote_body(a)} vs non-streamed {quote_body(b)}")
        return out


@fails_with("protocol.stream_differs", "a streamed answer assembles differently from the same request non-streamed")
def assert_stream_equals_non_stream(streamed: Assembled, whole: Assembled, lenient_tool_finish: bool = False) -> None:
    diffs = streamed.differences(whole, lenient_tool_finish)
    require(not diffs, "protocol.stream_differs",
            lambda: "streamed assembly differs from the non-streamed answer: " + "; ".join(diffs))


def error_message(body: Any) -> str:
    """The message of an error body in any of the shapes met: vLLM ``{"error": {...}}``, vLLM <= 0.10 flat
    ``{"object": "error", "message": ...}``, Dynamo's flat ``{"message", "type", "code"}``, vLLM's auth middleware
    ``{"error": "Unauthorized"}``, LiteLLM."""
    return str(error_object(body).get("message", ""))


def assert_rejected(resp: httpx.Response | StreamResult, status: int, message_contains: str, what: str) -> None:
    """The request was refused with ``status`` and a JSON error whose message contains ``message_contains``
    (case-insensitive; a proxy's wrapped JSON text counts). The suites read per-stack rows from fixtures and call
    :func:`pytest_ml4.checks.expected.assert_answer_expected` directly."""
    assert_answer_expected(resp, Expected(statuses=(status,), message_contains=(message_contains,)), what)
