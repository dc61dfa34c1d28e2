"""The HTTP exchange recorder and the redacting attach helpers, over real loopback HTTP."""

from __future__ import annotations

import asyncio

import httpx
import openai
from ml4_http_stub import Scripted, StubServer, sse

from pytest_ml4.report.attach import MAX_BODY, ExchangeRecorder

KEY = "sk-attach-test-0123456789abcdef"
ROUTES = {
    "/v1/models": Scripted(200, "application/json", [b'{"data": [{"id": "ml4"}], "echo": "' + KEY.encode() + b'"}']),
    "/v1/chat/completions": Scripted(200, "text/event-stream", sse('{"choices": []}', "[DONE]")),
    "/v1/big": Scripted(200, "text/plain", [b"x" * (MAX_BODY + 10)]),
}


def test_records_only_while_active_and_renders_redacted() -> None:
    rec = ExchangeRecorder()
    with StubServer(ROUTES) as stub, httpx.Client(base_url=stub.base_url + "/",
                                                  headers={"Authorization": f"Bearer {KEY}"}) as http:
        rec.install(http)
        rec.install(http)  # idempotent: one hook, one record per request
        http.get("models")
        assert rec.exchanges == [], "nothing is recorded outside a check"
        rec.start()
        http.post("chat/completions", json={"model": "ml4", "messages": [], "api_key": KEY})
        http.get("models")
        with http.stream("POST", "chat/completions", json={"stream": True}) as resp:
            list(resp.iter_lines())
        http.get("big")
        rec.stop()
        http.get("models")
    assert [(e.method, e.status) for e in rec.exchanges] == [("POST", 200), ("GET", 200), ("POST", 200),
                                                             ("GET", 200)]
    texts = [e.render() for e in rec.exchanges]
    assert all(KEY not in t for t in texts)
    assert "authorization: Bearer ***" in texts[0] and '"api_key":"***"' in texts[0]
    assert '"data": [{"id": "ml4"}]' in texts[1] and '"echo": "sk-***"' in texts[1]
    assert 'data: {"choices": []}' in texts[2] and "data: [DONE]" in texts[2], "the SSE transcript is kept"
    assert "more characters" in texts[3] and len(texts[3]) < MAX_BODY + 1000


def test_hooks_the_client_inside_openai_sync_and_async() -> None:
    rec = ExchangeRecorder(limit=2)
    with StubServer(ROUTES) as stub:
        sync = openai.OpenAI(base_url=stub.base_url, api_key=KEY, max_retries=0)
        rec.install(sync)
        rec.start()
        assert [m.id for m in sync.models.list()] == ["ml4"]

        async def go() -> None:
            client = openai.AsyncOpenAI(base_url=stub.base_url, api_key=KEY, max_retries=0)
            rec.install(client)
            await client.models.list()
            await client.models.list()   # over the limit: not recorded
            await client.close()

        asyncio.run(go())
        sync.close()
    assert len(rec.exchanges) == 2 and all(e.status == 200 for e in rec.exchanges)
    assert all(KEY not in e.render() for e in rec.exchanges)


def test_async_and_openai_streams_are_teed() -> None:
    rec = ExchangeRecorder()
    with StubServer(ROUTES) as stub:
        async def go() -> list[str]:
            async with httpx.AsyncClient(base_url=stub.base_url + "/") as http:
                rec.install(http)
                rec.start()
                async with http.stream("POST", "chat/completions", json={}) as resp:
                    return [line async for line in resp.aiter_lines() if line]

        lines = asyncio.run(go())
        client = openai.OpenAI(base_url=stub.base_url, api_key=KEY, max_retries=0)
        rec.install(client)
        with client.chat.completions.create(model="ml4", messages=[], stream=True) as stream:
            chunks = list(stream)
        client.close()
    assert lines == ['data: {"choices": []}', "data: [DONE]"] and len(chunks) == 1
    assert [e.render().count("data: [DONE]") for e in rec.exchanges] == [1, 1]
