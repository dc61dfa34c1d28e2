"""Dynamo mode of the simulator: a Dynamo-like frontend process in front of plain simulator workers.

What it imitates (shared/reference/dynamo.md):

* ``/health`` (§3): 503 ``{"status": "not_ready", "stage": ..., "message": "Service is not ready"}`` until a
  complete worker set has been discovered, then 200 ``{"status": "healthy", "endpoints": [...], "instances": [...]}``;
  ``/live``: 200 ``{"status": "live", "message": "Service is live"}`` (503 ``shutting_down`` while stopping);
* ``/v1/models`` lists the model only while its worker set is complete (agg: a worker; disagg: a prefill **and**
  a decode worker), so killing every prefill worker hides the model (§3);
* ``dynamo_frontend_*`` metrics with the reference's names and labels (§4.1);
* KV-aware routing over block hashes of the prompt with the ``[ROUTING] Best: worker_...`` log line (§5), session
  affinity on ``x-dynamo-session-id`` (binding invalidated when the bound worker disappears), ``nvext``
  ``worker_id`` / ``timing`` in responses when asked through ``nvext.extra_fields``, and
  ``usage.prompt_tokens_details.cached_tokens`` from the router's prefix overlap with the chosen worker;
* disaggregation: a remote prefill on a prefill worker (the request with ``max_tokens: 1``), then decode on a
  decode worker; the handoff shows in both workers' ``vllm:`` metrics, in nvext and in the frontend log;
* ``--migration-limit`` (§6): a request whose worker dies before or during its stream is re-sent to another
  worker up to N times (``dynamo_frontend_model_migration_total{migration_type=new_request|ongoing_request}``);
  with no migration left the stream ends with an in-band ``{"error": ...}`` event and no ``[DONE]``.

Workers are ordinary :class:`~pytest_ml4.sim.SimServer` processes. Discovery (etcd in Dynamo) is a JSON file the
:class:`DynamoSim` handle rewrites when a worker goes away or comes back; the frontend polls it and each worker's
``/health``. Frontend log wording other than the reference's quoted lines is the simulator's own.

CLI (the frontend alone): ``python -m pytest_ml4.sim.dynamo --target NAME --port P --discovery FILE
[--log-file F] [--migration-limit N] [--session-affinity-ttl S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pytest_ml4.targets import Target, load_target

#: Dynamo's namespace/component/endpoint naming for the instance list of /health (dynamo.md §3).
COMPONENTS = {"worker": "backend", "prefill": "prefill", "decode": "backend"}
#: How often the frontend re-reads discovery and polls worker health.
DISCOVERY_POLL_S = 0.1
#: Dynamo's remote prefill runs the request with one output token on the prefill worker.
PREFILL_MAX_TOKENS = 1
#: How long a migrating request waits for a replacement worker to appear.
MIGRATION_WAIT_S = 15.0


# =============================================================================================== frontend server
@dataclass
class Instance:
    instance_id: int
    role: str
    url: str
    healthy: bool = False
    active: int = 0


@dataclass
class RouterState:
    """Per-instance cached block hashes (the KV index) and session bindings (phase, session) -> instance."""

    blocks: dict[int, set[str]] = field(default_factory=dict)
    bindings: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    rr: int = 0


class WorkerGone(Exception):
    """The worker's connection failed or its stream ended without ``[DONE]``."""


