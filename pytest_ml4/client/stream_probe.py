"""Stream probe: send one streaming chat completion and record exactly what came over the wire.

Every SSE event is kept with its ``time.monotonic()`` timestamp and raw text. The probe assembles what a client
would see (content, reasoning, tool calls, finish reasons, usage), measures TTFT and inter-token latencies, and
checks the stream *grammar* of vLLM 0.33 (reference ``vllm.md`` §1.4, §1.5, §2, §4.5; ``tooling.md`` §3.6):

* the first chunk is the role chunk; each choice has exactly one ``finish_reason``; nothing follows it;
* a usage chunk (``choices: []``) comes after the finish chunk when ``stream_options.include_usage`` is set,
  and with ``continuous_usage_stats`` every chunk carries usage;
* ``data: [DONE]`` is last and nothing follows it;
* in-band ``{"error": ...}`` events (vLLM after the headers were sent, LiteLLM when the backend dies
  mid-stream) are caught, as are ids/models that change between chunks and unparsable events.

Problems land in ``StreamResult.violations`` (one readable line each); HTTP errors are captured with status
and body instead of raising. :func:`parse_sse_text` runs the same logic on a recorded transcript, so the
probe is tested on the reference transcripts without a server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_ml4.client.urls import display_url

#: How much of an odd payload a violation quotes.
_QUOTE = 200
#: How much of an HTTP error body the result keeps.
_ERROR_BODY_KEPT = 64 * 1024


@dataclass
class SSEEvent:
    """One SSE event: its arrival time, the raw ``data`` text, and the parsed JSON (None for ``[DONE]``)."""

    t: float
    raw: str
    data: Any = None
    done: bool = False
    event: str | None = None

    @property
    def is_error(self) -> bool:
        return isinstance(self.data, dict) and "error" in self.data and "choices" not in self.data


@dataclass
class ToolCallAssembly:
    """A tool call put together from its streamed deltas (keyed by ``index``)."""

    index: int
    id: str | None = None
    type: str | None = None
    name: str = ""
    arguments: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ChoiceAssembly:
    index: int
    role: str | None = None
    content: str = ""
    content_seen: bool = False
    reasoning: str = ""
    reasoning_seen: bool = False
    tool_calls: dict[int, ToolCallAssembly] = field(default_factory=dict)
    finish_reasons: list[str] = field(default_factory=list)
    stop_reasons: list[Any] = field(default_factory=list)


@dataclass
class StreamResult:
    """Everything the probe saw for one streamed request."""

    request: dict[str, Any] = field(default_factory=dict)
    url: str = ""
    status_code: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    http_error_text: str | None = None
    http_error: Any = None
    transport_error: str | None = None
    t_start: float = 0.0
    t_headers: float | None = None
    t_end: float | None = None
    events: list[SSEEvent] = field(default_factory=list)
    choices: dict[int, ChoiceAssembly] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    usage_history: list[dict[str, Any]] = field(default_factory=list)
    error_events: list[Any] = field(default_factory=list)
    reasoning_fields: set[str] = field(default_factory=set)
    token_times: list[float] = field(default_factory=list)
    tokens_per_chunk: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    system_fingerprint: str | None = None
    #: "vllm": the usage chunk has ``choices: []``; "proxy": LiteLLM's ``choices: [{"delta": {}}]`` form.
    usage_chunk_form: str = "vllm"
    done: bool = False
    violations: list[str] = field(default_factory=list)

    # -- views used by checks -------------------------------------------------------------------------------
    def _choice0(self) -> ChoiceAssembly:
        return self.choices.get(0) or ChoiceAssembly(index=0)

    @property
    def ok(self) -> bool:
        return self.status_code == 200 and not self.violations and self.transport_error is None

    @property
    def http_status(self) -> int | None:
        """Alias of ``status_code``."""
        return self.status_code

    @property
    def error_body(self) -> str | None:
        """The body of a non-200 answer (alias of ``http_error_text``)."""
        return self.http_error_text

    @property
    def content(self) -> str:
        return self._choice0().content

    @property
    def reasoning(self) -> str:
        return self._choice0().reasoning

    @property
    def tool_calls(self) -> list[ToolCallAssembly]:
        calls = self._choice0().tool_calls
        return [calls[i] for i in sorted(calls)]

    @property
    def finish_reasons(self) -> list[str]:
        return list(self._choice0().finish_reasons)

    @property
    def finish_reason(self) -> str | None:
        reasons = self._choice0().finish_reasons
        return reasons[-1] if reasons else None

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.t_start if self.token_times else None

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def data_events(self) -> list[SSEEvent]:
        return [e for e in self.events if not e.done]

    def message(self) -> dict[str, Any]:
        """The assembled assistant message, shaped like a non-streaming ``choices[0].message``."""
        c = self._choice0()
        return {"role": c.role, "content": c.content if c.content_seen else None,
                "reasoning": c.reasoning if c.reasoning_seen else None,
                "tool_calls": [t.as_dict() for t in self.tool_calls]}

    def describe(self) -> str:
        """One line for failure messages: status, event count, finish, violations."""
        if self.status_code != 200 and self.status_code is not None:
            return f"HTTP {self.status_code}: {_quote(self.http_error_text or '')}"
        bits = [f"HTTP {self.status_code}", f"{len(self.events)} events", f"finish={self.finish_reasons}",
                f"[DONE]={'yes' if self.done else 'no'}"]
        if self.transport_error:
            bits.append(f"transport error: {self.transport_error}")
        if self.violations:
            bits.append("violations: " + "; ".join(self.violations))
        return ", ".join(bits)

    def to_transcript(self) -> str:
        """The SSE exchange as text for report attachments: request, status, each event with its offset."""
        head = [f"POST {self.url}", "request: " + json.dumps(self.request, ensure_ascii=False),
                f"HTTP {self.status_code} {self.headers.get('content-type', '')}".rstrip()]
        if self.http_error_text is not None:
            head.append(self.http_error_text)
        lines = [f"[+{e.t - self.t_start:8.3f}s] " + (f"event: {e.event} " if e.event else "") + f"data: {e.raw}"
                 for e in self.events]
        tail = []
        if self.transport_error:
            tail.append(f"transport error: {self.transport_error}")
        tail += [f"violation: {v}" for v in self.violations]
        return "\n".join(head + lines + tail) + "\n"


def _quote(text: str) -> str:
    flat = " ".join(str(text).split())
    return repr(flat[:_QUOTE] + ("..." if len(flat) > _QUOTE else ""))


# -- SSE framing ---------------------------------------------------------------------------------------------

class _SSEFramer:
    """Turns lines into events. Standard SSE (events end at a blank line), plus one tolerance: a ``data:`` line
    that follows a *complete* payload starts a new event, so transcripts recorded one-event-per-line (as in
    the reference folder) parse too. A real vLLM stream always separates events with a blank line."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event: str | None = None
        self._t: float = 0.0
        #: Lines that are not SSE at all (an HTML error page served with status 200), kept for quoting.
        self.stray: list[str] = []

    def feed(self, line: str, t: float) -> list[tuple[float, str, str | None]]:
        out: list[tuple[float, str, str | None]] = []
        if line == "":
            out += self.flush()
            return out
        if line.startswith(":"):
            return out  # SSE comment / keep-alive
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            if self._data and _complete("\n".join(self._data)):
                out += self.flush()
            if not self._data:
                self._t = t
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name not in ("id", "retry"):
            self.stray.append(line)
        return out

    def flush(self) -> list[tuple[float, str, str | None]]:
        if not self._data:
            self._event = None
            return []
        item = (self._t, "\n".join(self._data), self._event)
        self._data, self._event = [], None
        return [item]


