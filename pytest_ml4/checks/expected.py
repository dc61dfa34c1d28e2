"""What each serving stack answers to a bad request, as data.

The suites' error checks read their expectations from ``fixtures/`` (``smoke/smoke.yaml``, ``prompts/tools.yaml``,
``prompts/reasoning.yaml``), one row per stack and case::

    errors:
      vllm:
        empty_tools: {status: 400, message_contains: "`tools` must not be an empty array", shape: nested}
      vllm+litellm: {inherits: vllm, ...}
      dynamo+vllm:
        empty_tools: {status: 400, message_contains: "tools array cannot be empty", shape: flat}

Row fields: ``status`` (int or list; ``200`` = the stack accepts the request), ``message_contains`` (str or list,
any of them, case-insensitive: wording differs in case between releases), ``shape`` (``nested``: vLLM's
``{"error": {"message", "type", "param", "code"}}`` with ``code`` = the HTTP status; ``flat``: Dynamo's
``{"message", "type", "code"}``), ``type``/``param`` (exact error fields), ``details`` (exact sub-fields of the flat
body's ``details``), ``body`` (the exact body), ``deviations`` (status -> what that answer means: a known defect
reported as such, quoting the answer), ``source`` (where the row comes from). A stack's ``inherits: OTHER`` takes
OTHER's rows for the cases it does not list.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_ml4.checks.codes import fail, fails_with, require
from pytest_ml4.client.endpoint import decode_json, quote_body
from pytest_ml4.client.stream_probe import StreamResult
from pytest_ml4.client.transport import DeadlineExceeded

ACCEPTED = 200
_ROW_KEYS = {"status", "message_contains", "shape", "type", "param", "details", "body", "deviations", "source"}


class ExpectationError(ValueError):
    """A malformed expectation row; the message names the file, stack and case."""


@dataclass(frozen=True)
class Expected:
    statuses: tuple[int, ...]
    message_contains: tuple[str, ...] = ()
    shape: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)
    body: Any = None
    deviations: Mapping[int, str] = field(default_factory=dict)
    source: str = ""

    @property
    def accepted(self) -> bool:
        return self.statuses == (ACCEPTED,)

    def describe(self) -> str:
        if self.accepted:
            return "200 (the stack accepts it)"
        wanted = " or ".join(repr(m) for m in self.message_contains)
        return "/".join(map(str, self.statuses)) + (f" mentioning {wanted}" if wanted else "")


def _tuple(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _row(raw: Any, where: str) -> Expected:
    if not isinstance(raw, Mapping) or "status" not in raw:
        raise ExpectationError(f"{where}: an expectation needs at least 'status', got {raw!r}")
    unknown = set(raw) - _ROW_KEYS
    if unknown:
        raise ExpectationError(f"{where}: unknown field(s) {sorted(unknown)} (known: {sorted(_ROW_KEYS)})")
    if raw.get("shape") not in (None, "flat", "nested"):
        raise ExpectationError(f"{where}: shape must be flat or nested, got {raw['shape']!r}")
    return Expected(statuses=tuple(int(s) for s in _tuple(raw["status"])),
                    message_contains=tuple(str(m) for m in _tuple(raw.get("message_contains"))),
                    shape=raw.get("shape"), fields={k: raw[k] for k in ("type", "param") if k in raw},
                    details=dict(raw.get("details") or {}), body=raw.get("body"),
                    deviations={int(k): str(v) for k, v in (raw.get("deviations") or {}).items()},
                    source=" ".join(str(raw.get("source", "")).split()))


def expected_for(table: Mapping[str, Any], stack: str, case: str, where: str | os.PathLike[str]) -> Expected:
    """The row for ``stack``/``case`` of an ``errors`` table, following ``inherits``; ``where`` names the file."""
    seen: list[str] = []
    current = stack
    while current not in seen:
        seen.append(current)
        rows = table.get(current)
        if not isinstance(rows, Mapping):
            raise ExpectationError(f"{where}: no expectations for stack {current!r} (stacks: {sorted(table)})")
        if case in rows:
            return _row(rows[case], f"{where}: errors.{current}.{case}")
        parent = rows.get("inherits")
        if parent is None:
            break
        current = str(parent)
    raise ExpectationError(f"{where}: no expectation for case {case!r} on stack {stack!r} (looked in {seen})")


@fails_with("answer.none", "a request got no HTTP answer")
def _answer(resp: httpx.Response | StreamResult, what: str) -> tuple[int, str, Any]:
    """Status, raw text and decoded JSON body (None for a 200) of a plain or streamed answer."""
    if isinstance(resp, StreamResult):
        require(resp.status_code is not None, "answer.none",
                lambda: f"{what}: stream from {resp.url}: no answer: {resp.transport_error}")
        code, text = resp.status_code, resp.http_error_text or ""
        if code == ACCEPTED:
            return code, resp.describe(), None
        if resp.http_error is not None:
            return code, text, resp.http_error
        fake = httpx.Response(code, text=text, headers={"content-type": resp.headers.get("content-type", "")},
                              request=httpx.Request("POST", resp.url or "http://unknown/"))
        return code, text, decode_json(fake, what)
    code, text = resp.status_code, resp.text
    return code, text, (decode_json(resp, what) if code != ACCEPTED else None)


@fails_with("answer.not_served", "a request the stack accepts was not served: an in-band error after the 200")
def assert_served(resp: httpx.Response | StreamResult, what: str) -> None:
    """Where a stack's row says it accepts a request, accepted must mean served: a stream that opened with 200 and
    then carried an in-band error (a worker failing the request) was not. Not part of :func:`assert_answer_expected`: a
    check that only tolerates a proxy's 200 and then asks the engine (tools' invalid requests) is not about it."""
    errors = resp.error_events if isinstance(resp, StreamResult) else []
    require(not errors, "answer.not_served", lambda: f"{what}: HTTP 200 but the stream carried an in-band error "
                                                     f"event: accepted, not served: {quote_body(json.dumps(errors[0]))}")


def error_object(body: Any) -> Mapping[str, Any]:
    """The error fields of a body in either shape (vLLM nested ``{"error": {...}}``, Dynamo flat)."""
    if isinstance(body, Mapping):
        err = body.get("error", body)
        if isinstance(err, Mapping):
            return err
        return {"message": str(err)}
    return {"message": str(body)}


def _shape_problems(body: Any, code: int, shape: str | None) -> list[str]:
    if shape is None:
        return []
    if not isinstance(body, Mapping):
        return [f"error body is not an object: {body!r}"]
    if shape == "nested":
        err = body.get("error")
        if not isinstance(err, Mapping):
            return [f"expected vLLM's nested {{\"error\": {{...}}}}, got keys {sorted(body)}"]
        return [] if err.get("code") == code else [f"error.code {err.get('code')!r} is not the HTTP status {code}"]
    if "error" in body:
        return [f"expected a flat {{\"message\", \"type\", \"code\"}} body, got a nested error: {body}"]
    missing = {"message", "type", "code"} - set(body)
    if missing:
        return [f"flat error body lacks {sorted(missing)}: {body}"]
    return [] if body.get("code") == code else [f"code {body.get('code')!r} is not the HTTP status {code}"]


@fails_with("answer.computed_not_refused",
            "a request that must be refused at validation was still computing at its deadline")
def answer_to_refuse(send: Callable[[], httpx.Response], what: str) -> httpx.Response:
    """The answer to a request the deployment must refuse at validation, before any prefill.

    A refusal costs the engine no GPU work, so a request still unanswered at its deadline is being computed: an
    over-long prompt a front cut to fit (``truncate_prompt_tokens`` added by a proxy) and prefilled in full. Said
    as that, not as a transport error; LiteLLM holds the response headers until the first token, so a stream
    would not answer sooner."""
    try:
        return send()
    except DeadlineExceeded as e:
        fail("answer.computed_not_refused", f"{what}: not refused: no answer before the deadline, so the deployment "
                                            f"is computing the prompt instead of refusing it ({e})")


@fails_with("answer.known_defect", "the answer is one a stack's row names as a known defect")
@fails_with("answer.refused", "a request the stack must accept was refused")
@fails_with("answer.accepted", "a request the stack must refuse was accepted (HTTP 200)")
@fails_with("answer.status", "a refusal with another HTTP status than the stack's")
@fails_with("answer.body", "a refusal's body differs from the stack's exact body")
@fails_with("answer.error_body", "a refusal's error body has the wrong shape, message or fields")
def assert_answer_expected(resp: httpx.Response | StreamResult, expected: Expected, what: str) -> Any:
    """Assert ``resp`` is what ``expected`` says the stack answers; returns the decoded error body (None for 200)."""
    code, text, body = _answer(resp, what)
    source = f" ({expected.source})" if expected.source else ""
    if code in expected.deviations:
        fail("answer.known_defect", f"{what}: HTTP {code}: {expected.deviations[code]}; the stack said "
                                    f"{quote_body(text)}{source}")
    if expected.accepted:
        require(code == ACCEPTED, "answer.refused",
                lambda: f"{what}: HTTP {code}, expected {expected.describe()}{source}: {quote_body(text)}")
        return None
    if code == ACCEPTED:
        fail("answer.accepted", f"{what}: accepted (HTTP 200: {quote_body(text)}); expected {expected.describe()}"
                                f"{source}")
    require(code in expected.statuses, "answer.status",
            lambda: f"{what}: HTTP {code}, expected {expected.describe()}{source}: {quote_body(text)}")
    if expected.body is not None:
        require(body == expected.body, "answer.body", lambda: f"{what}: body {body} != {expected.body}{source}")
        return body
    problems = _shape_problems(body, code, expected.shape)
    err = error_object(body)
    message = str(err.get("message", ""))
    wanted = [w.casefold() for w in expected.message_contains]
    # A proxy (LiteLLM) wraps the backend's JSON error as text, sometimes escaped: look in the raw text too.
    haystack = (message + "\n" + text + "\n" + json.dumps(body)).casefold()
    if wanted and not any(w in haystack for w in wanted):
        problems.append(f"message {quote_body(message)} mentions none of {list(expected.message_contains)}")
    for key, value in expected.fields.items():
        if err.get(key) != value:
            problems.append(f"error.{key} is {err.get(key)!r}, expected {value!r}")
    details = body.get("details") if isinstance(body, Mapping) else None
    for key, value in expected.details.items():
        got = details.get(key) if isinstance(details, Mapping) else None
        if got != value:
            problems.append(f"details.{key} is {got!r}, expected {value!r}")
    if problems:
        fail("answer.error_body", f"{what}: " + "; ".join(problems) + source)
    return body
