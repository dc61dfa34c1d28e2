"""The fault gateway in front of the Dynamo frontend (harness/pytest_ml4_sim/deploy/gateway.py): each fault alters only what it
names, everything else passes through unchanged, streams chunk by chunk.

The upstream here is a small recording aiohttp server (no Dynamo needed); the kill matrix
(fixtures/killmatrix/gb300-agg.yaml, group ``gateway``) shows the same gateway in front of the real frontend.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from pytest_ml4_sim.deploy.gateway import (
    drop_tool_choice_none,
    gateway_faults,
    repair_invalid,
    serve_any_model,
    unlist_models,
)
from pytest_ml4_sim.deploy.launcher import free_port

SERVED = "mistral-large-4"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


# ------------------------------------------------------------------------------------------------ the rewrites
def test_only_gateway_faults_start_a_gateway() -> None:
    assert gateway_faults(["error_rate=1", "tool_parser_off"]) == []
    assert gateway_faults(["any_model", "error_rate=1", "model_unlisted"]) == ["any_model", "model_unlisted"]
    assert gateway_faults(["served_max_model_len=131072", "token_budget_missing"]) == []


def test_any_model_routes_every_name_to_the_served_one() -> None:
    body = {"model": "no-such-model", "messages": []}
    serve_any_model(body, SERVED)
    assert body["model"] == SERVED


@pytest.mark.parametrize(("given", "left"), [
    ({"tool_choice": "required"}, {}),
    ({"tools": []}, {}),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "book_hotel"}}},
     {"tools": [WEATHER], "tool_choice": "auto"}),
    ({"reasoning_effort": "extreme"}, {}),
])
def test_accepts_invalid_repairs_what_the_frontend_refuses(given: dict[str, Any], left: dict[str, Any]) -> None:
    body = json.loads(json.dumps(given))
    repair_invalid(body, SERVED)
    assert body == left


@pytest.mark.parametrize("valid", [
    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    {"tools": [WEATHER], "tool_choice": "none"},
    {"reasoning_effort": "high"},
    {"chat_template_kwargs": {"enable_thinking": False}},
])
def test_accepts_invalid_leaves_valid_requests_alone(valid: dict[str, Any]) -> None:
    body = json.loads(json.dumps(valid))
    repair_invalid(body, SERVED)
    assert body == valid


def test_tool_choice_none_ignored_drops_only_none() -> None:
    none, auto = {"tools": [WEATHER], "tool_choice": "none"}, {"tools": [WEATHER], "tool_choice": "auto"}
    drop_tool_choice_none(none, SERVED)
    drop_tool_choice_none(auto, SERVED)
    assert none == {"tools": [WEATHER]} and auto["tool_choice"] == "auto"


def test_model_unlisted_removes_the_served_card() -> None:
    body = {"object": "list", "data": [{"id": SERVED}, {"id": "other"}]}
    unlist_models(body, SERVED)
    assert body["data"] == [{"id": "other"}]


# ------------------------------------------------------------------------------------------------ the proxy
class Upstream:
    """Records each chat body; streams three SSE events with a pause, so chunked passthrough is visible."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.port = free_port()
        self.loop = asyncio.new_event_loop()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        if body.get("nvext"):
            return await self.with_nvext(request, bool(body.get("stream")))
        if not body.get("stream"):
            return web.json_response({"model": body.get("model"), "echo": body}, headers={"x-upstream": "yes"})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            await resp.write(f"data: {{\"i\": {i}}}\n\n".encode())
            await asyncio.sleep(0.2)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def with_nvext(self, request: web.Request, stream: bool) -> web.StreamResponse:
        """Answers naming their worker as real 1.6.1 does (nvext.worker_id); a streamed event is written in two
        pieces, so a gateway that rewrites events must join lines across chunks."""
        nvext = {"worker_id": {"prefill_worker_id": 7, "decode_worker_id": 7}}
        answer = {"choices": [{"index": 0, "message": {"content": "4"}, "finish_reason": "stop"}], "nvext": nvext}
        if not stream:
            return web.json_response(answer)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        event = f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': '4'}}], 'nvext': nvext})}\n\n"
        for piece in (event[:20], event[20:]):
            await resp.write(piece.encode())
            await asyncio.sleep(0.05)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": SERVED, "max_model_len": 1048576}]})

    async def gzipped(self, request: web.Request) -> web.Response:
        resp = web.json_response({"object": "list", "data": [{"id": SERVED}]})
        resp.enable_compression(web.ContentCoding.gzip)
        return resp

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response({"message": "model not found", "type": "Not Found", "code": 404}, status=404)

    def run(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/live", self.models)
        app.router.add_get("/missing", self.status)
        app.router.add_get("/gz", self.gzipped)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    thread = threading.Thread(target=up.run, daemon=True)
    thread.start()
    yield up
    up.loop.call_soon_threadsafe(up.loop.stop)
    thread.join(5)


def _gateway(upstream: Upstream, *faults: str) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "pytest_ml4_sim.deploy.gateway", "--upstream", f"http://127.0.0.1:{upstream.port}",
           "--port", str(port), "--served-model", SERVED, *[a for f in faults for a in ("--fault", f)]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "gateway exited"
            try:
                if httpx.get(url + "/live", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "gateway not up after 20 s"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def faulty(upstream: Upstream) -> Iterator[str]:
    yield from _gateway(upstream, "any_model", "model_unlisted", "accepts_invalid", "tool_choice_none_ignored")


def test_gateway_rewrites_only_what_its_faults_say(upstream: Upstream, faulty: str) -> None:
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "x" * 9000}], "tools": [WEATHER],
            "tool_choice": "none", "reasoning_effort": "extreme", "temperature": 0, "chat_template_kwargs": {"a": 1}}
    r = httpx.post(faulty + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200 and r.headers["x-upstream"] == "yes"
    seen = upstream.bodies[-1]
    assert seen["model"] == SERVED
    assert len(seen["messages"][0]["content"]) == 9000
    assert "tool_choice" not in seen and "reasoning_effort" not in seen
    assert seen["temperature"] == 0 and seen["chat_template_kwargs"] == {"a": 1} and seen["tools"] == [WEATHER]


def test_gateway_filters_the_model_list_and_passes_errors_through(faulty: str) -> None:
    assert httpx.get(faulty + "/v1/models", timeout=10).json()["data"] == []
    r = httpx.get(faulty + "/missing", timeout=10)
    assert r.status_code == 404 and r.json()["message"] == "model not found"


def test_gateway_passes_a_compressed_answer_on_readable(faulty: str) -> None:
    r = httpx.get(faulty + "/gz", headers={"accept-encoding": "gzip"}, timeout=10)
    assert r.status_code == 200 and r.json()["data"] == [{"id": SERVED}]


def test_gateway_streams_chunk_by_chunk(faulty: str) -> None:
    arrivals = []
    with httpx.stream("POST", faulty + "/v1/chat/completions", json={"model": SERVED, "stream": True,
                                                                        "messages": []}, timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                arrivals.append((time.monotonic(), line))
    assert [line for _, line in arrivals] == ['data: {"i": 0}', 'data: {"i": 1}', 'data: {"i": 2}', "data: [DONE]"]
    # Passed on as the upstream wrote them, not buffered to the end: 0.2 s between events.
    assert arrivals[-1][0] - arrivals[0][0] > 0.4


def test_gateway_without_model_faults_forwards_the_list_untouched(upstream: Upstream) -> None:
    for url in _gateway(upstream, "accepts_invalid"):
        assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"] == SERVED
        body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high",
                "tools": [WEATHER], "tool_choice": "none"}
        httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
        assert upstream.bodies[-1] == body


def test_evidence_stripped_drops_nvext_and_the_dynamo_headers_only(upstream: Upstream) -> None:
    """Fault ``dynamo_evidence_stripped``: answers lose ``nvext`` (whole body and every SSE event), requests lose
    their ``x-dynamo-*`` headers; everything else passes (DYN_DISABLE_FRONTEND_NVEXT=1, or a stripping ingress)."""
    body = {"model": SERVED, "messages": [{"role": "user", "content": "2+2?"}],
            "nvext": {"extra_fields": ["worker_id"]}}
    headers = {"x-dynamo-session-id": "s1", "x-dynamo-worker-instance-id": "7", "x-request-id": "r1"}
    for url in _gateway(upstream, "dynamo_evidence_stripped"):
        whole = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10).json()
        assert whole == {"choices": [{"index": 0, "message": {"content": "4"}, "finish_reason": "stop"}]}
        seen = upstream.headers[-1]
        assert "x-dynamo-session-id" not in seen and "x-dynamo-worker-instance-id" not in seen
        assert seen["x-request-id"] == "r1" and upstream.bodies[-1] == body
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=10) as r:
            lines = [line for line in r.iter_lines() if line]
        assert lines == ['data: {"choices": [{"index": 0, "delta": {"content": "4"}}]}', "data: [DONE]"]
    # Without the fault the same answers name their worker (the control).
    for url in _gateway(upstream, "accepts_invalid"):
        assert "nvext" in httpx.post(url + "/v1/chat/completions", json=body, timeout=10).json()