def _complete(payload: str) -> bool:
    if payload.strip() == "[DONE]":
        return True
    try:
        json.loads(payload)
    except ValueError:
        return False
    return True


# -- assembly and grammar ------------------------------------------------------------------------------------

class _Assembler:
    """Feeds parsed events into a :class:`StreamResult` and records grammar violations as they happen."""

    def __init__(self, result: StreamResult) -> None:
        self.r = result
        opts = result.request.get("stream_options") or {}
        self.include_usage = bool(opts.get("include_usage"))
        self.continuous = self.include_usage and bool(opts.get("continuous_usage_stats"))
        self.after_done = 0
        self.chunk_no = 0
        self.usage_chunk_at: int | None = None
        self.last_finish_at: int | None = None
        self.chunks_without_usage = 0
        self.prev_completion_tokens: int | None = None

    def add(self, t: float, raw: str, event: str | None) -> None:
        r = self.r
        if r.done:
            self.after_done += 1
            r.events.append(SSEEvent(t=t, raw=raw, event=event))
            return
        if raw.strip() == "[DONE]":
            r.done = True
            r.events.append(SSEEvent(t=t, raw=raw, done=True, event=event))
            return
        try:
            data = json.loads(raw)
        except ValueError:
            r.events.append(SSEEvent(t=t, raw=raw, event=event))
            r.violations.append(f"event {len(r.events)} is not JSON: {_quote(raw)}")
            return
        ev = SSEEvent(t=t, raw=raw, data=data, event=event)
        r.events.append(ev)
        if ev.is_error:
            r.error_events.append(data["error"])
            r.violations.append(f"in-band error event after HTTP {r.status_code}: {_quote(json.dumps(data['error']))}")
            return
        if not isinstance(data, dict):
            r.violations.append(f"event {len(r.events)} is not a JSON object: {_quote(raw)}")
            return
        self._chunk(data, t)

    def _chunk(self, data: dict[str, Any], t: float) -> None:
        r = self.r
        self.chunk_no += 1
        n = self.chunk_no
        if data.get("object") != "chat.completion.chunk":
            r.violations.append(f"chunk {n}: object is {data.get('object')!r}, expected 'chat.completion.chunk'")
        self._consistent("id", data.get("id"), r.ids, n)
        self._consistent("model", data.get("model"), r.models, n)
        if data.get("system_fingerprint"):
            r.system_fingerprint = data["system_fingerprint"]
        choices = data.get("choices")
        if not isinstance(choices, list):
            r.violations.append(f"chunk {n}: no 'choices' list: {_quote(json.dumps(data))}")
            choices = []
        usage = data.get("usage")
        if usage:
            r.usage_history.append(usage)
            final = not choices or self._proxy_usage_chunk(choices)
            if final:
                if self.usage_chunk_at is not None:
                    r.violations.append(f"chunk {n}: a second usage chunk")
                self.usage_chunk_at = n
                r.usage = usage
            elif r.usage is None or self.usage_chunk_at is None:
                r.usage = usage  # continuous usage: keep the latest until the final usage chunk arrives
        elif self.continuous:
            self.chunks_without_usage += 1
        if n == 1 and not _is_role_chunk(choices):
            r.violations.append(f"first chunk is not the role chunk (delta.role='assistant'): {_quote(json.dumps(data))}")
        carried = False
        for choice in choices:
            carried |= self._choice(choice, n)
        if carried:
            r.token_times.append(t)
            if self.continuous and usage and isinstance(usage.get("completion_tokens"), int):
                prev = self.prev_completion_tokens or 0
                r.tokens_per_chunk.append(usage["completion_tokens"] - prev)
        if usage and isinstance(usage.get("completion_tokens"), int) and choices:
            self.prev_completion_tokens = usage["completion_tokens"]

    def _proxy_usage_chunk(self, choices: list[Any]) -> bool:
        # LiteLLM (1.108.7) re-frames vLLM's usage chunk as choices [{"index": 0, "delta": {}}] + usage, after
        # the finish chunk. It carries nothing else, so it is accepted as the usage chunk and noted.
        empty = all(isinstance(c, dict) and not c.get("delta") and c.get("finish_reason") is None for c in choices)
        if empty and self.last_finish_at is not None and not self.continuous:
            self.r.usage_chunk_form = "proxy"
            return True
        return False

    def _consistent(self, key: str, value: Any, seen: list[str], n: int) -> None:
        if value is None:
            self.r.violations.append(f"chunk {n}: no '{key}'")
            return
        if seen and value != seen[0] and value not in seen:
            self.r.violations.append(f"chunk {n}: {key} changed from {seen[0]!r} to {value!r}")
        if value not in seen:
            seen.append(value)

    def _choice(self, choice: dict[str, Any], n: int) -> bool:
        """Apply one choice delta; True when it carried a token (content, reasoning or tool-call text)."""
        r = self.r
        idx = choice.get("index", 0)
        c = r.choices.setdefault(idx, ChoiceAssembly(index=idx))
        delta = choice.get("delta") or {}
        finished_before = bool(c.finish_reasons)
        carried = False
        if delta.get("role") is not None:
            if c.role is not None:
                r.violations.append(f"chunk {n}: choice {idx} repeats the role delta")
            c.role = delta["role"]
        content = delta.get("content")
        if content is not None:
            c.content += content
            c.content_seen = True
            carried |= content != ""
        piece = self._reasoning_piece(delta, n)
        if piece is not None:
            c.reasoning += piece
            c.reasoning_seen = True
            carried |= piece != ""
        for tc in delta.get("tool_calls") or []:
            carried |= self._tool_delta(c, tc, n)
        if finished_before and carried:
            r.violations.append(f"chunk {n}: choice {idx} carries output after its finish_reason")
        reason = choice.get("finish_reason")
        if reason is not None:
            c.finish_reasons.append(reason)
            c.stop_reasons.append(choice.get("stop_reason"))
            self.last_finish_at = n
        return carried

    def _reasoning_piece(self, delta: dict[str, Any], n: int) -> str | None:
        # vLLM >= 0.16 sends `reasoning`; <= 0.11 `reasoning_content`; 0.11.1-0.15 both (same text, or
        # reasoning_content null on other deltas). Take one of them so nothing is counted twice.
        new, old = delta.get("reasoning"), delta.get("reasoning_content")
        if "reasoning" in delta:
            self.r.reasoning_fields.add("reasoning")
        if "reasoning_content" in delta:
            self.r.reasoning_fields.add("reasoning_content")
        if new is not None and old is not None and new != old:
            self.r.violations.append(f"chunk {n}: reasoning {new!r} and reasoning_content {old!r} disagree")
        return new if new is not None else old

    def _tool_delta(self, c: ChoiceAssembly, tc: dict[str, Any], n: int) -> bool:
        r = self.r
        idx = tc.get("index")
        fn = tc.get("function") or {}
        if not isinstance(idx, int):
            r.violations.append(f"chunk {n}: tool-call delta without an integer index: {_quote(json.dumps(tc))}")
            idx = len(c.tool_calls)
        call = c.tool_calls.get(idx)
        if call is None:
            call = c.tool_calls[idx] = ToolCallAssembly(index=idx)
            missing = [k for k, v in (("id", tc.get("id")), ("type", tc.get("type")), ("function.name", fn.get("name")))
                       if not v]
            if missing:
                r.violations.append(f"chunk {n}: first delta of tool call {idx} lacks {', '.join(missing)}")
        elif tc.get("id") and call.id and tc["id"] != call.id:
            r.violations.append(f"chunk {n}: tool call {idx} changed id from {call.id!r} to {tc['id']!r}")
        call.id = call.id or tc.get("id")
        call.type = call.type or tc.get("type")
        if fn.get("name"):
            call.name += fn["name"] if call.name != fn["name"] else ""
        args = fn.get("arguments")
        if args:
            call.arguments += args
        return bool(fn.get("name") or args)

    def finish(self) -> None:
        r = self.r
        if r.status_code != 200:
            return
        if not r.events and r.transport_error is None:
            r.violations.append("the stream carried no events")
        if not r.done:
            r.violations.append("stream ended without 'data: [DONE]'")
        if self.after_done:
            r.violations.append(f"{self.after_done} event(s) after 'data: [DONE]'")
        if not r.choices and self.chunk_no:
            r.violations.append("no chunk carried a choice")
        for idx, c in sorted(r.choices.items()):
            if len(c.finish_reasons) != 1:
                r.violations.append(f"choice {idx}: expected exactly one finish_reason, got {c.finish_reasons}")
        if self.include_usage:
            if self.usage_chunk_at is None:
                r.violations.append("stream_options.include_usage was set but no usage chunk (choices: []) arrived")
            elif self.last_finish_at is not None and self.usage_chunk_at < self.last_finish_at:
                r.violations.append("the usage chunk came before the finish chunk")
            elif self.usage_chunk_at != self.chunk_no:
                r.violations.append("the usage chunk is not the last chunk before [DONE]")
        if self.continuous and self.chunks_without_usage:
            r.violations.append(f"continuous_usage_stats was set but {self.chunks_without_usage} chunk(s) had no usage")


