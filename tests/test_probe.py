"""The stream probe on vLLM 0.33's recorded transcripts, on version variants and on deliberately broken streams.

Recorded streams live in ``fixtures/probe/`` (copied from ``shared/reference/vllm-0.33-transcripts/transcripts.txt``
with their non-streaming twins); the broken ones are built here from those by removing or adding one event,
so each test names exactly the defect it plants. Live tests run the probe over a real loopback socket.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from ml4_http_stub import Scripted, StubServer, sse

from pytest_ml4.checks.protocol import Assembled
from pytest_ml4.client.stream_probe import (
    parse_sse_lines,
    parse_sse_text,
    probe_chat_stream,
    probe_chat_stream_async,
)

PROBE = Path(__file__).resolve().parent.parent / "fixtures" / "probe"
USAGE = {"stream_options": {"include_usage": True}}
CASES = {  # transcript -> request options it was recorded with (the parallel case had no include_usage)
    "plain_content": USAGE,
    "reasoning_content": USAGE,
    "tool_call_v13": USAGE,
    "reasoning_parallel_tools": {},
}


def payloads(name: str) -> list[str]:
    text = (PROBE / f"{name}.sse").read_text()
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def as_lines(items: list[str]) -> list[str]:
    out: list[str] = []
    for p in items:
        out += [f"data: {p}", ""]
    return out


def non_stream_message(name: str) -> dict[str, Any]:
    return json.loads((PROBE / f"{name}.json").read_text())["non_stream_body"]["choices"][0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_transcripts_are_clean(name: str) -> None:
    result = parse_sse_text((PROBE / f"{name}.sse").read_text(), request=CASES[name])
    assert result.violations == []
    assert result.done and result.ok
    assert len(result.finish_reasons) == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_stream_assembly_equals_the_non_streamed_body(name: str) -> None:
    result = parse_sse_text((PROBE / f"{name}.sse").read_text(), request=CASES[name])
    choice = non_stream_message(name)
    streamed, whole = Assembled.from_stream(result), Assembled.from_message(choice["message"], choice["finish_reason"])
    assert streamed.differences(whole) == []
    assert result.finish_reason == choice["finish_reason"]


#: fixtures/probe name -> case title in the recorded transcripts.txt.
REFERENCE_TITLES = {"plain_content": "plain content", "reasoning_content": "reasoning + content",
                    "tool_call_v13": "tool call v13", "reasoning_parallel_tools": "reasoning + parallel tool calls"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_probe_copies_are_the_recorded_transcripts(name: str) -> None:
    """The SSE files above are the reference's recorded lines, unchanged and in order (no drift, no edits)."""
    text = (PROBE.parent / "transcripts" / "transcripts.txt").read_text()
    block = text.split("================== " + REFERENCE_TITLES[name] + "\n", 1)[1].split("==================", 1)[0]
    recorded = [line[len("data: "):] for line in block.splitlines() if line.startswith("data: ")]
    assert recorded, f"no SSE lines for {REFERENCE_TITLES[name]!r} in transcripts.txt"
    assert payloads(name) == recorded


