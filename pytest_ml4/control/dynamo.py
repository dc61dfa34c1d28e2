"""Client-side checks of a Dynamo deployment around restarts (core, no pytest; dynamo.md §3, §5).

* session affinity: turns sent with one ``x-dynamo-session-id`` land on the same worker, seen through
  ``nvext.worker_id`` (requested with ``"nvext": {"extra_fields": ["worker_id"]}``);
* prefix reuse: a continuation turn reports ``usage.prompt_tokens_details.cached_tokens`` > 0;
* disaggregated handoff: a request is prefilled on one instance of the prefill component and decoded on another,
  both instances the frontend's ``/health`` lists;
* model visibility: with every prefill pod gone the model leaves ``/v1/models`` (its worker set is incomplete)
  and comes back once the replacements serve.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from pytest_ml4.client import Endpoint, make_httpx, quote_body
from pytest_ml4.control.base import Progress, models_listed
from pytest_ml4.control.kubernetes import KubernetesController

SESSION_HEADER = "x-dynamo-session-id"
#: How often model visibility is polled while pods are replaced (the simulator restarts a worker in ~1-2 s).
VISIBILITY_POLL_S = 0.05


@dataclass
class Turn:
    status: int
    content: str
    worker_id: dict[str, Any] | None
    prompt_tokens: int
    cached_tokens: int | None
    error: str | None = None

    @property
    def decode_worker(self) -> Any:
        return (self.worker_id or {}).get("decode_worker_id")

    @property
    def prefill_worker(self) -> Any:
        return (self.worker_id or {}).get("prefill_worker_id")

    def line(self) -> str:
        if self.error:
            return f"HTTP {self.status}: {self.error}"
        return (f"HTTP {self.status}, worker_id={self.worker_id}, prompt_tokens={self.prompt_tokens}, "
                f"cached_tokens={self.cached_tokens}, content={self.content[:60]!r}")


def chat_turn(http: httpx.Client, model: str, messages: list[dict[str, Any]], session: str,
              max_tokens: int) -> Turn:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "nvext": {"extra_fields": ["worker_id", "timing"]}}
    r = http.post("chat/completions", json=body, headers={SESSION_HEADER: session})
    if r.status_code != 200:
        return Turn(r.status_code, "", None, 0, None, quote_body(r.text))
    data = r.json()
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Turn(r.status_code, data["choices"][0]["message"].get("content") or "",
                (data.get("nvext") or {}).get("worker_id"), int(usage.get("prompt_tokens") or 0),
                details.get("cached_tokens"))


def run_conversation(endpoint: Endpoint, spec: dict[str, Any], session: str | None = None) -> list[Turn]:
    """The conversation of ``spec`` (a system prompt and user turns), each answer fed back, one session id."""
    session = session or f"ml4-{uuid.uuid4().hex[:12]}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": spec["system"]}]
    turns: list[Turn] = []
    with make_httpx(endpoint) as http:
        for t in spec["turns"]:
            messages.append({"role": "user", "content": t["prompt"]})
            turn = chat_turn(http, endpoint.model, messages, session, int(spec["max_tokens"]))
            turns.append(turn)
            if turn.error:
                break
            messages.append({"role": "assistant", "content": turn.content})
    return turns


def check_affinity(turns: list[Turn], disagg: bool) -> Any:
    """Every turn of the session went to one decode worker (and one prefill worker in disagg); returns it."""
    failed = [t for t in turns if t.error or not t.worker_id]
    if failed:
        raise AssertionError("the conversation did not get worker ids back (nvext.extra_fields worker_id):\n"
                             + "\n".join(t.line() for t in turns))
    decode = {t.decode_worker for t in turns}
    prefill = {t.prefill_worker for t in turns}
    if len(decode) != 1 or (disagg and len(prefill) != 1):
        raise AssertionError(f"one {SESSION_HEADER} was served by several workers (decode {sorted(decode)}, prefill "
                             f"{sorted(prefill)}): session affinity is off (router session-affinity TTL unset, or "
                             f"the vLLM chat processor dropped the header)\n" + "\n".join(t.line() for t in turns))
    return decode.pop()


def check_prefix_reuse(turns: list[Turn]) -> int:
    """The continuation turn reused the cached prefix; returns its cached tokens."""
    last = turns[-1]
    if last.cached_tokens is None:
        raise AssertionError("the continuation turn reports no usage.prompt_tokens_details.cached_tokens:\n"
                             + "\n".join(t.line() for t in turns))
    if not 0 < last.cached_tokens < max(last.prompt_tokens, 1):
        raise AssertionError(f"the continuation turn reused {last.cached_tokens} cached tokens of "
                             f"{last.prompt_tokens}: no prefix reuse (with the hybrid KV cache manager on, a prefix "
                             f"hit needs both KV groups; seed 002 GB300 settings)\n"
                             + "\n".join(t.line() for t in turns))
    return last.cached_tokens


def worker_instance_ids(health: Any) -> set[Any]:
    """The worker instances a frontend ``/health`` body lists: one per worker, on its ``generate`` endpoint (real
    Dynamo lists each worker once per endpoint it serves, e.g. also ``worker_kv_query_source_*``)."""
    instances = health.get("instances") if isinstance(health, dict) else None
    return {i.get("instance_id") for i in instances or [] if isinstance(i, dict)
            and i.get("endpoint", "generate") == "generate"}


def frontend_instances(root_url: str) -> list[dict[str, Any]]:
    """The worker instances the frontend's ``/health`` lists (empty when it is not healthy)."""
    try:
        r = httpx.get(root_url.rstrip("/") + "/health", timeout=5.0)
        return list(r.json().get("instances") or []) if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return []