def _is_role_chunk(choices: list[Any]) -> bool:
    return bool(choices) and all(isinstance(c, dict) and (c.get("delta") or {}).get("role") == "assistant"
                                 for c in choices)


# -- entry points --------------------------------------------------------------------------------------------

class _ProbeRun:
    """One probe request's bookkeeping, shared by the sync and async entry points (only the I/O differs)."""

    def __init__(self, base_url: Any, body: dict[str, Any], path: str) -> None:
        self.request = {**body, "stream": True}
        self.path = path.lstrip("/")
        # display_url: a transcript is an attachment, so no userinfo or query-string credentials in it.
        self.result = StreamResult(request=self.request,
                                   url=display_url(str(base_url).rstrip("/") + "/" + self.path))
        self.framer = _SSEFramer()
        self.asm = _Assembler(self.result)
        self.result.t_start = time.monotonic()
        self.pending = bytearray()
        self.received = 0

    def opened(self, resp: httpx.Response) -> bool:
        """Record status and headers; True when the body is a stream to read line by line."""
        r = self.result
        r.status_code = resp.status_code
        r.headers = {k.lower(): v for k, v in resp.headers.items() if k.lower() != "set-cookie"}
        r.t_headers = time.monotonic()
        if resp.status_code != 200:
            return False
        ctype = r.headers.get("content-type", "")
        if not ctype.startswith("text/event-stream"):
            r.violations.append(f"HTTP 200 with content-type {ctype or 'none'!r}, expected text/event-stream")
        return True

    def line(self, line: str) -> None:
        for item in self.framer.feed(line, time.monotonic()):
            self.asm.add(*item)

    def data(self, chunk: bytes) -> None:
        """Bytes off the wire, split into lines and decoded strictly: httpx's own line reader replaces invalid
        UTF-8 silently, and a stream that is not UTF-8 is a violation."""
        self.received += len(chunk)
        if b"\n" not in chunk:  # a body without line breaks (a huge non-SSE answer) must not be re-split each time
            self.pending.extend(chunk)
            return
        *lines, rest = (bytes(self.pending) + chunk).split(b"\n")
        self.pending = bytearray(rest)
        for raw in lines:
            self._decoded(raw.rstrip(b"\r"))

    def _decoded(self, raw: bytes) -> None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            text = raw.decode("utf-8", errors="replace")
            self.result.violations.append(f"invalid UTF-8 in the stream (byte {err.start} of the line): "
                                          f"{_quote(text)}")
        self.line(text)

    def data_end(self) -> None:
        if self.pending:
            self._decoded(bytes(self.pending).rstrip(b"\r"))
            self.pending.clear()

    def http_error(self, raw: bytes) -> None:
        # Kept for the transcript and the message: bounded, with the size stated when cut.
        text = raw[:_ERROR_BODY_KEPT].decode("utf-8", errors="replace")
        if len(raw) > _ERROR_BODY_KEPT:
            text += f"\n... ({len(raw):,} bytes in all)"
        self.result.http_error_text = text
        try:
            self.result.http_error = json.loads(text)
        except ValueError:
            self.result.http_error = None

    def transport(self, err: Exception) -> None:
        self.result.transport_error = f"{type(err).__name__}: {err}"
        when = "mid-stream" if self.result.status_code is not None else "before any answer"
        self.result.violations.append(f"transport error {when}: {self.result.transport_error}")

    def close(self) -> StreamResult:
        for item in self.framer.flush():
            self.asm.add(*item)
        if self.framer.stray:
            self.result.violations.append(f"non-SSE text in the stream: {_quote(' '.join(self.framer.stray))}")
        self.result.t_end = time.monotonic()
        self.asm.finish()
        return self.result