# ------------------------------------------------------------------------------------------------ DynamoSim wiring
@pytest.mark.parametrize(("faults", "through_gateway"), [((), False), (("error_rate=1",), False),
                                                         (("any_model", "tool_parser_off"), True)])
def test_dynamo_sim_starts_a_gateway_only_for_its_faults(tmp_path: Any, faults: tuple[str, ...],
                                                         through_gateway: bool) -> None:
    from pytest_ml4_sim.deploy.dynamo import DynamoSim

    from pytest_ml4.runtime.installed import ToolMissing
    from pytest_ml4.target.model import load_target

    try:
        dsim = DynamoSim(load_target("gb300-agg"), faults=faults, log_file=tmp_path / "engine.log")
    except ToolMissing as err:
        pytest.skip(str(err))
    assert (dsim.gateway is not None) is through_gateway
    assert dsim.url == (dsim.gateway.url if dsim.gateway else dsim.frontend.url)
    if dsim.gateway is not None:
        assert dsim.gateway.faults == ["any_model"]
        assert dsim.gateway.argv()[dsim.gateway.argv().index("--upstream") + 1] == dsim.frontend.url


def test_health_login_page_answers_the_probe_itself(upstream: Upstream) -> None:
    """Fault ``health_login_page``: the ingress answers ``GET /health`` with its sign-in page (200, HTML) and the
    health check refuses it, naming the page; other paths still reach the frontend. The control: without the
    fault the probe is the frontend's."""
    from pytest_ml4.checks.health import assert_endpoint_healthy
    from pytest_ml4.client.endpoint import BadResponseError, Endpoint

    for url in _gateway(upstream, "health_login_page"):
        r = httpx.get(url + "/health", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html") and "Sign in" in r.text
        assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"] == SERVED
        with pytest.raises(BadResponseError, match=r"^\[endpoint.html_page\] GET /health from .*/health is an HTML page \(HTTP 200"):
            assert_endpoint_healthy(Endpoint(base_url=url + "/v1", api_key="", model=SERVED), "/health")
    for url in _gateway(upstream, "accepts_invalid"):
        assert "Sign in" not in httpx.get(url + "/health", timeout=10).text
