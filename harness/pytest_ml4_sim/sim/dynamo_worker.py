"""A real Dynamo Python worker (``@dynamo_worker``, ``register_llm``, ``serve_endpoint``) on the simulated engine.

Runs inside the Dynamo venv (``scripts/install.d/50-dynamo.sh``) with the checkout on ``PYTHONPATH``, behind the
real ``python -m dynamo.frontend`` (shared/reference/real-dynamo.md "A plain Python worker behind the real
frontend"). The frontend tokenises the chat request and sends ``token_ids``; this worker decodes them back into
the conversation (system prompt, tools, turns, tool results) for the project's responder, builds the model's raw
output tokens (``wire.build_output``: min_tokens / ignore_eos padding, thinking budget, faults), rewrites the tool
calls into the form :mod:`pytest_ml4_sim.sim.dynamo_bridge` chooses, and yields the token ids step by step as the
simulated engine (perf model, ``max_num_seqs`` scheduler, speculative bursts) emits them. It cuts at
``max_tokens`` itself (the frontend does not), publishes its context length and token budget (so the frontend
answers an over-long prompt 400 ``context_length``), serves the ``vllm:*`` metrics on its own system port
(``DYN_SYSTEM_PORT``) and on SIGTERM deregisters (``runtime.shutdown``) and drains.

Its process (arguments, registration, SIGTERM) is :mod:`pytest_ml4_sim.deploy.dynamo_worker_cli`.

``--generation N``: this process is the worker the N-th restart of its pod booted (0: the first start); the
faults that break only a restarted engine (``error_after_restart``, as on the HTTP simulator) read it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from pytest_ml4.evidence.tokenizer import SPECIAL_TOKENS
from pytest_ml4.stacks.dynamo_versions import DynamoBehaviour, first_schema_keyword
from pytest_ml4.stacks.dynamo_versions import behaviour as version_row
from pytest_ml4.target.model import Target
from pytest_ml4_sim.sim import wire
from pytest_ml4_sim.sim.dynamo_bridge import GUIDED, Behaviour, tool_calls_text
from pytest_ml4_sim.sim.engine import Sequence, block_hashes
from pytest_ml4_sim.sim.faults import ActiveFaults

#: Dynamo component per role (dynamo.md §3: the decode/agg component is ``backend``).
COMPONENTS = {"worker": "backend", "prefill": "prefill", "decode": "backend"}
NAMESPACE = "dynamo"
EOS_ID = SPECIAL_TOKENS.index("</s>")
_SPECIAL_IDS = {s: i for i, s in enumerate(SPECIAL_TOKENS)}
_SEGMENT = re.compile(r"(\[/?[A-Z_]+\]|</s>|<s>)")


# ----------------------------------------------------------------------------------------- prompt -> conversation
def conversation(prompt: str) -> dict[str, Any]:
    """The chat request a Mistral-format prompt came from, as far as the responder needs it: ``messages`` (system,
    user turns, assistant tool calls, tool results) and ``tools``."""
    messages: list[dict[str, Any]] = []
    tools: list[Any] = []
    parts = [p for p in _SEGMENT.split(prompt) if p]
    i = 0
    while i < len(parts):
        tok = parts[i]
        body = parts[i + 1] if i + 1 < len(parts) and not _SEGMENT.fullmatch(parts[i + 1]) else ""
        step = 2 if body else 1
        if tok == "[SYSTEM_PROMPT]":
            messages.append({"role": "system", "content": body})
        elif tok == "[AVAILABLE_TOOLS]":
            try:
                tools = list(json.loads(body))
            except ValueError:
                tools = []
        elif tok == "[INST]":
            messages.append({"role": "user", "content": body})
        elif tok == "[TOOL_CALLS]":
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [{"id": None, "function": {"name": body, "arguments": ""}}]})
        elif tok == "[TOOL_RESULTS]":
            messages.append({"role": "tool", "content": body, "tool_call_id": None})
        elif tok == "[/INST]" and body.strip():
            messages.append({"role": "assistant", "content": body})
        i += step
    return {"messages": messages, "tools": tools}


def guided_schema(request: dict[str, Any], faults: ActiveFaults | None = None) -> dict[str, Any] | None:
    """The ``guided_decoding.json`` grammar the engine enforces (None: none, or the ``guided_decoding_ignored``
    fault, an engine that samples freely whatever grammar it is given)."""
    if faults is not None and faults.has("guided_decoding_ignored"):
        return None
    guided = ((request.get("sampling_options") or {}).get("guided_decoding") or {}).get("json")
    return guided if isinstance(guided, dict) else None


def tool_choice_of(request: dict[str, Any], tools: list[Any], faults: ActiveFaults | None = None) -> Any:
    """``tool_choice`` as the frontend passed it: ``required``/named arrive as ``guided_decoding.json`` (an array
    schema whose items enumerate the allowed names); no tools rendered means none or auto without tools."""
    guided = guided_schema(request, faults)
    if guided is None:
        return "auto"
    names: list[str] = []
    for alt in ((guided.get("items") or {}).get("anyOf") or []):
        names += ((alt.get("properties") or {}).get("name") or {}).get("enum") or []
    if len(names) == 1 and len(tools) > 1:
        return {"type": "function", "function": {"name": names[0]}}
    return "required"


def refused_schema_keyword(guided: dict[str, Any] | None, row: DynamoBehaviour | None) -> str | None:
    """The JSON-schema keyword of the guided-JSON grammar that the emulated release's grammar backend refuses
    (``guided_json_refused_keywords`` of its ``pytest_ml4/data/dynamo/versions.yaml`` row; 1.6.1 passes the tools' raw
    schemas into that grammar), or None."""
    if guided is None or row is None:
        return None
    return first_schema_keyword(guided, row.guided_json_refused_keywords)


def prompt_tokens_details(request: dict[str, Any], own: dict[str, Any]) -> Any:
    """``usage.prompt_tokens_details`` as real ``dynamo.vllm`` reports it: a decode worker that received a
    ``prefill_result`` copies the prefill worker's figures (the transferred prefill KV counts as cached;
    dynamo/vllm/handlers.py ``prefill_prompt_tokens_details``), even when they are absent; otherwise its own."""
    prefill = request.get("prefill_result")
    if isinstance(prefill, dict):
        return prefill.get("prompt_tokens_details")
    return own


def reasoning_effort_of(request: dict[str, Any]) -> str | None:
    kwargs = ((request.get("extra_args") or {}).get("reasoning_parser_kwargs") or {}).get("chat_template_kwargs")
    effort = (kwargs or {}).get("reasoning_effort")
    return str(effort) if effort else None


# ----------------------------------------------------------------------------------------- output tokens
@dataclass
class Reply:
    ids: list[int]
    finish: str  # "stop" | "length"


def _ids_of(tok: Any, segments: list[str], dropped: frozenset[str] = frozenset()) -> list[int]:
    out: list[int] = []
    for seg in segments:
        if seg in dropped:
            continue
        if seg in _SPECIAL_IDS:
            out.append(_SPECIAL_IDS[seg])
        elif seg:
            out += tok._tok.encode(seg, bos=False, eos=False)
    return out


def reply_ids(out: wire.Output, tok: Any, tool_form: str, max_tokens: int,
              dropped: frozenset[str] = frozenset()) -> Reply:
    """Token ids of the engine output, tool calls rewritten to ``tool_form``, cut at ``max_tokens``; the special
    tokens in ``dropped`` are left out (:func:`markers_lost`)."""
    segments: list[str] = []
    calls: dict[int, list[str]] = {}
    args: dict[int, list[str]] = {}
    eos = False
    for kind, text, idx in out.tokens:
        if kind == wire.EOS:
            eos = True
        elif kind == wire.TC_NAME:
            calls.setdefault(idx, []).append(text)
        elif kind == wire.ARG:
            args.setdefault(idx, []).append(text)
        elif kind in (wire.TC_START, wire.ARGS_MARK):
            calls.setdefault(idx, [])
        else:
            segments.append(text)
    if calls:
        pairs = [("".join(calls[i]), "".join(args.get(i, [])) + out.held.get(i, "")) for i in sorted(calls)]
        segments += tool_calls_text(pairs, tool_form)
    ids = _ids_of(tok, segments, dropped)
    finish = out.finish
    if len(ids) > max_tokens:
        ids, finish = ids[:max_tokens], "length"
    elif eos and len(ids) < max_tokens:
        ids.append(EOS_ID)
    return Reply(ids, finish)


#: The special tokens a load-only parser fault loses (fault under_load): Dynamo's parsers run in the frontend, which
#: stays configured, so the defect is an engine that emits the reasoning or the calls without their markers while
#: busy: the frontend then passes them on as content.
LOST_MARKERS = {"reasoning_parser_off": frozenset({"[THINK]", "[/THINK]"}), "tool_parser_off": frozenset({"[TOOL_CALLS]"})}


def markers_lost(faults: ActiveFaults, in_flight: int) -> frozenset[str]:
    """The markers left out of a reply admitted while the engine holds ``in_flight`` others (only with
    ``under_load``: without it the parser faults act where the worker registers its parsers, :func:`runtime_config`)."""
    if not faults.has("under_load"):
        return frozenset()
    return frozenset().union(*(m for f, m in LOST_MARKERS.items() if faults.acts_at_load(f, in_flight)))


# ----------------------------------------------------------------------------------------- KV events
class KvEvents:
    """The engine's simulated prefix cache, published as Dynamo KV events (``KvEventPublisher``, push mode): the
    real KV router only knows what is cached where from these, so without them it reports no overlap
    (``kv_hit_rate`` 0) and routes nothing by prefix. Stored: the blocks a request added after its cached prefix
    (chained under the last hit block); removed: the blocks the engine evicted when the pool was full."""

    def __init__(self, publisher: Any, block_size: int) -> None:
        self.publisher, self.block_size = publisher, block_size
        # Prompt token ids per admitted sequence (the engine's Sequence carries only counts and hashes).
        self.tokens: weakref.WeakKeyDictionary[Sequence, list[int]] = weakref.WeakKeyDictionary()

    def track(self, seq: Sequence, prompt_ids: list[int]) -> None:
        self.tokens[seq] = prompt_ids

    def __call__(self, seq: Sequence, hit_blocks: int, evicted: list[int]) -> None:
        new = list(seq.block_hashes[hit_blocks:])
        ids = self.tokens.pop(seq, None)
        bs = self.block_size
        if new and ids is not None:
            # Stored before removed: a prompt longer than the pool evicts some of its own blocks.
            self.publisher.publish_stored(token_ids=ids[hit_blocks * bs:(hit_blocks + len(new)) * bs],
                                          num_block_tokens=[bs] * len(new), block_hashes=new,
                                          parent_hash=seq.block_hashes[hit_blocks - 1] if hit_blocks else None)
        if evicted:
            self.publisher.publish_removed(evicted)


# ----------------------------------------------------------------------------------------- the worker
@dataclass
class Limits:
    """The request fields ``SimApp._generate`` reads (vLLM's request model in the HTTP simulator)."""

    min_tokens: int = 0
    ignore_eos: bool = False
    thinking_token_budget: int | None = None


class Worker:
    """Engine + responder behind one Dynamo endpoint."""

    def __init__(self, target: Target, role: str, faults: ActiveFaults, mode: Behaviour, log_file: str | None,
                 generation: int = 0) -> None:
        from pytest_ml4.evidence.tokenizer import get_tokenizer
        from pytest_ml4_sim.sim.boot import boot_sequence
        from pytest_ml4_sim.sim.server import (
            LogWriter,
            SimApp,
            SimConfig,
            startup_lines,
        )

        self.target, self.role, self.mode = target, role, mode
        self.generation = generation
        pid = os.getpid()
        self.log = LogWriter(log_file, pid)
        cfg = SimConfig(target=target, faults=faults, log_file=log_file)
        startup_lines(cfg, self.log)
        self.boot = boot_sequence(target, pid)
        for line in self.boot.lines:
            self.log.raw(line)
        self.app: Any = None
        if self.boot.alive:
            # SimApp holds the engine, metrics, wire options and responder glue of the HTTP simulator; this
            # worker uses them without its HTTP layer.
            self.app = SimApp(cfg, self.boot, self.log, get_tokenizer(target.engine.tokenizer_version))
            self.app.opts.tool_parser = True  # the frontend parses; the engine output always carries the calls
        self.draining = False
        self.kv_events: KvEvents | None = None
        #: The release whose engine-side behaviour this worker emulates (the target's serving.dynamo_version).
        self.release = version_row(target.serving.dynamo_version or "")

    @property
    def broken_by_restart(self) -> bool:
        """``error_after_restart=N``: the engine booted by the N-th restart (and later ones) fails every request,
        while its /health still says ready (a restart that picked up a broken image or config)."""
        return self.app.faults.from_restart("error_after_restart", self.generation)

    def one_worker_fault(self, name: str) -> bool:
        """A parser fault confined to this worker (``only_worker``): the frontend's parsers are the deployment's,
        so it shows in this worker's output (faults.py ``ONE_WORKER_FAULTS``)."""
        return self.app.faults.has(name) and self.app.faults.has("only_worker")

    def publish_kv_events(self, publisher: Any) -> None:
        self.kv_events = KvEvents(publisher, self.target.engine.block_size)
        self.app.engine.on_prefix_cache = self.kv_events

    def metrics_text(self) -> str:
        """The ``vllm:*`` families the runtime serves on the worker's system port (``metrics_unreadable``: the
        engine's metrics collection fails, as /metrics answering 500 does on vLLM)."""
        if self.app.faults.has("metrics_unreadable"):
            raise RuntimeError("simulated engine metrics failure (fault metrics_unreadable)")
        return self.app.metrics.render().decode()

    def prompt_body(self, request: dict[str, Any]) -> dict[str, Any]:
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        text = self.app.tok._tok.decode(list(request.get("token_ids") or []), special_token_policy=SpecialTokenPolicy.KEEP)
        body = conversation(text)
        effort = None if self.one_worker_fault("reasoning_parser_off") else reasoning_effort_of(request)
        if effort is None and not self.mode.think_without_effort:
            effort = "none"
        if effort is not None:
            body["reasoning_effort"] = effort
        return body

    def refuse_unimplemented_schema(self, guided: dict[str, Any] | None) -> None:
        """As vLLM 0.31's grammar backends under real ``dynamo.vllm``: a schema keyword they do not implement is
        logged and the request refused with a client error (``HttpError`` 400, what dynamo.vllm raises for vLLM's
        request errors; the frontend answers 400 ``Bad Request``, or in a stream the in-band ``Invalid request``)."""
        keyword = refused_schema_keyword(guided, self.release)
        if keyword is None:
            return
        from dynamo.llm.exceptions import HttpError

        from pytest_ml4_sim.sim.logfmt import vllm_line

        message = f'Grammar error: Unimplemented keys: ["{keyword}"]'
        self.log.raw(vllm_line("EngineCore_DP0", os.getpid(), "ERROR", "backend_xgrammar.py", 180, message))
        raise HttpError(400, message)

    async def generate(self, request: dict[str, Any], context: Any) -> Any:
        app = self.app
        prompt_ids = list(request.get("token_ids") or [])
        stop = request.get("stop_conditions") or {}
        max_tokens = int(stop.get("max_tokens") or self.target.engine.max_model_len - len(prompt_ids))
        if self.role == "prefill":
            max_tokens = 1
        body = self.prompt_body(request)
        tool_choice = tool_choice_of(request, body["tools"], app.faults)
        if not self.mode.think_before_tool_call and body["tools"] and tool_choice != "none":
            body["reasoning_effort"] = "none"
        limits = Limits(int(stop.get("min_tokens") or 0), bool(stop.get("ignore_eos")),
                        stop.get("max_thinking_tokens"))
        guided = guided_schema(request, app.faults)
        self.refuse_unimplemented_schema(guided)
        in_flight = app.engine.load   # what the engine holds as it admits this request (fault under_load)
        out = app._generate(body, limits, tool_choice, max_tokens, in_flight)
        form = GUIDED if guided is not None else self.mode.tool_form
        if guided is None and self.one_worker_fault("tool_parser_off"):
            form = UNPARSED_FORM
        reply = reply_ids(out, app.tok, form, max_tokens, markers_lost(app.faults, in_flight))
        if self.broken_by_restart:
            # As vLLM's dead engine answers (EngineDeadError); Dynamo turns the error finish into its 500.
            yield {"token_ids": [], "index": 0, "finish_reason": "error: EngineDeadError (fault error_after_restart)"}
            return
        if app._scheduled_error():   # error_rate, or error_every's fixed schedule
            yield {"token_ids": [], "index": 0, "finish_reason": "error: simulated engine error (fault error_rate)"}
            return
        if self.role != "prefill" and app._grammar_kills_this_request():
            # As real dynamo.vllm: the engine logs the grammar's two lines and ends the request with an error.
            app._log_grammar_kill(str(request.get("id") or uuid.uuid4().hex))
            yield {"token_ids": [], "index": 0, "finish_reason": "error: grammar rejected tokens, request terminated"}
            return
        seq = Sequence(req_id=str(request.get("id") or uuid.uuid4().hex), prompt_tokens=len(prompt_ids),
                       output_tokens=len(reply.ids), max_tokens=max_tokens, finish_reason=reply.finish,
                       params_max_tokens=stop.get("max_tokens"),
                       block_hashes=block_hashes(prompt_ids, self.target.engine.block_size))
        if self.kv_events is not None:
            self.kv_events.track(seq, prompt_ids)
        app.engine.add(seq)
        pos = 0
        # midstream_error: the engine fails half-way; Dynamo turns the worker's error finish into its in-band error.
        fail_at = len(reply.ids) // 2 if app.faults.has("midstream_error") else -1
        try:
            while pos < len(reply.ids):
                if 0 < fail_at <= pos:
                    app.engine.abort(seq)
                    yield {"token_ids": [], "index": 0, "finish_reason": "error: simulated engine failure "
                                                                         "(fault midstream_error)"}
                    return
                n = await seq.queue.get()
                if n == 0:
                    yield {"token_ids": [], "index": 0, "finish_reason": "error: EngineDeadError"}
                    return
                if context is not None and context.is_stopped():
                    app.engine.abort(seq)
                    yield {"token_ids": [], "index": 0, "finish_reason": "cancelled"}
                    return
                if self.draining and app.faults.has("truncate_on_stop"):
                    # On SIGTERM the engine drops its open streams: no finish, no error (silent truncation).
                    app.engine.abort(seq)
                    return
                chunk = reply.ids[pos:pos + n]
                pos += len(chunk)
                item: dict[str, Any] = {"token_ids": chunk, "index": 0}
                if pos >= len(reply.ids):
                    item["finish_reason"] = reply.finish
                    # As Dynamo's vLLM worker reports it (dynamo/vllm/handlers.py: prompt_tokens_details from
                    # vLLM's num_cached_tokens, the engine's prefix-cache hit).
                    item["completion_usage"] = {
                        "prompt_tokens": len(prompt_ids), "completion_tokens": wire.reported_completion(pos, app.opts),
                        "total_tokens": len(prompt_ids) + wire.reported_completion(pos, app.opts),
                        "prompt_tokens_details": prompt_tokens_details(request, {"cached_tokens": seq.cached_tokens})}
                    if self.role == "prefill":
                        item["disaggregated_params"] = {"sim_prefill": True}
                yield item
        except (asyncio.CancelledError, GeneratorExit):
            app.engine.abort(seq)
            raise


#: The tool-call form a worker with its own ``tool_parser_off`` writes (``only_worker``): Mistral Large 4's
#: ``[TOOL_CALLS]name[ARGS]{...}``, which 1.6.1's ``mistral`` parser drops (content null, no tool_calls).
UNPARSED_FORM = "v11"
#: Dynamo's parsers run in the frontend, configured by what the worker registers (``--dyn-tool-call-parser
#: mistral``/``--dyn-reasoning-parser mistral`` in the seed's manifests); a parser fault leaves it unregistered.
PARSERS = {"tool_call_parser": "tool_parser_off", "reasoning_parser": "reasoning_parser_off"}
SEED_PARSER = "mistral"
#: Faults that start the workers with another parser than the target declares: (runtime-config field, parser).
WRONG_PARSERS = {"tool_parser_hermes": ("tool_call_parser", "hermes")}


def runtime_config(target: Target, faults: ActiveFaults) -> Any:
    from dynamo.llm import ModelRuntimeConfig

    e = target.engine
    rc = ModelRuntimeConfig()
    rc.context_length = served_context(e.max_model_len, faults)
    rc.max_num_seqs = e.max_num_seqs
    rc.max_num_batched_tokens = e.max_num_batched_tokens
    for field_name, fault in PARSERS.items():
        # Under only_worker every worker registers the same parsers: the frontend reads one card per model;
        # under under_load=N they are registered and the busy engine loses the markers.
        if not faults.acts_at_load(fault, 0) or faults.has("only_worker"):
            setattr(rc, field_name, getattr(e, field_name) or SEED_PARSER)
    for fault, (field_name, parser) in WRONG_PARSERS.items():
        if faults.has(fault):
            setattr(rc, field_name, parser)
    # Without a token budget the frontend does not refuse an over-long prompt (real-dynamo.md "context length";
    # transcripts python-worker/44 vs 45): the token_budget_missing fault is that worker.
    if faults.has("token_budget_missing"):
        return rc
    rc.set_engine_specific("token_budget", json.dumps({"combined_limit": e.max_model_len,
                                                      "reject_prompt_overflow": True,
                                                      "reject_total_overflow": True}))
    return rc


def served_context(declared: int, faults: ActiveFaults) -> int:
    """The context the worker registers (what the frontend's /v1/models shows): the ``served_max_model_len``
    fault is a worker started with another --max-model-len than the target declares."""
    return int(faults.value("served_max_model_len")) if faults.has("served_max_model_len") else declared