def test_reasoning_and_tool_calls_are_assembled_by_index() -> None:
    result = parse_sse_text((PROBE / "reasoning_parallel_tools.sse").read_text())
    assert result.reasoning == "Need weather."
    assert [(c.index, c.id, c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        (0, "qUDyyUbNi", "get_weather", {"city": "Paris"}), (1, "v9TDRahwF", "get_weather", {"city": "Rome"})]
    assert result.usage is None


def test_usage_chunk_is_recorded() -> None:
    result = parse_sse_text((PROBE / "plain_content.sse").read_text(), request=USAGE)
    assert result.usage == {"prompt_tokens": 10, "total_tokens": 14, "completion_tokens": 4,
                            "completion_tokens_details": {"reasoning_tokens": 0}}
    assert result.content == "Hello world!"


def test_compact_reference_form_parses_without_blank_lines() -> None:
    # The reference prints one event per line with no blank separator; the framer must still split them.
    lines = payloads("plain_content")
    result = parse_sse_lines([f"data: {p}" for p in lines], request=USAGE)
    assert result.violations == [] and result.content == "Hello world!" and len(result.events) == 7


def _rename_reasoning(items: list[str], mode: str) -> list[str]:
    out = []
    for raw in items:
        if raw == "[DONE]":
            out.append(raw)
            continue
        chunk = json.loads(raw)
        for c in chunk.get("choices", []):
            d = c["delta"]
            if mode == "legacy" and "reasoning" in d:
                d["reasoning_content"] = d.pop("reasoning")
            elif mode == "both" and "role" not in d:
                # vLLM 0.11.1-0.15: the validator sets reasoning_content on every delta (null when no reasoning).
                d["reasoning_content"] = d.get("reasoning")
        out.append(json.dumps(chunk))
    return out


@pytest.mark.parametrize("mode", ["legacy", "both"])
def test_old_reasoning_field_forms_are_counted_once(mode: str) -> None:
    result = parse_sse_lines(as_lines(_rename_reasoning(payloads("reasoning_content"), mode)), request=USAGE)
    assert result.violations == []
    assert result.reasoning == "Let me think."
    assert result.content == "The answer is 4."
    assert result.reasoning_fields == ({"reasoning_content"} if mode == "legacy" else {"reasoning", "reasoning_content"})


def test_disagreeing_reasoning_fields_are_a_violation() -> None:
    items = payloads("reasoning_content")
    chunk = json.loads(items[1])
    chunk["choices"][0]["delta"]["reasoning_content"] = "Other"
    items[1] = json.dumps(chunk)
    result = parse_sse_lines(as_lines(items), request=USAGE)
    assert any("disagree" in v for v in result.violations)


# -- broken streams: each plants exactly one defect ------------------------------------------------------------

def test_missing_done_is_reported() -> None:
    result = parse_sse_lines(as_lines(payloads("plain_content")[:-1]), request=USAGE)
    assert result.violations == ["stream ended without 'data: [DONE]'"]
    assert not result.ok


def test_two_finish_reasons_are_reported() -> None:
    items = payloads("plain_content")
    items.insert(4, items[4])  # the finish chunk twice
    result = parse_sse_lines(as_lines(items), request=USAGE)
    assert any("exactly one finish_reason" in v and "['stop', 'stop']" in v for v in result.violations)


def test_in_band_error_event_is_caught() -> None:
    # LiteLLM when the backend dies mid-stream (tooling.md §3.6): an error event, no finish_reason, no [DONE].
    items = payloads("plain_content")[:3] + [json.dumps({"error": {
        "message": "litellm.APIConnectionError: Response payload is not completed", "type": None, "code": "500"}})]
    result = parse_sse_lines(as_lines(items), request=USAGE)
    assert result.error_events and "APIConnectionError" in result.error_events[0]["message"]
    assert any(v.startswith("in-band error event") for v in result.violations)
    assert "stream ended without 'data: [DONE]'" in result.violations
    assert any("finish_reason" in v for v in result.violations)


def test_vllm_error_event_before_done_is_caught() -> None:
    # vLLM after the headers were sent: data: {"error": {...}} then data: [DONE] (vllm.md §1.4).
    err = {"error": {"message": "The server had an error while processing your request.",
                     "type": "InternalServerError", "param": None, "code": 500}}
    items = payloads("plain_content")[:3] + [json.dumps(err), "[DONE]"]
    result = parse_sse_lines(as_lines(items), request=USAGE)
    assert result.done and result.error_events == [err["error"]]
    assert any("in-band error event" in v for v in result.violations)


def test_missing_role_chunk_is_reported() -> None:
    result = parse_sse_lines(as_lines(payloads("plain_content")[1:]), request=USAGE)
    assert any(v.startswith("first chunk is not the role chunk") for v in result.violations)


def test_missing_usage_chunk_is_reported_only_when_requested() -> None:
    items = [p for p in payloads("plain_content") if '"choices":[]' not in p]
    assert parse_sse_lines(as_lines(items), request=USAGE).violations == [
        "stream_options.include_usage was set but no usage chunk (choices: []) arrived"]
    assert parse_sse_lines(as_lines(items), request={}).violations == []


def test_events_after_done_are_reported() -> None:
    items = payloads("plain_content") + [payloads("plain_content")[1]]
    result = parse_sse_lines(as_lines(items), request=USAGE)
    assert "1 event(s) after 'data: [DONE]'" in result.violations


def test_changing_id_and_unparsable_event_are_reported() -> None:
    items = payloads("plain_content")
    items[2] = items[2].replace("chatcmpl-XYZ", "chatcmpl-OTHER")
    items.insert(3, "{not json")
    result = parse_sse_lines(as_lines(items), request=USAGE)
    assert any("id changed from 'chatcmpl-XYZ' to 'chatcmpl-OTHER'" in v for v in result.violations)
    assert any("is not JSON" in v for v in result.violations)


def test_tool_call_first_delta_without_id_is_reported() -> None:
    items = payloads("tool_call_v13")
    chunk = json.loads(items[1])
    del chunk["choices"][0]["delta"]["tool_calls"][0]["id"]
    items[1] = json.dumps(chunk)
    result = parse_sse_lines(as_lines(items), request=USAGE)
    assert any("first delta of tool call 0 lacks id" in v for v in result.violations)


def test_continuous_usage_gives_tokens_per_chunk() -> None:
    items, done = [], 0
    for raw in payloads("plain_content"):
        if raw == "[DONE]" or '"choices":[]' in raw:
            items.append(raw)
            continue
        chunk = json.loads(raw)
        if chunk["choices"][0]["delta"].get("content"):
            done += 1
        chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": done, "total_tokens": 10 + done}
        items.append(json.dumps(chunk))
    opts = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    result = parse_sse_lines(as_lines(items), request=opts)
    assert result.violations == []
    assert result.tokens_per_chunk == [1, 1, 1]
    stripped = [json.dumps({k: v for k, v in json.loads(i).items() if k != "usage"}) for i in items[:2]]
    missing = parse_sse_lines(as_lines(stripped + items[2:]), request=opts)
    assert any("continuous_usage_stats" in v for v in missing.violations)


def test_transcript_rendering_names_events_and_violations() -> None:
    result = parse_sse_lines(as_lines(payloads("plain_content")[:-1]), request=USAGE)
    text = result.to_transcript()
    assert text.count("] data: ") == 6 and "violation: stream ended without 'data: [DONE]'" in text


# -- over a real socket ---------------------------------------------------------------------------------------

def test_live_probe_times_tokens() -> None:
    script = Scripted(chunks=sse(*payloads("reasoning_content")), delay_s=0.03)
    with StubServer({"/v1/chat/completions": script}) as srv, \
            httpx.Client(base_url=srv.base_url + "/", headers={"Authorization": "Bearer k"}) as http:
        result = probe_chat_stream(http, {"model": "m", "messages": [], **USAGE})
    assert result.ok, result.describe()
    assert json.loads(srv.seen[0].body)["stream"] is True
    assert result.reasoning == "Let me think." and result.content == "The answer is 4."
    assert result.ttft_s is not None and result.ttft_s >= 0.05  # role chunk + first reasoning chunk, 30 ms each
    # 9 gaps of 30 ms on the server; a busy client may read two events together, so judge the sum loosely.
    assert len(result.itl_s) == 9 and sum(result.itl_s) >= 0.15


def test_live_probe_captures_http_error() -> None:
    body = b'{"error":{"message":"When using `tool_choice`, `tools` must be set. (parameter=tool_choice)",' \
           b'"type":"BadRequestError","param":"tool_choice","code":400}}'
    with StubServer({"/v1/chat/completions": Scripted(400, "application/json", [body])}) as srv, \
            httpx.Client(base_url=srv.base_url + "/") as http:
        result = probe_chat_stream(http, {"model": "m", "messages": []})
    assert result.status_code == 400 and result.http_error["error"]["param"] == "tool_choice"
    assert not result.ok and "HTTP 400" in result.describe()


def test_live_probe_reports_wrong_content_type_and_truncation() -> None:
    with StubServer({"/v1/chat/completions": Scripted(200, "text/html", [b"<html>gateway</html>"]),
                     "/v1/cut": Scripted(chunks=sse(*payloads("plain_content")[:3]), truncate=True)}) as srv, \
            httpx.Client(base_url=srv.base_url + "/") as http:
        html = probe_chat_stream(http, {"messages": []})
        cut = probe_chat_stream(http, {"messages": []}, path="/cut")
    assert any("content-type 'text/html'" in v for v in html.violations)
    assert "non-SSE text in the stream: '<html>gateway</html>'" in html.violations
    assert any("is not JSON" in v or "no events" in v or "without" in v for v in html.violations)
    assert cut.transport_error is not None and cut.content == "Hello world"
    assert "stream ended without 'data: [DONE]'" in cut.violations


def test_async_probe_matches_the_sync_one() -> None:
    async def run(base: str) -> Any:
        async with httpx.AsyncClient(base_url=base + "/") as http:
            return await probe_chat_stream_async(http, {"messages": [], **USAGE})

    with StubServer({"/v1/chat/completions": Scripted(chunks=sse(*payloads("tool_call_v13")))}) as srv:
        result = asyncio.run(run(srv.base_url))
    assert result.ok, result.describe()
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("get_weather", '{"city": "Paris"}')]


def test_litellm_usage_chunk_form_is_accepted() -> None:
    # LiteLLM 1.108.7 (observed in front of the simulator): the usage chunk keeps an empty choice.
    items = payloads("plain_content")
    usage = json.loads(items[5])
    usage["choices"] = [{"index": 0, "delta": {}}]
    items[5] = json.dumps(usage)
    result = parse_sse_lines(as_lines(items), request=USAGE)
    assert result.violations == [] and result.usage_chunk_form == "proxy"
    assert result.usage["completion_tokens"] == 4
    # Before the finish chunk the same shape is not a usage chunk.
    early = parse_sse_lines(as_lines(items[:4] + [items[5], items[4], items[6]]), request=USAGE)
    assert any("usage chunk" in v for v in early.violations)
