"""Drive the chat endpoint with BFCL items: bounded concurrency, temperature 0, fixed seed, a progress line."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from pytest_ml4.accuracy.bfcl import Bfcl
from pytest_ml4.accuracy.data import Dataset, Item
from pytest_ml4.accuracy.score import ItemResult, failed_request, score_reply


@dataclass(frozen=True)
class RunSettings:
    model: str
    concurrency: int = 8
    seed: int = 1234
    max_tokens: int = 4096
    #: A progress line every this many finished items (and at the end).
    progress_every: int = 100


def request_body(item: Item, s: RunSettings) -> dict[str, Any]:
    """What BFCL's OpenAI function-calling handler sends (tools offered, tool_choice left at auto), greedy."""
    body: dict[str, Any] = {"model": s.model, "messages": item.messages, "temperature": 0, "seed": s.seed,
                            "max_tokens": s.max_tokens}
    if item.tools:
        body["tools"] = item.tools
    return body


def _one(http: httpx.Client, bfcl: Bfcl, ds: Dataset, item: Item, s: RunSettings) -> ItemResult:
    answer = ds.answers.get(item.id)
    try:
        resp = http.post("chat/completions", json=request_body(item, s))
    except httpx.HTTPError as e:
        return failed_request(item, answer, "http_error:transport", f"{type(e).__name__}: {e}")
    if resp.status_code != 200:
        return failed_request(item, answer, f"http_error:{resp.status_code}", resp.text[:300])
    try:
        message = resp.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return failed_request(item, answer, "bad_response", resp.text[:300])
    return score_reply(bfcl, item, message, answer)


def run_items(http: httpx.Client, bfcl: Bfcl, ds: Dataset, s: RunSettings,
              progress: Callable[[str], None] | None = None) -> list[ItemResult]:
    """Every item of ``ds`` scored, in dataset order; ``progress`` gets 'done/total, passed' lines."""
    total = len(ds.items)
    lock = threading.Lock()
    state = {"done": 0, "passed": 0}

    def task(item: Item) -> ItemResult:
        r = _one(http, bfcl, ds, item, s)
        with lock:
            state["done"] += 1
            state["passed"] += int(r.valid)
            done = state["done"]
            if progress and (done % s.progress_every == 0 or done == total):
                progress(f"[ml4 accuracy] {done}/{total} items, {state['passed']} passed")
        return r

    if progress:
        cats = len({i.category for i in ds.items})
        progress(f"[ml4 accuracy] {total} BFCL items in {cats} categories, concurrency {s.concurrency}")
    with ThreadPoolExecutor(max_workers=max(1, s.concurrency), thread_name_prefix="ml4-accuracy") as pool:
        return list(pool.map(task, ds.items))