class Frontend:
    """The aiohttp application of the Dynamo-like frontend."""

    def __init__(self, target: Target, discovery: Path, *, log_file: Path | None, migration_limit: int,
                 affinity_ttl_s: float, namespace: str = "dynamo") -> None:
        from prometheus_client import CollectorRegistry

        self.target = target
        self.model = target.serving.served_model_name
        self.block_size = target.engine.block_size
        self.discovery = discovery
        self.disagg = target.topology.kind == "disagg"
        self.migration_limit = migration_limit
        self.affinity_ttl_s = affinity_ttl_s
        self.namespace = namespace
        self.instances: dict[int, Instance] = {}
        self.router = RouterState()
        self.ready_once = False
        self.stopping = False
        self._discovery_mtime = 0.0
        self._log = open(log_file, "a", buffering=1) if log_file else sys.stdout
        self.registry = CollectorRegistry()
        self._metrics()
        self._tok: Any = None

    # -- logging (Dynamo's readable format, dynamo.md §5 "Log format")
    def log(self, level: str, target: str, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1e6) % 1_000_000:06d}Z"
        self._log.write(f"{stamp} {level} {target}: {message}\n")

    # -- metrics (dynamo.md §4.1)
    def _metrics(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        r = self.registry
        p = "dynamo_frontend_"
        self.m_requests = Counter(p + "requests", "requests", ["model", "endpoint", "request_type", "status",
                                                               "error_type"], registry=r)
        self.m_started = Counter(p + "requests_started", "started", ["model", "endpoint", "request_type"], registry=r)
        self.m_active = Gauge(p + "active_requests", "active", ["model"], registry=r)
        self.m_duration = Histogram(p + "request_duration_seconds", "duration", ["model"], registry=r)
        self.m_ttft = Histogram(p + "time_to_first_token_seconds", "ttft", ["model"], registry=r)
        self.m_out = Counter(p + "output_tokens", "output tokens", ["model"], registry=r)
        self.m_cached = Histogram(p + "cached_tokens", "cached tokens", ["model"], registry=r,
                                  buckets=(0, 64, 256, 1024, 4096, 16384, 65536, float("inf")))
        self.m_migrations = Counter(p + "model_migration", "migrations", ["model", "migration_type"], registry=r)
        self.m_mig_limit = Gauge(p + "model_migration_limit", "migration limit", ["model"], registry=r)
        self.m_block = Gauge(p + "model_kv_cache_block_size", "block size", ["model"], registry=r)
        self.m_ctx = Gauge(p + "model_context_length", "context", ["model"], registry=r)
        self.m_seqs = Gauge(p + "model_max_num_seqs", "max seqs", ["model"], registry=r)
        self.m_router = Counter("dynamo_component_router_requests", "router requests", ["model"], registry=r)
        # Per-worker gauges (dynamo.md §4.1): with worker_type prefill and decode they show the disagg handoff.
        self.m_worker_isl = Gauge(p + "worker_last_input_sequence_tokens", "last ISL per worker",
                                  ["worker_id", "dp_rank", "worker_type"], registry=r)
        self.m_mig_limit.labels(self.model).set(self.migration_limit)
        self.m_block.labels(self.model).set(self.block_size)
        self.m_ctx.labels(self.model).set(self.target.engine.max_model_len)
        self.m_seqs.labels(self.model).set(self.target.engine.max_num_seqs)

    # -- discovery
    def complete(self) -> bool:
        roles = {i.role for i in self.instances.values() if i.healthy}
        return {"prefill", "decode"} <= roles if self.disagg else "worker" in roles

    def _read_discovery(self) -> list[dict[str, Any]] | None:
        try:
            mtime = self.discovery.stat().st_mtime_ns
        except FileNotFoundError:
            return []
        if mtime == self._discovery_mtime:
            return None
        self._discovery_mtime = mtime
        try:
            return list(json.loads(self.discovery.read_text()).get("instances", []))
        except ValueError:
            self._discovery_mtime = 0.0  # half-written file: read it again next poll
            return None

    def _apply_discovery(self, listed: list[dict[str, Any]]) -> None:
        wanted = {int(d["instance_id"]): d for d in listed}
        for iid in [i for i in self.instances if i not in wanted]:
            self._forget(iid, "instance removed from discovery")
        for iid, d in wanted.items():
            if iid not in self.instances:
                self.instances[iid] = Instance(iid, d["role"], d["url"])
                self.log("INFO", "dynamo_llm::discovery", f"instance added instance_id={iid} role={d['role']}")

    def _forget(self, iid: int, why: str) -> None:
        inst = self.instances.pop(iid, None)
        self.router.blocks.pop(iid, None)
        # "If the bound worker disappears, Dynamo invalidates the binding" (dynamo.md §5)
        for key in [k for k, (bound, _) in self.router.bindings.items() if bound == iid]:
            del self.router.bindings[key]
        if inst:
            self.log("INFO", "dynamo_llm::discovery", f"instance removed instance_id={iid} role={inst.role}: {why}")

    async def discovery_loop(self, http: Any) -> None:
        while True:
            listed = self._read_discovery()
            if listed is not None:
                self._apply_discovery(listed)
            for inst in list(self.instances.values()):
                try:
                    async with http.get(inst.url + "/health", timeout=_timeout(1.0)) as r:
                        ok = r.status == 200
                except Exception:  # noqa: BLE001 - any failure means not serving
                    ok = False
                if ok != inst.healthy:
                    inst.healthy = ok
                    if not ok:
                        self.router.blocks.pop(inst.instance_id, None)
                    self.log("INFO", "dynamo_llm::discovery",
                             f"instance {'ready' if ok else 'unreachable'} instance_id={inst.instance_id}")
            was = self.ready_once
            if self.complete():
                self.ready_once = True
                if not was:
                    self.log("INFO", "dynamo_llm::http_service", f"model {self.model} ready: worker set complete")
            await asyncio.sleep(DISCOVERY_POLL_S)

    # -- routing
    def block_hashes(self, body: dict[str, Any]) -> list[str]:
        """Chained hashes of the prompt's full token blocks (the KV router's view of the prefix)."""
        if self._tok is None:
            from pytest_ml4.sim.tokenizer import get_tokenizer

            self._tok = get_tokenizer(self.target.engine.tokenizer_version)
        from pytest_ml4.sim.tokenizer import message_text

        pieces: list[str] = []
        for m in body.get("messages") or []:
            pieces.append(f"<{m.get('role', '')}>" if isinstance(m, dict) else "<?>")
            pieces.extend(self._tok.pieces(message_text(m)))
        hashes, h = [], hashlib.sha256()
        for start in range(0, len(pieces) - self.block_size + 1, self.block_size):
            h.update("\x00".join(pieces[start:start + self.block_size]).encode())
            hashes.append(h.copy().hexdigest()[:16])
        return hashes

    def select(self, role: str, hashes: list[str], session: str | None, exclude: set[int],
               request_id: str) -> tuple[Instance, int] | None:
        cands = [i for i in self.instances.values() if i.role == role and i.healthy and i.instance_id not in exclude]
        if not cands:
            return None
        phase = "prefill" if role == "prefill" else "decode"
        if session and self.affinity_ttl_s > 0:
            bound = self.router.bindings.get((phase, session))
            if bound and time.monotonic() - bound[1] > self.affinity_ttl_s:
                self.log("DEBUG", "dynamo_llm::session_affinity",
                         "session affinity miss: pin expired (idle past TTL), re-selecting worker")
                del self.router.bindings[(phase, session)]
                bound = None
            if bound:
                inst = next((c for c in cands if c.instance_id == bound[0]), None)
                if inst is not None:
                    self.router.bindings[(phase, session)] = (inst.instance_id, time.monotonic())
                    self.log("DEBUG", "dynamo_llm::session_affinity",
                             f"session affinity hit: reusing pinned worker session_id={session} "
                             f"worker_id={inst.instance_id} dp_rank=0")
                    return inst, self._overlap(inst, hashes)
            self.log("DEBUG", "dynamo_llm::session_affinity",
                     f"session affinity miss: new session, pinning after worker selection session_id={session}")
        self.router.rr += 1
        # Best prefix overlap first, then the least busy, then round-robin so fresh sessions spread out.
        order = sorted(cands, key=lambda c: (-self._overlap(c, hashes), c.active,
                                             (cands.index(c) - self.router.rr) % len(cands)))
        best = order[0]
        overlap = self._overlap(best, hashes)
        self.log("DEBUG", "dynamo_llm::kv_router::push_router::selection",
                 f"[ROUTING] Best: worker_{best.instance_id} dp_rank=0 with {overlap}/{len(hashes)} blocks overlap "
                 f"request_id={request_id} worker_id={best.instance_id} dp_rank=0 overlap_blocks={overlap} "
                 f"total_blocks={len(hashes)}")
        if session and self.affinity_ttl_s > 0:
            self.router.bindings[(phase, session)] = (best.instance_id, time.monotonic())
        return best, overlap

    def _overlap(self, inst: Instance, hashes: list[str]) -> int:
        cached = self.router.blocks.get(inst.instance_id, set())
        n = 0
        for h in hashes:
            if h not in cached:
                break
            n += 1
        return n

    def stored(self, inst: Instance, hashes: list[str]) -> None:
        self.router.blocks.setdefault(inst.instance_id, set()).update(hashes)

    async def wait_select(self, role: str, hashes: list[str], session: str | None, exclude: set[int],
                          request_id: str, wait_s: float) -> tuple[Instance, int] | None:
        deadline = time.monotonic() + wait_s
        while True:
            got = self.select(role, hashes, session, exclude, request_id)
            if got is not None or time.monotonic() >= deadline:
                return got
            await asyncio.sleep(DISCOVERY_POLL_S)


def _timeout(total: float | None, connect: float = 3.0) -> Any:
    import aiohttp

    return aiohttp.ClientTimeout(total=total, connect=connect)


def _error_body(message: str, err_type: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "code": code}}


