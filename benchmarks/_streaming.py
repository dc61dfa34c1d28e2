"""The streamed tok/s measurement the engine benchmarks share (``dynamo_sim.py``, ``real_vllm.py``).

Each request streams a fixed output length (``min_tokens = max_tokens = osl``) and counts the tokens the server
reports in its final usage chunk (what it generated, not what the client happened to split into chunks).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping

import httpx

PROMPT = "Explain how a KV cache works."


async def stream_once(client: httpx.AsyncClient, model: str, osl: int) -> int:
    """One streamed chat completion; the ``completion_tokens`` of its usage chunk (0 if none came)."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
            "min_tokens": osl, "max_tokens": osl, "stream_options": {"include_usage": True}}
    tokens = 0
    async with client.stream("POST", "/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                event = json.loads(line[len("data: "):])
                if not event.get("choices") and event.get("usage"):
                    tokens = int(event["usage"]["completion_tokens"])
    return tokens


async def _streamed_tok_s(base_url: str, model: str, osl: int, concurrency: int, per_stream: int,
                          headers: Mapping[str, str]) -> float:
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers=dict(headers)) as client:
        async def user() -> int:
            return sum([await stream_once(client, model, osl) for _ in range(per_stream)])

        t0 = time.monotonic()
        totals = await asyncio.gather(*(user() for _ in range(concurrency)))
        return sum(totals) / (time.monotonic() - t0)


def streamed_tok_s(base_url: str, model: str, osl: int, concurrency: int, *, per_stream: int = 1,
                   headers: Mapping[str, str] | None = None) -> float:
    """Aggregate output tok/s of ``concurrency`` streams, each sending ``per_stream`` requests one after another,
    against the OpenAI API at ``base_url`` (``.../v1``)."""
    return asyncio.run(_streamed_tok_s(base_url, model, osl, concurrency, per_stream, headers or {}))
