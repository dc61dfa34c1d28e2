"""The simulator's HTTP server (aiohttp, one process, one event loop): vLLM 0.33's OpenAI-compatible API.

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``/health``, ``/ping``, ``/version``, ``/load``,
``/metrics``.  Requests are validated like vLLM (``validation.py``), answered by the deterministic responder,
tokenised with Tekken, scheduled by the engine loop and rendered byte-exactly (``wire.py``).  Log lines go to
the log file in vLLM's format.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any

from aiohttp import web

from pytest_ml4.evidence.tokenizer import (
    PromptError,
    SimTokenizer,
    get_tokenizer,
    prompt_text_len,
)
from pytest_ml4.stacks.vllm_versions import for_version
from pytest_ml4.target.model import Target
from pytest_ml4_sim.sim import wire
from pytest_ml4_sim.sim.boot import BootResult, boot_sequence
from pytest_ml4_sim.sim.engine import Engine, Sequence, block_hashes
from pytest_ml4_sim.sim.faults import ActiveFaults
from pytest_ml4_sim.sim.logfmt import uvicorn_line, vllm_line
from pytest_ml4_sim.sim.perfmodel import PerfModel
from pytest_ml4_sim.sim.promstats import SimMetrics
from pytest_ml4_sim.sim.responder import plan_response
from pytest_ml4_sim.sim.validation import (
    ApiError,
    Context,
    check_prompt_chars,
    check_request,
    engine_dead,
    grammar_terminated,
    parse_chat,
    resolve_max_tokens,
    truncate_prompt,
)

#: Path prefixes vLLM's API-key middleware guards (vllm/entrypoints/serve/middleware/authenticate.py).
_GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
_REASONING_FIELDS = ("reasoning", "reasoning_content", "both")
#: SIGTERM drains like uvicorn's graceful shutdown (tooling.md §3.6: in-flight streams finish normally), but at
#: most this long (``sim.extra.shutdown_drain_s``), under SimServer.stop()'s 10 s before SIGKILL; a second
#: SIGTERM/SIGINT cuts the drain at once (uvicorn's "CTRL+C to force quit").
DEFAULT_DRAIN_S = 8.0
#: What aiohttp gives a handler still open once the drain is over before cancelling it.
SHUTDOWN_GRACE_S = 1.0
#: uvicorn sets no body limit; 1 GiB lets the character pre-check answer even for 1M-token contexts.
MAX_BODY_BYTES = 1024 * 1024 * 1024


class LogWriter:
    """Appends vLLM-format lines to the log file (or stderr), flushed per line so readers can tail it."""

    def __init__(self, path: str | None, pid: int) -> None:
        self.pid = pid
        # Kept open for the process lifetime (closed by process exit), hence no context manager.
        self._fh: IO[str] = open(path, "a", buffering=1, encoding="utf-8") if path else sys.stderr  # noqa: SIM115

    def raw(self, line: str) -> None:
        self._fh.write(line + "\n")
        self._fh.flush()

    def api(self, level: str, fileinfo: str, lineno: int, message: str) -> None:
        self.raw(vllm_line("APIServer", self.pid, level, fileinfo, lineno, message))

    def uvicorn(self, message: str) -> None:
        self.raw(uvicorn_line(message))


@dataclass
class SimConfig:
    target: Target
    host: str = "127.0.0.1"
    port: int = 8000
    faults: ActiveFaults = field(default_factory=ActiveFaults)
    api_key: str | None = None
    log_file: str | None = None
    #: Standby start (``SimServer.restart``): import and load the tokenizer, then wait for this file to name the
    #: wall-clock time at which to boot and bind (see :func:`hold_until_released`).
    hold_file: str | None = None
    #: Boot generation: 0 for the first start, N for the engine the N-th restart booted (fault error_after_restart).
    generation: int = 0


def served_names(target: Target) -> list[str]:
    return [target.serving.engine_served_model_name or target.serving.served_model_name]


def fingerprint(target: Target) -> str:
    """``vllm-<version>-tpN-<hash8>`` (fingerprint mode ``full``, vllm.md §1.2)."""
    digest = hashlib.sha256(f"{target.name}|{target.engine.model_path}|{target.engine.version}".encode()).hexdigest()
    return f"vllm-{target.engine.version}-tp{target.topology.tensor_parallel}-{digest[:8]}"


class SimApp:
    """State of one running simulator (the aiohttp application's handlers)."""

    def __init__(self, cfg: SimConfig, boot: BootResult, log: LogWriter, tokenizer: SimTokenizer) -> None:
        t = cfg.target
        self.cfg = cfg
        self.target = t
        self.log = log
        self.tok = tokenizer
        # Computed once at boot (a vocabulary scan), not on the first request.
        self.max_chars_per_token = tokenizer.max_chars_per_token
        self.faults = cfg.faults
        self.names = served_names(t)
        self.wire_version = for_version(t.engine.version)
        self.max_model_len = (int(self.faults.value("served_max_model_len")) if self.faults.has("served_max_model_len")
                              else t.engine.max_model_len)
        self.ctx = Context(served_names=self.names, max_model_len=self.max_model_len,
                           reasoning_efforts=self.wire_version.reasoning_efforts)
        self.created = int(time.time())
        self.instance_id = f"{os.getpid()}@{self.created}"
        self.fingerprint = fingerprint(t)
        field_mode = str(t.sim.extra.get("reasoning_field", "reasoning"))
        if field_mode not in _REASONING_FIELDS:
            raise ValueError(f"sim.extra.reasoning_field must be one of {_REASONING_FIELDS}, got {field_mode!r}")
        # The boot's parsers: a quiet engine's (under_load=N leaves them on until the engine is busy, _opts_at).
        self.reasoning_parser = bool(t.engine.reasoning_parser) and not self.faults.acts_at_load("reasoning_parser_off", 0)
        # vLLM reports usage.prompt_tokens_details (cached tokens) only with --enable-prompt-tokens-details.
        self.prompt_details = ("--enable-prompt-tokens-details" in t.engine.extra_args
                               or bool(t.sim.extra.get("enable_prompt_tokens_details")))
        self.opts = wire.WireOptions(
            reasoning_parser=self.reasoning_parser,
            tool_parser=bool(t.engine.tool_call_parser) and t.engine.enable_auto_tool_choice
            and not self.faults.acts_at_load("tool_parser_off", 0) and not self.faults.has("tool_parser_hermes"),
            reasoning_field=field_mode,
            invalid_tool_json=self.faults.acts_at_load("invalid_tool_json", 0),
            bad_tool_ids=self.faults.has("bad_tool_ids"),
            reasoning_usage_missing=self.faults.has("reasoning_usage_missing"),
            usage_factor=self.faults.value("usage_overcount", 1.0) if self.faults.has("usage_overcount") else 1.0,
            empty_tool_calls=wire.version_tuple(t.engine.version) <= (0, 22, 99),
            kv_transfer_params=self.wire_version.kv_transfer_params,
            weight_versions=self.wire_version.weight_versions,
            eos_finish_delta_empty=self.wire_version.eos_finish_delta_empty,
        )
        self.metrics = SimMetrics(t, self.names[0], boot.num_gpu_blocks,
                                  extra_families=self.wire_version.metrics_families_extra)
        perf = PerfModel(t, itl_factor=self.faults.value("slow_decode", 1.0) or 1.0,
                         ttft_extra_s=self.faults.value("ttft_spike", 0.0),
                         accept_scale=self.faults.value("spec_accept_scale", 1.0),
                         tail_share=self.faults.value("tail_slow", 0.0))
        cap = int(self.faults.value("seq_cap")) if self.faults.has("seq_cap") else t.engine.max_num_seqs
        pool = boot.kv_pool_tokens or t.engine.max_model_len
        self.engine = Engine(perf=perf, metrics=self.metrics, max_num_seqs=cap, kv_pool_tokens=pool, log=log.api,
                             seed=int(t.sim.extra.get("seed", 0)),
                             stats_interval_s=float(t.sim.extra.get("stats_interval_s", 10.0)),
                             block_size=t.engine.block_size, prefix_caching=not self.faults.has("prefix_cache_off"),
                             crash_on_first_step=self._crash if boot.crash_on_first_step else None,
                             leaked_tokens=int(pool * self.faults.value("kv_leak")) if self.faults.has("kv_leak") else 0)
        self.boot = boot
        self._exit = os._exit  # replaced in tests; a crashing engine takes the whole process down
        self.rng = random.Random(int(t.sim.extra.get("seed", 0)) + 1)
        #: Requests being handled (streams until their last byte); ``idle`` is set whenever there are none.
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.error_rng = random.Random(int(t.sim.extra.get("seed", 0)) + 2)
        self.chat_requests = 0   # for the error_every schedule
        self.health_probes = 0   # for health_503 (the first probe, the start-up wait, still passes)
        self.stopping = asyncio.Event()   # set on SIGTERM (truncate_on_stop)

    async def _instance_header(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[ENGINE_INSTANCE_HEADER] = self.instance_id

    # ------------------------------------------------------------------ app
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._access_log_middleware, self._auth_middleware],
                              client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_post("/ping", self.health)
        if self.wire_version.tokenize_endpoint:
            app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/version", self.version)
        app.router.add_get("/load", self.load)
        app.router.add_get("/metrics", self.metrics_handler)
        app.on_response_prepare.append(_server_header)
        app.on_response_prepare.append(self._instance_header)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.engine.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.engine.stop()

    @web.middleware
    async def _auth_middleware(self, request: web.Request,
                               handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        key = None if self.faults.has("no_auth") else self.cfg.api_key
        if key and request.method != "OPTIONS" and request.path.startswith(_GUARDED_PREFIXES):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            # Constant-time comparison, like vLLM's middleware.
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
                return _json('{"error":"Unauthorized"}', status=401)
        return await handler(request)

    @web.middleware
    async def _access_log_middleware(self, request: web.Request,
                                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                                     ) -> web.StreamResponse:
        # Outermost, like uvicorn's access log: refused (401) requests are logged too.
        self.inflight += 1
        self.idle.clear()
        t0 = time.monotonic()
        try:
            resp = await handler(request)
        finally:
            self.inflight -= 1
            if not self.inflight:
                self.idle.set()
        route = request.match_info.route.resource
        if route is not None and resp.status != 401:
            self.metrics.http_request(route.canonical, request.method, resp.status, request.content_length or 0,
                                      resp.content_length or 0, time.monotonic() - t0)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        host = f"{peer[0]}:{peer[1]}" if peer else "-"
        status = resp.status
        reason = resp.reason or ""
        path = request.path_qs
        if self.cfg.api_key and self.cfg.api_key in path:
            # A client that put the key in the URL must not get it into the engine log.
            path = path.replace(self.cfg.api_key, "***")
        self.log.uvicorn(f'{host} - "{request.method} {path} HTTP/{request.version.major}.'
                         f'{request.version.minor}" {status} {reason}')
        return resp

    # ------------------------------------------------------------------ simple endpoints
    async def health(self, request: web.Request) -> web.Response:
        # EngineDeadError -> 503 (vllm/entrypoints/serve/instrumentator/health.py).
        self.health_probes += 1
        dead = self.engine.dead or (self.faults.has("health_503") and self.health_probes > 1)
        return web.Response(status=503 if dead else 200, body=b"")

    async def version(self, request: web.Request) -> web.Response:
        return _json(f'{{"version":"{self.target.engine.version}"}}')

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize`` for a ``prompt`` (the form the re-counts use; chat ``messages`` too)."""
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _json('{"error":{"message":"invalid JSON","type":"Bad Request","param":null,"code":400}}', 400)
        if isinstance(body.get("messages"), list):
            try:
                ids = self._prompt_ids(body)
            except ApiError as err:
                return _json(err.body(), status=err.status)
        else:
            raw = self.tok._tok
            ids = list(raw.encode(str(body.get("prompt", "")), bos=bool(body.get("add_special_tokens", True)),
                                  eos=False))
        return _json(wire._dumps({"count": len(ids), "max_model_len": self.target.engine.max_model_len,
                                  "tokens": ids, "token_strs": None}))

    async def load(self, request: web.Request) -> web.Response:
        return _json(f'{{"server_load":{self.engine.load}}}')

    async def models(self, request: web.Request) -> web.Response:
        cards = []
        for name in () if self.faults.has("model_unlisted") else self.names:
            cards.append({"id": name, "object": "model", "created": self.created, "owned_by": "vllm",
                          "root": self.target.engine.model_path, "parent": None,
                          "max_model_len": self.max_model_len,
                          "permission": [{"id": f"modelperm-{_hex16()}", "object": "model_permission",
                                          "created": self.created, "allow_create_engine": False,
                                          "allow_sampling": True, "allow_logprobs": True,
                                          "allow_search_indices": False, "allow_view": True,
                                          "allow_fine_tuning": False, "organization": "*", "group": None,
                                          "is_blocking": False}]})
        return _json(wire._dumps({"object": "list", "data": cards}))

    async def metrics_handler(self, request: web.Request) -> web.Response:
        if self.faults.has("metrics_unreadable"):
            return web.Response(status=500, text="Internal Server Error")
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": self.wire_version.metrics_content_type})

    # ------------------------------------------------------------------ chat
    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body, req = parse_chat(await request.read())
            tool_choice = self._checked_tool_choice(req, body)
            check_prompt_chars(prompt_text_len(body), self.ctx, self.max_chars_per_token, req.truncate_prompt_tokens)
            prompt_ids = truncate_prompt(self._prompt_ids(body), req, self.ctx)
            max_tokens, requested = resolve_max_tokens(req, len(prompt_ids), self.ctx)
            if self._scheduled_error():
                self.metrics.inc("vllm:request_success", finished_reason="error")
                raise engine_dead()
            if self._grammar_kills_this_request():
                self._log_grammar_kill("chatcmpl-" + (request.headers.get("X-Request-Id") or _hex16()))
                self.metrics.inc("vllm:request_success", finished_reason="abort")
                raise grammar_terminated()
        except ApiError as e:
            return _json(e.body(), status=e.status)

        in_flight = self.engine.load   # what the engine holds as it admits this request (fault under_load)
        opts = self._opts_at(in_flight)
        out = self._generate(body, req, tool_choice, max_tokens, in_flight)
        ids = [wire.tool_call_id(self.rng, self.opts.bad_tool_ids) for _ in out.call_names]
        keep_parallel = req.parallel_tool_calls is not False or self.faults.has("parallel_tool_calls_ignored")
        named = isinstance(tool_choice, dict)
        # resolve_finish_reason: tool calls turn "stop" into "tool_calls", except for a named tool choice.
        finish = "tool_calls" if out.call_names and out.finish == "stop" and not named else out.finish
        req_id = "chatcmpl-" + (request.headers.get("X-Request-Id") or _hex16())
        seq = Sequence(req_id=req_id, prompt_tokens=len(prompt_ids), output_tokens=out.completion_tokens,
                       max_tokens=max_tokens, finish_reason=out.finish, params_max_tokens=requested,
                       block_hashes=block_hashes(prompt_ids, self.target.engine.block_size))
        self.engine.add(seq)
        if req.stream:
            return await self._stream(request, req, out, seq, ids, keep_parallel, finish, len(prompt_ids), opts)
        while seq.emitted < seq.output_tokens:
            if await seq.queue.get() == 0:
                err = engine_dead()
                return _json(err.body(), status=err.status)
        forced = named or tool_choice == "required"
        return _json(self._body(out, ids, keep_parallel, forced, finish, req_id, len(prompt_ids),
                                req.include_reasoning, seq.cached_tokens if self.prompt_details else None, opts))

    def _checked_tool_choice(self, req: Any, body: dict[str, Any]) -> Any:
        """vLLM's request checks; the accepts_invalid fault serves what they would refuse. (An unknown model served,
        tool_choice 'none' ignored or an over-long prompt cut are a proxy's or an ingress's defects, never vLLM's:
        faults any_model and tool_choice_none_ignored act at the Dynamo fault gateway, and on the vLLM stack the
        kill matrix proves them through the real LiteLLM proxy with recorded broken configs.)"""
        try:
            tool_choice = check_request(req, self.ctx, body)
        except ApiError as e:
            lenient = e.status == 400 and self.faults.has("accepts_invalid")
            if not lenient:
                raise
            tool_choice = "auto" if req.tools else "none"
        return tool_choice

    def _scheduled_error(self) -> bool:
        """error_rate: a random fraction; error_every=K: the 1st, K+1th, 2K+1th ... request (deterministic)."""
        self.chat_requests += 1
        if self.faults.from_restart("error_after_restart", self.cfg.generation):
            return True  # only the engine the N-th restart booted is broken
        if self.faults.has("error_every"):
            every = max(1, int(self.faults.value("error_every")))
            return (self.chat_requests - 1) % every == 0
        return self.faults.has("error_rate") and self.error_rng.random() < self.faults.value("error_rate")

    def _grammar_kills_this_request(self) -> bool:
        """grammar_kill=K: the K-th chat request (counted with the error schedule's counter) is terminated."""
        return self.faults.has("grammar_kill") and self.chat_requests == max(1, int(self.faults.value("grammar_kill")))

    def _log_grammar_kill(self, req_id: str) -> None:
        # The two EngineCore lines real vLLM logs when the grammar rejects a sampled token and it ends the request
        # (recorded through real dynamo.vllm: shared/reference/real-dynamo-vllm-1.6.1-transcripts/agg/worker.log).
        self.log.raw(vllm_line("EngineCore_DP0", self.log.pid, "ERROR", "backend_xgrammar.py", 170,
                               f"Failed to advance FSM for request {req_id} for tokens 9. Please file an issue."))
        self.log.raw(vllm_line("EngineCore_DP0", self.log.pid, "ERROR", "scheduler.py", 2130,
                               f"Unexpected: grammar rejected tokens [9] for request {req_id}. Terminating request."))

    def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        try:
            return self.tok.prompt_ids(body)
        except PromptError as e:
            raise ApiError(400, str(e), "BadRequestError", None) from None

    def _opts_at(self, in_flight: int) -> wire.WireOptions:
        """The wire options of a request admitted while the engine holds ``in_flight`` others: the boot's, with
        the answer-level faults that act at that load (fault ``under_load``; without it, the boot's alone)."""
        if not self.faults.has("under_load"):
            return self.opts
        acts = self.faults.acts_at_load
        return dataclasses.replace(
            self.opts, reasoning_parser=self.opts.reasoning_parser and not acts("reasoning_parser_off", in_flight),
            tool_parser=self.opts.tool_parser and not acts("tool_parser_off", in_flight),
            invalid_tool_json=self.opts.invalid_tool_json or acts("invalid_tool_json", in_flight))

    def _generate(self, body: dict[str, Any], req: Any, tool_choice: Any, max_tokens: int,
                  in_flight: int = 0) -> wire.Output:
        """The response's output tokens: the responder's plan, tokenised and fitted to the token limits
        (``in_flight``: what the engine holds as it admits the request, for the load-only faults)."""
        if (self.tok.version < 15 or self.faults.has("reasoning_effort_ignored")) and "reasoning_effort" in body:
            # vLLM passes reasoning_effort to Mistral tokenizers only from v15 on (vllm.md §3.1): older ones
            # never see it, so the model thinks at its default length.
            body = {k: v for k, v in body.items() if k != "reasoning_effort"}
        elif self.wire_version.default_reasoning_effort and body.get("reasoning_effort") is None:
            # The tokenizer's default effort reaches the model's prompt when the request names none.
            body = {**body, "reasoning_effort": self.wire_version.default_reasoning_effort}
        plan = plan_response(body, tool_choice, self.faults)
        min_tokens = 0 if self.faults.acts_at_load("min_tokens_ignored", in_flight) else req.min_tokens
        limits = wire.Limits(max_tokens, min_tokens, req.ignore_eos, req.thinking_token_budget)
        return wire.build_output(plan, self.tok, limits, self._opts_at(in_flight))

    def _body(self, out: wire.Output, ids: list[str], keep_parallel: bool, forced: bool, finish: str, req_id: str,
              prompt_tokens: int, include_reasoning: bool, cached_tokens: int | None,
              opts: wire.WireOptions | None = None) -> str:
        """The non-streaming response (``model_dump()`` of ChatCompletionResponse)."""
        opts = opts or self.opts
        asm = wire.assemble(out, ids, keep_parallel, include_reasoning)
        # Forced calls (required / named tool) report content "" rather than null.
        content_override = "" if (forced and asm.tool_calls and not asm.content) else None
        message = wire.message_json(asm, content_override, opts.reasoning_field, opts.empty_tool_calls)
        reasoning_tokens = None
        if opts.reasoning_parser:
            reasoning_tokens = 0 if opts.reasoning_usage_missing else asm.reasoning_tokens
        return wire.response_body(req_id=req_id, created=int(time.time()), model=self.names[0], message=message,
                                  finish=finish, prompt_tokens=prompt_tokens,
                                  completion_tokens=wire.reported_completion(out.completion_tokens, self.opts),
                                  reasoning_tokens=reasoning_tokens, fingerprint=self.fingerprint,
                                  cached_tokens=cached_tokens, weight_versions=self.opts.weight_versions)

    async def _stream(self, request: web.Request, req: Any, out: wire.Output, seq: Sequence, ids: list[str],
                      keep_parallel: bool, finish: str, prompt_tokens: int,
                      wire_opts: wire.WireOptions | None = None) -> web.StreamResponse:
        opts = req.stream_options
        wire_opts = wire_opts or self.opts
        include_usage = bool(opts and opts.include_usage)
        renderer = wire.StreamRenderer(
            out, req_id=seq.req_id, created=int(time.time()), model=self.names[0],
            opts=dataclasses.replace(wire_opts, include_reasoning=req.include_reasoning), ids=ids,
            keep_parallel=keep_parallel, include_usage=include_usage,
            continuous=bool(opts and opts.continuous_usage_stats), prompt_tokens=prompt_tokens,
            fingerprint=self.fingerprint, reasoning_details=wire_opts.reasoning_parser, finish_reason=finish)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        midstream_at = out.completion_tokens // 2 if self.faults.has("midstream_error") else -1
        try:
            first = True
            while renderer.pos < len(out.tokens):
                n = await seq.queue.get()
                if n == 0:
                    err = engine_dead()
                    await resp.write((renderer.error_event(err.message, err.err_type, err.status)
                                      + renderer.DONE).encode())
                    return resp
                chunks = renderer.step(n)
                if first:
                    chunks.insert(0, renderer.role_chunk())
                    first = False
                if chunks:
                    await resp.write("".join(chunks).encode())
                if self.stopping.is_set() and self.faults.has("truncate_on_stop"):
                    self.engine.abort(seq)
                    await resp.write_eof()   # a clean close: no finish_reason, no [DONE], no error
                    return resp
                if 0 <= midstream_at <= renderer.pos and renderer.pos < len(out.tokens):
                    self.engine.abort(seq)
                    await resp.write((renderer.error_event("The server had an error while processing your "
                                                           "request.", "InternalServerError", 500)
                                      + renderer.DONE).encode())
                    return resp
            tail = ""
            if self.prompt_details:
                renderer.cached_tokens = seq.cached_tokens
            if include_usage and not self.faults.has("no_usage_chunk"):
                tail += renderer.usage_chunk()
            if not self.faults.has("no_done"):
                tail += renderer.DONE
            if tail:
                await resp.write(tail.encode())
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.abort(seq)
            raise
        return resp

    # ------------------------------------------------------------------ engine death
    def _crash(self, step_tokens: int) -> None:
        # Chunked prefill: one step never schedules more than max_num_batched_tokens.
        if min(step_tokens, self.target.engine.max_num_batched_tokens) < self.boot.crash_min_step_tokens:
            return
        self.log.raw(vllm_line("EngineCore", self.log.pid, "ERROR", "core.py", 1056,
                               "EngineCore encountered a fatal error."))
        for line in self.boot.crash_lines:
            self.log.raw(line)
        self.log.api("ERROR", "async_llm.py", 541, "AsyncLLM output_handler failed.")
        self.log.raw(vllm_line("APIServer", self.log.pid, "ERROR", "core_client.py", 610,
                               "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"))
        self._exit(1)


def _hex16() -> str:
    return uuid.uuid4().hex[:16]


def _json(text: str, status: int = 200) -> web.Response:
    # Starlette's JSONResponse sends plain "application/json" (aiohttp's text= would add a charset).
    return web.Response(status=status, body=text.encode(), headers={"Content-Type": "application/json"})


#: Which engine process answered (pid and start time): the restart scenario's per-request evidence of the engine
#: incarnation, so recovery never counts a request the old engine served. Simulator only: a real vLLM sends no
#: such header, and live runs bracket each request with the controller's incarnation instead (InvocationID).
#: LiteLLM passes it on as ``llm_provider-x-ml4-engine-instance``.
ENGINE_INSTANCE_HEADER = "x-ml4-engine-instance"


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    # vLLM is served by uvicorn.
    response.headers["Server"] = "uvicorn"


# ---------------------------------------------------------------------- process entry
def startup_lines(cfg: SimConfig, log: LogWriter) -> None:
    t = cfg.target
    e = t.engine
    log.api("INFO", "utils.py", 299, f"vLLM server version {e.version}, serving model {e.model_path}")
    args: dict[str, Any] = {"model_tag": e.model_path, "host": cfg.host, "port": cfg.port,
                            "served_model_name": served_names(t), "max_model_len": e.max_model_len,
                            "max_num_seqs": e.max_num_seqs, "max_num_batched_tokens": e.max_num_batched_tokens,
                            "gpu_memory_utilization": e.gpu_memory_utilization, "kv_cache_dtype": e.kv_cache_dtype,
                            "tensor_parallel_size": t.topology.tensor_parallel, "tokenizer_mode": "mistral"}
    if e.reasoning_parser:
        args["reasoning_parser"] = e.reasoning_parser
    if e.tool_call_parser:
        args["tool_call_parser"] = e.tool_call_parser
        args["enable_auto_tool_choice"] = e.enable_auto_tool_choice
    if e.speculative:
        args["speculative_config"] = {"method": e.speculative.method,
                                      "num_speculative_tokens": e.speculative.num_speculative_tokens}
        if e.speculative.synthetic_acceptance:
            args["speculative_config"]["synthetic_acceptance_rate"] = 0.7   # as the preflight fixtures' DSpark flag
    if cfg.api_key:
        args["api_key"] = ["[redacted]"]
    log.api("INFO", "utils.py", 233, f"non-default args: {args}")


def route_lines(cfg: SimConfig, log: LogWriter) -> None:
    log.api("INFO", "api_server.py", 1521, "Supported tasks: ['generate']")
    log.api("INFO", "api_server.py", 1890, f"Starting vLLM server on http://{cfg.host}:{cfg.port}")
    log.api("INFO", "launcher.py", 46, "Available routes are:")
    for path, methods in (("/health", "GET"), ("/load", "GET"), ("/ping", "GET, POST"), ("/version", "GET"),
                          ("/v1/models", "GET"), ("/v1/chat/completions", "POST"), ("/metrics", "GET")):
        log.api("INFO", "launcher.py", 54, f"Route: {path}, Methods: {methods}")


async def serve(cfg: SimConfig) -> int:
    """Boot, bind, serve until cancelled; returns the process exit code."""
    pid = os.getpid()
    log = LogWriter(cfg.log_file, pid)
    startup_lines(cfg, log)
    boot = boot_sequence(cfg.target, pid)
    for line in boot.lines:
        log.raw(line)
    if not boot.alive:
        if boot.exit_message:
            log.raw(vllm_line("EngineCore", pid, "ERROR", "core.py", 1102, "EngineCore failed to start."))
        log.raw(vllm_line("APIServer", pid, "ERROR", "utils.py", 920,
                          "RuntimeError: Engine core initialization failed. See root cause above. "
                          "Failed core proc(s): {'EngineCore_DP0': 1}"))
        return 1
    tokenizer = get_tokenizer(cfg.target.engine.tokenizer_version)
    sim = SimApp(cfg, boot, log, tokenizer)
    route_lines(cfg, log)
    runner = web.AppRunner(sim.app(), access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
    log.uvicorn(f"Started server process [{pid}]")
    log.uvicorn("Waiting for application startup.")
    await site.start()
    log.uvicorn("Application startup complete.")
    stop, force = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            force.set()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await stop.wait()
    sim.stopping.set()
    log.uvicorn("Shutting down")
    await site.stop()  # no new connections; the open ones finish their requests
    if sim.inflight:
        log.uvicorn("Waiting for connections to close. (CTRL+C to force quit)")
        await _first(sim.idle.wait(), force.wait(), timeout=float(cfg.target.sim.extra.get("shutdown_drain_s",
                                                                                           DEFAULT_DRAIN_S)))
    await sim.engine.stop()
    log.uvicorn("Waiting for application shutdown.")
    try:
        await asyncio.wait_for(runner.cleanup(), timeout=SHUTDOWN_GRACE_S + 2.0)
    except TimeoutError:
        log.uvicorn("Cancel requests still open at shutdown.")
    log.uvicorn("Application shutdown complete.")
    log.uvicorn(f"Finished server process [{pid}]")
    return 0


async def _first(*aws: Awaitable[Any], timeout: float) -> None:
    """Wait until any of ``aws`` finishes or ``timeout`` passes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