def check_handoff(turn: Turn, instances: list[dict[str, Any]]) -> tuple[Any, Any]:
    """Prefill and decode ran on different instances, the prefill one from the prefill component."""
    if not turn.worker_id:
        raise AssertionError(f"no nvext.worker_id in the answer: {turn.line()}")
    by_id = {i.get("instance_id"): i for i in instances}
    p, d = turn.prefill_worker, turn.decode_worker
    problems = []
    if p is None or d is None or p == d:
        problems.append(f"prefill_worker_id={p} decode_worker_id={d}: no separate prefill (aggregated serving?)")
    if p not in by_id:
        problems.append(f"prefill worker {p} is not an instance the frontend lists")
    elif "prefill" not in str(by_id[p].get("component", "")):
        problems.append(f"prefill worker {p} belongs to component {by_id[p].get('component')!r}")
    if d not in by_id:
        problems.append(f"decode worker {d} is not an instance the frontend lists")
    if problems:
        listed = [(i.get("component"), i.get("instance_id")) for i in instances]
        raise AssertionError("no prefill -> decode handoff: " + "; ".join(problems) + f"\ninstances: {listed}")
    return p, d


@dataclass
class Visibility:
    deleted: list[str]
    left_after_s: float | None
    returned_after_s: float | None
    seen: list[str]


def watch_model_visibility(ctl: KubernetesController, endpoint: Endpoint, role: str = "prefill",
                           timeout_s: float | None = None, progress: Progress | None = None) -> Visibility:
    """Delete every pod of ``role``; record when the model leaves ``/v1/models`` and when it comes back."""
    limit = ctl.timeout_s if timeout_s is None else timeout_s
    t0 = time.monotonic()
    deleted = ctl.delete_pods(role)
    left = returned = None
    seen: list[str] = []
    deadline = t0 + limit
    while time.monotonic() < deadline:
        ids = models_listed(endpoint.base_url, endpoint.api_key)
        state = "no answer" if ids is None else ("listed" if endpoint.model in ids else "absent")
        if not seen or seen[-1] != state:
            seen.append(state)
        if left is None and state != "listed":
            left = time.monotonic() - t0
        if left is not None and state == "listed":
            returned = time.monotonic() - t0
            break
        time.sleep(VISIBILITY_POLL_S)
    if returned is not None:
        ctl.wait_ready(max(1.0, deadline - time.monotonic()), progress)
    return Visibility(deleted, left, returned, seen)