def probe_chat_stream(http: httpx.Client, body: dict[str, Any], *,
                      path: str = "/chat/completions") -> StreamResult:
    """POST ``body`` with ``stream: true`` and record the stream. Never raises for HTTP or transport errors."""
    run = _ProbeRun(http.base_url, body, path)
    try:
        with http.stream("POST", run.path, json=run.request) as resp:
            if run.opened(resp):
                for chunk in resp.iter_bytes():
                    run.data(chunk)
                run.data_end()
            else:
                run.http_error(resp.read())
    except httpx.HTTPError as err:
        run.transport(err)
    return run.close()


async def probe_chat_stream_async(http: httpx.AsyncClient, body: dict[str, Any], *,
                                  path: str = "/chat/completions") -> StreamResult:
    """The asyncio twin of :func:`probe_chat_stream`, for concurrent probes."""
    run = _ProbeRun(http.base_url, body, path)
    try:
        async with http.stream("POST", run.path, json=run.request) as resp:
            if run.opened(resp):
                async for chunk in resp.aiter_bytes():
                    run.data(chunk)
                run.data_end()
            else:
                run.http_error(await resp.aread())
    except httpx.HTTPError as err:
        run.transport(err)
    return run.close()


def parse_sse_lines(lines: Iterable[str], request: dict[str, Any] | None = None,
                    times: Iterable[float] | None = None, status_code: int = 200) -> StreamResult:
    """Run the probe's assembly and grammar checks over recorded SSE lines (no server involved)."""
    result = StreamResult(request=dict(request or {}), status_code=status_code,
                          headers={"content-type": "text/event-stream"})
    framer, asm = _SSEFramer(), _Assembler(result)
    clock = iter(times) if times is not None else None
    for line in lines:
        t = next(clock, 0.0) if clock is not None else 0.0
        for item in framer.feed(line.rstrip("\r\n"), t):
            asm.add(*item)
    for item in framer.flush():
        asm.add(*item)
    asm.finish()
    return result


def parse_sse_text(text: str, request: dict[str, Any] | None = None) -> StreamResult:
    """:func:`parse_sse_lines` over a whole recorded transcript."""
    return parse_sse_lines(text.splitlines(), request=request)