class ChatHandler:
    """One chat completion through the frontend: prefill (disagg), decode/agg dispatch, relay, migration."""

    def __init__(self, fe: Frontend, http: Any, body: dict[str, Any], headers: Mapping[str, str]) -> None:
        self.fe, self.http = fe, http
        self.nvext = body.pop("nvext", None) or {}
        self.body = body
        self.stream = bool(body.get("stream"))
        self.session = headers.get("x-dynamo-session-id")
        self.auth = {k: v for k, v in headers.items() if k.lower() == "authorization"}
        self.request_id = "chatcmpl-" + os.urandom(8).hex()
        self.rtype = "stream" if self.stream else "unary"
        self.hashes = fe.block_hashes(body)
        self.prefill: Instance | None = None
        self.worker: Instance | None = None
        self.cached_tokens = 0
        self.engine_cached: int | None = None  # the prefill worker's own cached_tokens (disagg), when it reports it
        self.t0 = time.monotonic()
        self.ttft: float | None = None
        self.migrations = 0

    def extra(self) -> dict[str, Any] | None:
        fields = self.nvext.get("extra_fields") or []
        out: dict[str, Any] = {}
        if "worker_id" in fields and self.worker is not None:
            if self.fe.disagg and self.prefill is not None:
                out["worker_id"] = {"prefill_worker_id": self.prefill.instance_id, "prefill_dp_rank": 0,
                                    "decode_worker_id": self.worker.instance_id, "decode_dp_rank": 0}
            else:
                out["worker_id"] = {"prefill_worker_id": self.worker.instance_id, "prefill_dp_rank": 0,
                                    "decode_worker_id": self.worker.instance_id, "decode_dp_rank": 0}
        if "timing" in fields:
            out["timing"] = {"ttft_ms": round((self.ttft or 0.0) * 1000, 1)}
        return out or None

    def patch_usage(self, usage: dict[str, Any] | None) -> None:
        """Report the prefix-cache hit: the engine's own figure where it gives one, else the router's overlap."""
        if not isinstance(usage, dict):
            return
        if self.engine_cached is None and (usage.get("prompt_tokens_details") or {}).get("cached_tokens") is not None:
            return
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = self.cached_tokens if self.engine_cached is None else self.engine_cached
        usage["prompt_tokens_details"] = {"cached_tokens": max(0, min(cached, prompt - 1))}

    async def remote_prefill(self) -> None:
        """Prefill on a prefill worker (the request with max_tokens 1); its KV is then handed to decode."""
        exclude: set[int] = set()
        while True:
            got = await self.fe.wait_select("prefill", self.hashes, self.session, exclude, self.request_id,
                                            MIGRATION_WAIT_S if self.migrations else 0)
            if got is None:
                raise WorkerGone("no prefill worker available")
            self.prefill, overlap = got
            self.cached_tokens = overlap * self.fe.block_size
            body = {k: v for k, v in self.body.items() if k not in ("stream", "stream_options", "min_tokens",
                                                                      "max_completion_tokens")}
            body.update(max_tokens=PREFILL_MAX_TOKENS, stream=False)
            try:
                data = await _post_json(self.http, self.prefill.url, body, self.auth)
            except _Passthrough:
                raise
            except Exception as err:  # noqa: BLE001 - a dead prefill worker
                self.fe.log("ERROR", "dynamo_llm::kv_router::prefill_router",
                            f"Remote prefill failed, failing request request_id={self.request_id} "
                            f"prefill_worker_id={self.prefill.instance_id}: {type(err).__name__}")
                if self.migrations >= self.fe.migration_limit:
                    raise WorkerGone("Remote prefill failed, failing request") from None
                self.migrations += 1
                self.fe.m_migrations.labels(self.fe.model, "new_request").inc()
                exclude.add(self.prefill.instance_id)
                continue
            self.fe.stored(self.prefill, self.hashes)
            prompt = (data.get("usage") or {}).get("prompt_tokens")
            self.fe.m_worker_isl.labels(str(self.prefill.instance_id), "0", "prefill").set(float(prompt or 0))
            self.engine_cached = ((data.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
            self.fe.log("INFO", "dynamo_llm::kv_router::prefill_router",
                        f"remote prefill done request_id={self.request_id} prefill_worker_id="
                        f"{self.prefill.instance_id} prompt_tokens={prompt} kv_blocks={len(self.hashes)} "
                        f"cached_blocks={overlap}")
            return

    async def pick_worker(self, exclude: set[int]) -> Instance:
        role = "decode" if self.fe.disagg else "worker"
        got = await self.fe.wait_select(role, self.hashes, self.session, exclude, self.request_id,
                                        MIGRATION_WAIT_S if self.migrations else 0)
        if got is None:
            raise WorkerGone(f"no {role} worker available")
        inst, overlap = got
        if not self.fe.disagg:
            self.cached_tokens = overlap * self.fe.block_size
        self.fe.m_worker_isl.labels(str(inst.instance_id), "0", "decode").set(float(len(self.hashes) *
                                                                                    self.fe.block_size))
        if self.fe.disagg:
            self.fe.log("INFO", "dynamo_llm::kv_router::prefill_router",
                        f"kv handoff request_id={self.request_id} prefill_worker_id="
                        f"{self.prefill.instance_id if self.prefill else None} decode_worker_id={inst.instance_id}")
        return inst

    def _may_migrate(self, started: bool) -> bool:
        if self.migrations >= self.fe.migration_limit:
            return False
        self.migrations += 1
        kind = "ongoing_request" if started else "new_request"
        self.fe.m_migrations.labels(self.fe.model, kind).inc()
        self.fe.log("WARN", "dynamo_llm::migration", f"migrating request request_id={self.request_id} "
                                                     f"type={kind} attempt={self.migrations}/{self.fe.migration_limit}")
        return True


class _Passthrough(Exception):
    """A worker answered an HTTP error (400, 404, ...): relay it unchanged, it is the client's business."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status)
        self.status, self.body = status, body


async def _post_json(http: Any, url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """POST a non-streaming chat request to a worker; a non-200 answer is relayed as :class:`_Passthrough`."""
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=_timeout(None)) as r:
        data = await r.json(content_type=None)
        if r.status != 200:
            raise _Passthrough(r.status, data)
        return dict(data)


async def _unary(h: ChatHandler) -> tuple[int, dict[str, Any]]:
    exclude: set[int] = set()
    while True:
        inst = await h.pick_worker(exclude)
        h.worker = inst
        inst.active += 1
        try:
            data = await _post_json(h.http, inst.url, h.body, h.auth)
        except _Passthrough:
            raise
        except Exception as err:  # noqa: BLE001 - the worker died under the request
            exclude.add(inst.instance_id)
            if not h._may_migrate(False):
                raise WorkerGone(f"worker {inst.instance_id} failed: {type(err).__name__}") from None
            continue
        finally:
            inst.active -= 1
        h.ttft = time.monotonic() - h.t0
        if not h.fe.disagg:
            h.fe.stored(inst, h.hashes)
        h.patch_usage(data.get("usage"))
        extra = h.extra()
        if extra:
            data["nvext"] = extra
        return 200, data


async def _relay_stream(h: ChatHandler, resp: Any, request: Any) -> None:
    """Relay the worker's SSE stream; on a dead worker migrate (skipping what the client already has)."""
    exclude: set[int] = set()
    sent_chars = 0       # content + reasoning characters already relayed
    sent_role = False
    while True:
        inst = await h.pick_worker(exclude)
        h.worker = inst
        inst.active += 1
        skip = sent_chars
        done = False
        try:
            async with h.http.post(inst.url + "/v1/chat/completions", json=h.body, headers=h.auth,
                                   timeout=_timeout(None)) as r:
                if r.status != 200:
                    raise _Passthrough(r.status, await r.json(content_type=None))
                if not resp.prepared:
                    await resp.prepare(request)
                async for raw in r.content:
                    line = raw.decode("utf-8", errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(payload)
                    out, sent_role, skip, added = _rewrite_chunk(h, chunk, sent_role, skip)
                    sent_chars += added
                    if out is not None:
                        if h.ttft is None and added:
                            h.ttft = time.monotonic() - h.t0
                            h.fe.m_ttft.labels(h.fe.model).observe(h.ttft)
                        await resp.write(f"data: {json.dumps(out, separators=(',', ':'))}\n\n".encode())
        except _Passthrough:
            raise
        except Exception:  # noqa: BLE001 - connection refused/reset or a cut stream: the worker is gone
            done = False
        finally:
            inst.active -= 1
        if done:
            if not h.fe.disagg:
                h.fe.stored(inst, h.hashes)
            await resp.write(b"data: [DONE]\n\n")
            return
        exclude.add(inst.instance_id)
        if not h._may_migrate(sent_role):
            raise WorkerGone(f"worker {inst.instance_id} stopped mid-stream")


def _rewrite_chunk(h: ChatHandler, chunk: dict[str, Any], sent_role: bool,
                   skip: int) -> tuple[dict[str, Any] | None, bool, int, int]:
    """Drop what a migrated stream repeats, add nvext/cached tokens; returns (chunk|None, sent_role, skip, added)."""
    if chunk.get("usage") is not None:
        h.patch_usage(chunk["usage"])
    added = 0
    keep = not chunk.get("choices")
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("role") and not any(delta.get(k) for k in ("content", "reasoning", "reasoning_content",
                                                                  "tool_calls")):
            if sent_role:
                continue
            sent_role = True
            keep = True
            continue
        for key in ("reasoning", "reasoning_content", "content"):
            text = delta.get(key)
            if not text:
                continue
            cut = min(skip, len(text))
            skip -= cut
            delta[key] = text[cut:]
            added += len(text) - cut
        if added or delta.get("tool_calls") or choice.get("finish_reason"):
            keep = True
        if choice.get("finish_reason"):
            extra = h.extra()
            if extra:
                chunk["nvext"] = extra
    return (chunk if keep else None), sent_role, skip, added


def build_app(fe: Frontend) -> Any:
    import aiohttp
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def on_startup(app: web.Application) -> None:
        app["http"] = aiohttp.ClientSession()
        fe.block_hashes({"messages": []})  # load the tokenizer now, not under the first request
        app["discovery"] = asyncio.create_task(fe.discovery_loop(app["http"]))

    async def on_cleanup(app: web.Application) -> None:
        app["discovery"].cancel()
        await app["http"].close()

    async def health(_: web.Request) -> web.Response:
        if not fe.ready_once:
            return web.json_response({"status": "not_ready", "stage": "discovery",
                                      "message": "Service is not ready"}, status=503)
        inst = [i for i in fe.instances.values() if i.healthy]
        eps = sorted({f"dyn://{fe.namespace}.{COMPONENTS[i.role]}.generate" for i in inst})
        return web.json_response({"status": "healthy", "endpoints": eps, "instances": [
            {"namespace": fe.namespace, "component": COMPONENTS[i.role], "endpoint": "generate",
             "instance_id": i.instance_id, "transport": {"tcp": i.url.split("//", 1)[-1]}} for i in inst]})

    async def live(_: web.Request) -> web.Response:
        if fe.stopping:
            return web.json_response({"status": "shutting_down", "message": "Service is shutting down"}, status=503)
        return web.json_response({"status": "live", "message": "Service is live"})

    async def models(_: web.Request) -> web.Response:
        data = []
        if fe.complete():
            data.append({"id": fe.model, "object": "model", "created": int(time.time()), "owned_by": "nvidia",
                         "context_window": fe.target.engine.max_model_len})
        return web.json_response({"object": "list", "data": data})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(fe.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(_error_body("invalid JSON body", "invalid_request_error", 400), status=400)
        model = body.get("model")
        rtype = "stream" if body.get("stream") else "unary"
        labels = (fe.model, "chat_completions", rtype)
        if model != fe.model or not fe.complete():
            kind = "not_found" if model != fe.model else "unavailable"
            fe.m_requests.labels(*labels, "error", kind).inc()
            msg = f"Model not found: {model}" if model != fe.model else f"No instances available for {model}"
            return web.json_response(_error_body(msg, kind, 404 if kind == "not_found" else 503),
                                     status=404 if kind == "not_found" else 503)
        fe.m_started.labels(*labels).inc()
        fe.m_router.labels(fe.model).inc()
        fe.m_active.labels(fe.model).inc()
        h = ChatHandler(fe, request.app["http"], body, request.headers)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        status, error_type = "success", ""
        try:
            if fe.disagg:
                await h.remote_prefill()
            if not h.stream:
                code, data = await _unary(h)
                fe.m_cached.labels(fe.model).observe(h.cached_tokens)
                return web.json_response(data, status=code)
            await _relay_stream(h, resp, request)
            fe.m_cached.labels(fe.model).observe(h.cached_tokens)
            return resp
        except _Passthrough as err:
            status, error_type = "error", "validation" if err.status < 500 else "internal"
            return web.json_response(err.body, status=err.status)
        except WorkerGone as err:
            status, error_type = "error", "unavailable"
            fe.log("ERROR", "dynamo_llm::http_service", f"request failed request_id={h.request_id}: {err}")
            body_err = _error_body(str(err), "internal_server_error", 500)
            if resp.prepared:
                # In-band error: the client already has 200 and some chunks (no [DONE] follows).
                await resp.write(f"data: {json.dumps(body_err)}\n\n".encode())
                return resp
            return web.json_response(body_err, status=503)
        finally:
            fe.m_active.labels(fe.model).dec()
            fe.m_requests.labels(*labels, status, error_type).inc()
            fe.m_duration.labels(fe.model).observe(time.monotonic() - h.t0)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get("/health", health)
    app.router.add_get("/live", live)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    from aiohttp import web

    ap = argparse.ArgumentParser(prog="python -m pytest_ml4.sim.dynamo", description="Dynamo-like frontend")
    ap.add_argument("--target", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--discovery", required=True, type=Path)
    ap.add_argument("--log-file", type=Path)
    ap.add_argument("--migration-limit", type=int, default=None)
    ap.add_argument("--session-affinity-ttl", type=float, default=None)
    ap.add_argument("--namespace", default="dynamo")
    args = ap.parse_args(argv)
    target = load_target(args.target)
    limit = args.migration_limit if args.migration_limit is not None else (target.serving.migration_limit or 0)
    ttl = args.session_affinity_ttl
    if ttl is None:
        ttl = 3600.0 if target.serving.session_affinity else 0.0
    fe = Frontend(target, args.discovery, log_file=args.log_file, migration_limit=limit, affinity_ttl_s=ttl,
                  namespace=args.namespace)
    fe.log("INFO", "dynamo_frontend", f"starting frontend for {fe.model} on {args.host}:{args.port} "
                                      f"router_mode=kv migration_limit={limit} pid={os.getpid()}")
    if ttl > 0:
        fe.log("INFO", "dynamo_llm::session_affinity", f"session affinity enabled ttl_secs={int(ttl)} "
                                                       f"max_entries=100000")
    app = build_app(fe)

    def _stopping(*_: Any) -> None:
        fe.stopping = True
        raise web.GracefulExit()

    signal.signal(signal.SIGTERM, _stopping)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, handle_signals=False,
                shutdown_timeout=5)
    return 0


# =============================================================================================== process handles
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_instance_id() -> int:
    """A fresh Dynamo-style instance id (a new lease after every worker start)."""
    return random.getrandbits(62)


class DynamoWorker:
    """One engine worker (a plain ``SimServer``) with its Dynamo role and instance id; restart re-registers it."""

    def __init__(self, owner: DynamoSim, role: str, index: int, server: Any) -> None:
        self.owner, self.role, self.index, self.server = owner, role, index, server
        self.instance_id = new_instance_id()

    def __repr__(self) -> str:
        return f"DynamoWorker({self.role}#{self.index}, id={self.instance_id}, url={self.url})"

    @property
    def url(self) -> str:
        return str(self.server.url)

    @property
    def base_url(self) -> str:
        return str(self.server.base_url)

    @property
    def log_file(self) -> Path:
        return Path(self.server.log_file)

    @property
    def pid(self) -> int | None:
        return self.server.pid

    def alive(self) -> bool:
        pid = self.pid
        if pid is None:
            return False
        proc = getattr(self.server, "_proc", None) or getattr(self.server, "proc", None)
        if proc is not None and hasattr(proc, "poll"):
            return proc.poll() is None
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def stop(self) -> None:
        """Leave discovery (the lease ends), then stop the process."""
        with self.owner.lock:
            self.owner.unpublish(self)
        self.server.stop()

    def start(self) -> None:
        """Start the process (same port) and register under a new instance id once it serves."""
        self.server.start()
        self.instance_id = new_instance_id()
        with self.owner.lock:
            self.owner.publish(self)

    def restart(self) -> None:
        self.stop()
        self.start()


class FrontendProcess:
    """The frontend subprocess (``python -m pytest_ml4.sim.dynamo``)."""

    def __init__(self, target: Target, discovery: Path, log_file: Path, *, port: int = 0,
                 migration_limit: int | None = None, env: Mapping[str, str] | None = None) -> None:
        self.target, self.discovery, self.log_file = target, discovery, log_file
        self.port = port or _free_port()
        self.migration_limit = migration_limit
        self._env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        cmd = [sys.executable, "-m", "pytest_ml4.sim.dynamo", "--target", str(self.target.path or self.target.name),
               "--port", str(self.port), "--discovery", str(self.discovery), "--log-file", str(self.log_file)]
        if self.migration_limit is not None:
            cmd += ["--migration-limit", str(self.migration_limit)]
        env = dict(os.environ if self._env is None else self._env)
        with open(self.log_file, "ab") as out:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"Dynamo sim frontend exited with {self._proc.returncode}; log tail:\n"
                                   f"{_tail(self.log_file)}")
            try:
                if httpx.get(self.url + "/live", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"Dynamo sim frontend not live after {timeout:.0f} s; log tail:\n{_tail(self.log_file)}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class DynamoSim:
    """A simulated Dynamo deployment with the :class:`~pytest_ml4.sim.SimServer` interface plus its workers.

    ``url``/``base_url``/``pid`` are the frontend's; ``log_file`` is the engine log of the first decode (agg: the
    first) worker, so code that reads "the engine log" of a simulator judges a real engine's boot and KV lines; the
    other workers log to ``<role>-<i>.log`` beside it and the frontend to ``frontend_log``. ``workers`` are
    :class:`DynamoWorker` handles (agg: ``topology.workers`` workers; disagg: ``prefill_workers`` prefill +
    ``decode_workers`` decode), ``frontend`` the frontend process.
    """

    def __init__(self, target: Target, *, port: int = 0, faults: Sequence[str] = (),
                 overrides: dict[str, Any] | None = None, log_file: Path | str | None = None,
                 env: Mapping[str, str] | None = None, migration_limit: int | None = None,
                 prefill_workers: int | None = None, decode_workers: int | None = None,
                 agg_workers: int | None = None) -> None:
        from pytest_ml4.sim import SimServer

        if not target.is_dynamo:
            raise ValueError(f"target {target.name} is not served by Dynamo ({target.serving.stack})")
        self.target = target
        self.log_file = Path(log_file) if log_file else Path(os.environ.get("TMPDIR", "/tmp")) / \
            f"ml4-dynamo-{os.getpid()}-{os.urandom(3).hex()}" / "engine.log"
        folder = self.log_file.parent
        folder.mkdir(parents=True, exist_ok=True)
        self.frontend_log = folder / "frontend.log"
        self.discovery_file = folder / "dynamo-discovery.json"
        self.lock = threading.RLock()
        self._published: dict[int, dict[str, Any]] = {}
        roles: list[tuple[str, dict[str, Any] | None]] = []
        if target.topology.kind == "disagg":
            prefill_over = dict(overrides or {})
            if target.prefill_engine is not None:
                prefill_over["engine"] = {**target.prefill_engine.model_dump(), **(overrides or {}).get("engine", {})}
            roles += [("prefill", prefill_over)] * (prefill_workers or target.topology.prefill_workers)
            roles += [("decode", overrides)] * (decode_workers or target.topology.decode_workers)
        else:
            roles += [("worker", overrides)] * (agg_workers or target.topology.workers)
        self.workers: list[DynamoWorker] = []
        counts: dict[str, int] = {}
        primary = "decode" if target.topology.kind == "disagg" else "worker"
        for role, over in roles:
            i = counts[role] = counts.get(role, -1) + 1
            log = self.log_file if (role, i) == (primary, 0) else folder / f"{role}-{i}.log"
            server = SimServer(target, faults=tuple(faults), overrides=over or None, env=env, log_file=log)
            self.workers.append(DynamoWorker(self, role, i, server))
        self.frontend = FrontendProcess(target, self.discovery_file, self.frontend_log, port=port,
                                        migration_limit=migration_limit, env=env)

    def __repr__(self) -> str:
        return f"DynamoSim({self.target.name}, frontend={self.frontend.url}, workers={len(self.workers)})"

    # -- the SimServer interface
    @property
    def url(self) -> str:
        return self.frontend.url

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def pid(self) -> int | None:
        return self.frontend.pid

    def start(self, timeout: float = 120.0) -> DynamoSim:
        deadline = time.monotonic() + timeout
        self._write_discovery()
        try:
            for w in self.workers:
                w.server.start(timeout=max(5.0, deadline - time.monotonic()))
                with self.lock:
                    self.publish(w)
            self.frontend.start(timeout=max(5.0, deadline - time.monotonic()))
            self.wait_serving(max(5.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()     # workers already up must not outlive a failed start
            raise
        return self

    def wait_serving(self, timeout: float) -> None:
        """Until ``/health`` is 200 and the model is listed (the worker set is complete)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                h = httpx.get(self.url + "/health", timeout=1.0)
                m = httpx.get(self.base_url + "/models", timeout=1.0).json()
                if h.status_code == 200 and any(d.get("id") == self.target.serving.served_model_name
                                                for d in m.get("data", [])):
                    return
                last = f"/health {h.status_code}, models {m}"
            except (httpx.HTTPError, ValueError) as err:
                last = type(err).__name__
            time.sleep(0.1)
        raise RuntimeError(f"Dynamo sim not serving after {timeout:.0f} s ({last}); frontend log tail:\n"
                           f"{_tail(self.frontend_log)}")

    def stop(self) -> None:
        """Stop the frontend and every worker; one that fails to stop does not keep the others running."""
        errors: list[BaseException] = []
        for stop in [self.frontend.stop, *(w.server.stop for w in self.workers)]:
            try:
                stop()
            except Exception as err:  # noqa: BLE001 - collected and re-raised after the others are stopped
                errors.append(err)
        if errors:
            raise errors[0]

    def restart(self) -> None:
        """Restart every worker (one at a time, like a rolling pod deletion) and wait until serving again."""
        for w in self.workers:
            w.restart()
        self.wait_serving(60.0)

    def __enter__(self) -> DynamoSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- discovery (etcd's role)
    def publish(self, w: DynamoWorker) -> None:
        self._published[id(w)] = {"instance_id": w.instance_id, "role": w.role, "url": w.url}
        self._write_discovery()

    def unpublish(self, w: DynamoWorker) -> None:
        self._published.pop(id(w), None)
        self._write_discovery()

    def _write_discovery(self) -> None:
        tmp = self.discovery_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"instances": list(self._published.values())}))
        os.replace(tmp, self.discovery_file)

    def workers_of(self, role: str) -> list[DynamoWorker]:
        return [w for w in self.workers if w.role == role]

    def worker_by_id(self, instance_id: int) -> DynamoWorker | None:
        return next((w for w in self.workers if w.instance_id == instance_id), None)


if __name__ == "__main__":
    raise SystemExit(main())
