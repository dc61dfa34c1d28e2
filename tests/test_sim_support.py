"""Helpers for the simulator tests (no tests here): reading the reference transcripts, comparing JSON *shapes*.

A shape keeps what the wire format fixes (keys, their order, nulls, value types, list lengths) and drops what
varies per request (ids, timestamps, texts, counts).  Consecutive identical chunk shapes are collapsed, so a
stream with five content chunks has the same event sequence as one with three.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
TRANSCRIPTS = REPO / "fixtures" / "transcripts"

#: Fast timing for tests: TTFT 10 ms, ITL 0.5 ms, one token per step (no speculative bursts).
FAST = {"sim": {"ttft_s": 0.01, "itl_ms": 0.5}}
FAST_NO_SPEC = {"sim": {"ttft_s": 0.01, "itl_ms": 0.5}, "engine": {"speculative": None}}

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def transcript_cases() -> dict[str, dict[str, Any]]:
    """``{case name: {"body": non-stream body (pairs), "sse": [data payloads]}}`` from transcripts.txt."""
    text = (TRANSCRIPTS / "transcripts.txt").read_text()
    cases: dict[str, dict[str, Any]] = {}
    for block in text.split("================== ")[1:]:
        name, _, rest = block.partition("\n")
        body = None
        sse: list[str] = []
        for line in rest.splitlines():
            if line.startswith("NON-STREAM BODY: "):
                body = pairs(line[len("NON-STREAM BODY: "):])
            elif line.startswith("data: "):
                sse.append(line[len("data: "):])
        cases[name.strip()] = {"body": body, "sse": sse}
    return cases


def error_cases() -> dict[str, tuple[int, str]]:
    """``{case: (status, compact body)}`` for the HTTP cases of errors.txt."""
    lines = (TRANSCRIPTS / "errors.txt").read_text().splitlines()
    out: dict[str, tuple[int, str]] = {}
    for i, line in enumerate(lines):
        if line.startswith("--- ") and ": HTTP " in line:
            name, _, status = line[4:].rpartition(": HTTP ")
            out[name] = (int(status), lines[i + 1])
    return out


def pairs(text: str) -> Any:
    """JSON with key order preserved (objects become lists of pairs)."""
    return json.loads(text, object_pairs_hook=lambda kv: ("obj", kv))


def shape(v: Any) -> Any:
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "obj":
        return ("obj", [(k, shape(x)) for k, x in v[1]])
    if isinstance(v, list):
        return [shape(x) for x in v]
    if v is None:
        return None
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "num"
    return "str"


def drop_key(v: Any, key: str) -> Any:
    """Remove ``key`` from a top-level pairs object."""
    return ("obj", [(k, x) for k, x in v[1] if k != key])


def get(v: Any, key: str) -> Any:
    return dict(v[1]).get(key)


def collapse(seq: list[Any]) -> list[Any]:
    out: list[Any] = []
    for s in seq:
        if not out or out[-1] != s:
            out.append(s)
    return out


def stream_lines(client: httpx.Client, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[str]:
    """The ``data:`` payloads of one streamed request, in order (``[DONE]`` included)."""
    out: list[str] = []
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers or {}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[len("data: "):])
            else:
                assert line == "", f"unexpected SSE line {line!r}"
    return out


def assemble(lines: list[str]) -> dict[str, Any]:
    """Content, reasoning, tool calls, finish reason and usage assembled from streamed payloads."""
    content, reasoning = "", ""
    calls: dict[int, dict[str, Any]] = {}
    finish, usage = None, None
    for line in lines:
        if line == "[DONE]":
            continue
        ev = json.loads(line)
        if ev.get("usage") and not ev["choices"]:
            usage = ev["usage"]
        for ch in ev["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            reasoning += d.get("reasoning") or ""
            for tc in d.get("tool_calls", []):
                c = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                c["id"] = tc.get("id") or c["id"]
                fn = tc.get("function") or {}
                c["name"] = fn.get("name") or c["name"]
                c["arguments"] += fn.get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    return {"content": content, "reasoning": reasoning, "tool_calls": [calls[i] for i in sorted(calls)],
            "finish_reason": finish, "usage": usage}


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes whose command line mentions ``text`` (e.g. a run's private folder)."""
    import os

    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv:
            found.append((int(proc.name), argv[:200]))
    return found


def kill_processes_mentioning(text: str) -> list[str]:
    """SIGKILL what :func:`processes_mentioning` finds; returns ``"pid N: argv"`` lines for the message."""
    import os
    import signal

    lines = []
    for pid, argv in processes_mentioning(text):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        lines.append(f"pid {pid}: {argv}")
    return lines
