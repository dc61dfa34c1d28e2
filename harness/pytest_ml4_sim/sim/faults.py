"""Named deployment defects the simulator can be started with (``--fault NAME[=VALUE]``).

Each fault imitates a real misconfiguration or bug of a vLLM deployment and names the check that should catch
it.  Adding a fault is one entry in ``_DEFINITIONS`` plus a ``faults.has("name")`` / ``faults.value("name")``
test where the simulator's behaviour changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class FaultError(ValueError):
    """An unknown fault name or a bad value; the message lists the known faults."""


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    caught_by: str
    #: ``None``: a switch (no value allowed); otherwise the value used when ``NAME`` is given without ``=VALUE``.
    default: float | None = None
    takes_value: bool = False


@dataclass(frozen=True)
class FaultSpec:
    name: str
    value: float | None = None

    def __str__(self) -> str:
        return self.name if self.value is None else f"{self.name}={self.value:g}"


_DEFINITIONS: tuple[Fault, ...] = (
    Fault("reasoning_parser_off", "reasoning parser disabled: [THINK]...[/THINK] markers leak into content",
          "suites/test_reasoning.py (no control tokens in content, reasoning separated)"),
    Fault("tool_parser_off", "tool parser disabled: '[TOOL_CALLS]name[ARGS]{...}' is returned as text content",
          "suites/test_tools.py (tool_calls present, no control tokens in content)"),
    Fault("tool_parser_hermes", "the workers run another tool-call parser than the target declares: "
          "--dyn-tool-call-parser hermes on Dynamo (the real frontend's hermes parser then leaves Mistral Large 4's "
          "[TOOL_CALLS] output in content), --tool-call-parser hermes on vLLM (no Mistral parser: calls stay text)",
          "suites/test_tools.py (a tool call comes back; the failure names the parser, not a release's cause)"),
    Fault("invalid_tool_json", "tool-call arguments are not valid JSON",
          "suites/test_tools.py (arguments parse as JSON and validate against the schema)"),
    Fault("bad_tool_ids", "tool-call ids are not Mistral's 9-char alphanumeric ids (chatcmpl-tool-<hex>)",
          "suites/test_tools.py (tool-call id format)"),
    Fault("reasoning_usage_missing", "usage.completion_tokens_details.reasoning_tokens is 0 despite reasoning",
          "suites/test_reasoning.py (reasoning token count agrees)"),
    Fault("no_done", "stream ends without 'data: [DONE]'", "suites/test_smoke.py (stream grammar)"),
    Fault("no_usage_chunk", "stream omits the usage chunk although include_usage was requested",
          "suites/test_smoke.py (stream grammar: usage chunk)"),
    Fault("midstream_error", "in-band 'data: {\"error\": ...}' event in the middle of a stream, then [DONE]",
          "suites/test_smoke.py (stream grammar: error events)"),
    Fault("slow_decode", "inter-token latency multiplied by K (default 3)", "suites/test_perf.py (ITL/decode gates)",
          default=3.0, takes_value=True),
    Fault("ttft_spike", "S seconds added to every time to first token (default 5)",
          "suites/test_perf.py (TTFT gates)", default=5.0, takes_value=True),
    Fault("tail_slow", "a share P of requests (every round(1/P)-th one an engine admits; default 0.1) decodes 10x "
          "slower: the latency tail grows, the median does not", "suites/test_perf.py (goodput under SLOs; the "
          "P50 gates pass)", default=0.1, takes_value=True),
    Fault("prefix_cache_off", "the engine never serves a prompt block from its prefix cache (as with "
          "--no-enable-prefix-caching, or a hybrid KV manager splitting the draft layers into their own group)",
          "suites/test_perf.py (sessions reuse the shared prefix)"),
    Fault("error_rate", "fraction P of requests answered 500 with vLLM's engine error body (default 0.2)",
          "suites/test_perf.py (request error rate gate), suites/test_smoke.py (parallel burst)",
          default=0.2, takes_value=True),
    # --- kill matrix: deterministic or log-level faults, so each suite check has a killer that
    # fails it on every run (no probabilistic miss) and the matrix test can name the defect.
    Fault("error_every", "every K-th chat request (1st, K+1th, ...) answered 500 with vLLM's engine error body "
          "(default 2): a deterministic error schedule", "suites/test_smoke.py (parallel burst), suites/test_perf.py "
          "(zero errors)", default=2.0, takes_value=True),
    Fault("grammar_kill", "the K-th chat request (default 1) is terminated by the grammar as real vLLM and "
          "dynamo.vllm do: the engine logs the recorded 'Failed to advance FSM' and 'Unexpected: grammar rejected "
          "tokens [9] for request ... Terminating request.' lines and the client gets HTTP 500",
          "suites/test_osl.py (no request killed by the grammar)", default=1.0, takes_value=True),
    Fault("seq_cap", "the engine runs at most N sequences (default 4) whatever max_num_seqs the target states: "
          "a deployment whose real cap differs from its declared one", "suites/test_perf.py (saturation)",
          default=4.0, takes_value=True),
    Fault("health_503", "/health answers 503 (EngineDeadError) after the first probe, while chats are still "
          "served: a dead engine behind a proxy whose own liveness still answers 200",
          "suites/test_smoke.py (health)"),
    # dynamo_evidence_stripped: at the fault gateway only (Dynamo targets; the vLLM stack has no nvext).
    # model_unlisted, accepts_invalid: in sim/server.py on the vLLM stack, at the fault gateway in front of the real
    # frontend on Dynamo targets (deploy/gateway.py): one name, one defect.
    # any_model, tool_choice_none_ignored: at the fault gateway only. vLLM refuses an unknown name 404 and obeys
    # tool_choice 'none' itself; on the vLLM stack these defects live in the proxy's config (a catch-all route,
    # tool_choice among additional_drop_params) and are proven with the real LiteLLM proxy, as is an over-long
    # prompt served (truncate_prompt_tokens added to every request: the simulator truncates as vLLM does).
    Fault("dynamo_evidence_stripped", "Dynamo targets: the answers carry no nvext (worker ids, timing) and the "
          "x-dynamo-* request headers (session id, worker pins) are dropped: DYN_DISABLE_FRONTEND_NVEXT=1 or an "
          "ingress that passes only standard headers and fields (at the fault gateway)",
          "suites/test_restart.py (affinity, prefix reuse, handoff, restart identity say not judged)"),
    Fault("model_unlisted", "/v1/models lists no model (the served name is missing)",
          "suites/test_smoke.py (model list)"),
    Fault("any_model", "Dynamo targets: requests naming an unknown model are served instead of refused with 404 (a "
          "catch-all route at the fault gateway)",
          "suites/test_smoke.py (unknown model is refused)"),
    Fault("accepts_invalid", "requests vLLM refuses with 400 (bad tool_choice, empty tools, unknown effort, "
          "chat_template_kwargs) are served instead", "suites/test_tools.py, suites/test_reasoning.py (invalid "
          "requests are rejected)"),
    Fault("no_auth", "the engine accepts any API key (started without --api-key)",
          "suites/test_smoke.py (wrong API key is refused)"),
    Fault("min_tokens_ignored", "min_tokens is ignored: answers end at their natural EOS",
          "suites/test_osl.py, suites/test_perf.py (fixed output length)"),
    Fault("tool_choice_none_ignored", "Dynamo targets: tool_choice 'none' is dropped before the frontend, which "
          "then treats the request as 'auto': the model calls tools anyway (at the fault gateway)",
          "suites/test_tools.py (tool_choice is obeyed)"),
    Fault("served_max_model_len", "the engine serves a context of N tokens (default 131072) whatever max_model_len "
          "the target states: its --max-model-len drifted from the declared one", "suites/test_smoke.py "
          "(max_model_len on /v1/models)", default=131072.0, takes_value=True),
    Fault("reasoning_effort_ignored", "reasoning_effort never reaches the tokenizer (as vLLM does for Mistral "
          "tokenizers before v15, vllm.md 3.1): the model thinks at its default length", "suites/test_reasoning.py "
          "(each reasoning effort: none)"),
    Fault("metrics_unreadable", "/metrics answers 500", "suites/test_kv_cache.py (KV pool cross-check, peak usage)"),
    Fault("truncate_on_stop", "on SIGTERM, open streams are closed at once with neither finish_reason, [DONE] nor "
          "an error event (silent truncation); a Dynamo worker stops yielding without a finish", "suites/test_restart.py (in-flight streams end detectably)"),
)

FAULTS: dict[str, Fault] = {f.name: f for f in _DEFINITIONS}

# Accuracy gate: answer-level, applied in the responder so every serving stack shows it.
FAULTS["accuracy_drop"] = Fault(
    "accuracy_drop", "a deterministic fraction P of answers is wrong (a call's argument value altered, or a "
    "spurious call where none belongs; default 0.2)", "suites/test_accuracy.py (BFCL accuracy vs baseline)",
    default=0.2, takes_value=True)


def register(fault: Fault) -> None:
    """Add a fault from another module (later issues); names must be unique."""
    if fault.name in FAULTS:
        raise FaultError(f"fault '{fault.name}' is already registered")
    FAULTS[fault.name] = fault


def parse_fault(spec: str | FaultSpec) -> FaultSpec:
    """``"slow_decode=2"`` -> ``FaultSpec("slow_decode", 2.0)``; unknown names list the known ones."""
    if isinstance(spec, FaultSpec):
        spec = str(spec)
    name, sep, raw = spec.strip().partition("=")
    name = name.strip()
    fault = FAULTS.get(name)
    if fault is None:
        raise FaultError(f"unknown fault '{name}'; known faults: {', '.join(sorted(FAULTS))}")
    if not sep:
        return FaultSpec(name, fault.default if fault.takes_value else None)
    if not fault.takes_value:
        raise FaultError(f"fault '{name}' takes no value (got '{raw}')")
    try:
        value = float(raw)
    except ValueError:
        raise FaultError(f"fault '{name}' needs a number, got '{raw}'") from None
    return FaultSpec(name, value)


class ActiveFaults:
    """The faults one simulator runs with."""

    def __init__(self, specs: Iterable[str | FaultSpec] = ()) -> None:
        self.specs: tuple[FaultSpec, ...] = tuple(parse_fault(s) for s in specs)
        self._by_name = {s.name: s for s in self.specs}

    def has(self, name: str) -> bool:
        return name in self._by_name

    def value(self, name: str, default: float = 0.0) -> float:
        spec = self._by_name.get(name)
        return default if spec is None or spec.value is None else spec.value

    def acts_at_load(self, name: str, in_flight: int) -> bool:
        """Fault ``name`` acts on a request the engine admits while it holds ``in_flight`` other requests: always,
        unless ``under_load=N`` makes the answer-level faults (:data:`UNDER_LOAD_FAULTS`) act only from N on."""
        if not self.has(name):
            return False
        return name not in UNDER_LOAD_FAULTS or not self.has("under_load") or in_flight >= self.value("under_load")

    def from_restart(self, name: str, generation: int) -> bool:
        """Fault ``name=N`` holds for an engine the N-th restart of its process (or pod) booted, or a later one
        (``generation``: 0 for the first start); the faults that break only a restarted engine read it."""
        return self.has(name) and generation >= self.value(name)

    def for_worker(self, index: int) -> ActiveFaults:
        """The faults worker ``index`` of a Dynamo deployment runs with (its place among the workers of its role,
        in start order, from 0): under ``only_worker=K`` the faults of :data:`ONE_WORKER_FAULTS` act on worker K
        alone (of each role), every other fault on every worker."""
        if not self.has("only_worker") or index == int(self.value("only_worker")):
            return self
        return ActiveFaults(s for s in self.specs if s.name not in ONE_WORKER_FAULTS)

    def __bool__(self) -> bool:
        return bool(self.specs)

    def __repr__(self) -> str:
        return f"ActiveFaults({', '.join(map(str, self.specs))})"


def describe() -> str:
    """A table of all faults for ``--help`` and docs."""
    width = max(len(n) for n in FAULTS)
    return "\n".join(f"{f.name.ljust(width)}  {f.description}  [caught by: {f.caught_by}]" for f in FAULTS.values())


# Restart timeline: the old engine keeps serving S seconds after the restart is triggered,
# as under systemd's stop delay or a rolling pod replacement. Applied by SimServer.restart (the controller
# side), not by the engine; recovery measured from the trigger's first success would count the old engine.
register(Fault("delayed_stop", "a restart waits S seconds before stopping the engine, which serves meanwhile "
               "(default 0.3, systemd's stop delay; on Dynamo each worker pod's preStop delay in the rolling restart)",
               "suites/test_restart.py (recovery counts the new engine only; over gates.recovery_time_s_max it fails)",
               default=0.3, takes_value=True))


# Restart: a defect only the engine booted by a restart has, as when the restart picks up a broken
# image or config while the running engine was healthy. The standby start (``--hold-file``) is that engine.
register(Fault("error_after_restart", "the engine booted by the N-th restart (default 1) and later ones answer "
               "every chat request 500 (EngineDeadError body) while /health answers 200; earlier engines are healthy",
               "suites/test_restart.py (smoke chat after the restart)", default=1.0, takes_value=True))

# Ingress: single sign-on in front of the cluster answers the health probe itself (the fault gateway, Dynamo).
register(Fault("health_login_page", "the ingress answers GET /health with its sign-in page (HTTP 200, text/html) "
               "instead of the frontend's health", "suites/test_smoke.py (test_health)"))

# Spec decode: synthetic acceptance in the engine's own launch; the target the suite reads declares none.
register(Fault("synthetic_acceptance", "the engine runs DSpark's synthetic acceptance (benchmarking only, seed 002) "
               "although the target declares real acceptance: its logged speculative config says so",
               "suites/test_accuracy.py (the accuracy gate refuses to certify)"))

# Spec decode: the draft model drifted from the target model (a stale MTP head, another checkpoint).
register(Fault("spec_accept_scale", "every draft position's acceptance rate times F (default 0.5: position 0 "
               "0.93 -> 0.47, under seed 000's 0.61 floor)", "suites/test_kv_cache.py (spec-decode acceptance)",
               default=0.5, takes_value=True))

# Reasoning share: the same prompts think for a different part of a fixed-length answer.
register(Fault("reasoning_share_shift", "the reasoning share of fixed-length answers moves by D (default 0.2: "
               "58 % -> 78 %)", "suites/test_reasoning.py (reasoning share vs its stored baseline)",
               default=0.2, takes_value=True))

# Long reasoning: not a defect but a healthy model that thinks at length before it answers (as with
# reasoning_effort and a hard question), longer than a gate's output cap would allow; 0: a model that never reasons.
register(Fault("reasoning_len", "the model reasons N tokens (default 1024) more than its effort's own reasoning "
               "before it answers (a higher effort still thinks longer); 0: it does not reason",
               "suites/test_reasoning.py (a cut reasoning is reported truncated, never judged as a share; no "
               "reasoning fails naming that)", default=1024.0, takes_value=True))

# Dynamo deployment shape: applied by the DynamoDeployment when it spawns the workers, so the real
# frontend sees fewer instances than the target declares (a worker pod that never registered).
register(Fault("workers_down", "N of the target's aggregated Dynamo workers never start (default 1)",
               "suites/test_smoke.py (health: every worker registered)", default=1.0, takes_value=True))
# The same for one role of a disaggregated deployment: a prefill or decode pod that never
# registered. At least one worker of the role starts, so the model is still served and /health's count of that
# role is what fails (a role with none would hide the model from /v1/models: every check would fail).
register(Fault("prefill_workers_down", "N of the target's Dynamo prefill workers never start (default 1; at least "
               "one starts)", "suites/test_smoke.py (health: the prefill workers registered)", default=1.0,
               takes_value=True))
register(Fault("decode_workers_down", "N of the target's Dynamo decode workers never start (default 1; at least "
               "one starts)", "suites/test_smoke.py (health: the decode workers registered)", default=1.0,
               takes_value=True))

# Guided decoding: tool_choice required/named reach the engine as a structured-output grammar
# (Dynamo 1.6.1: sampling_options.guided_decoding.json; vLLM: its structured-outputs backend). An engine that does
# not enforce it writes what the model would write under auto: text where no tool matches, its own tool-call form.
register(Fault("guided_decoding_ignored", "the engine ignores the guided-decoding grammar of tool_choice "
               "required/named (structured outputs off): the model answers as under tool_choice auto",
               "suites/test_tools.py (tool_choice required/named obeyed)"))

# Dynamo KV routing: the workers publish no KV events (a worker started without its event
# publisher / --kv-events-config): the router knows no cached prefix, so it routes nothing by prefix and reports
# kv_hit_rate 0 while the engine itself still reuses its prefix cache.
register(Fault("kv_events_off", "the Dynamo workers publish no KV events: the KV router sees no cached prefix",
               "suites/test_restart.py (prefix reuse by the router's figures)"))

# Dynamo context enforcement: the frontend refuses an over-long prompt only when the workers
# publish a token budget (real-dynamo.md "Context length"; transcripts python-worker/44 vs 45).
register(Fault("token_budget_missing", "the Dynamo workers register no token budget (reject_prompt_overflow): the "
               "frontend hands an over-long prompt to a worker, which serves it", "suites/test_smoke.py (over-long "
               "prompt is refused)"))

# Dynamo pod replacement: a replaced prefill pod lands while the old pod's orphaned EngineCore still holds the GPUs,
# so vLLM refuses to start ("Free memory on device ... is less than desired GPU memory utilization", the recorded
# real refusal of fixtures/logs/rtxpro-startup-refused.log) and the kubelet restarts it again and again
# (CrashLoopBackOff). Counted in boots as error_after_restart is: N = 3 spares the restart suite's two rolling
# restarts and breaks the prefill pods test_model_leaves_and_returns_while_prefill_pods_gone deletes.
register(Fault("prefill_crashloop", "the prefill workers booted by their pod's N-th replacement (default 1) and "
               "later ones exit at boot with vLLM's free-memory refusal: the replaced prefill pods never register",
               "suites/test_restart.py (the model returns after the prefill pods are replaced)", default=1.0,
               takes_value=True))

# Dynamo pod replacement: the replaced worker starts but never registers with the frontend (a hung model load, a
# discovery backend it cannot reach): the pod stays not Ready and the model is served by the other workers only.
register(Fault("restart_never_registers", "the Dynamo workers booted by their pod's N-th replacement (default 1) "
               "and later ones start but never register with the frontend: the replaced pod never comes back",
               "suites/test_restart.py (the restart scenario fails past its bound naming the phase 'waiting for the "
               "new worker to register'; the checks depending on it are not judged)", default=1.0,
               takes_value=True))

# One worker of a Dynamo deployment answers wrong (a rolling update half done, a pod with stale arguments, a node
# with another image): the answer-level faults below act on worker K only (ActiveFaults.for_worker). The parsers run
# in the frontend, configured once per model from the card the first worker registers (1.6.1 logs one "Selected
# model parser route" per model), so a parser fault confined to one worker shows in that worker's output instead:
# its tool calls in Mistral Large 4's own form, which the deployment's parser drops; its requests' reasoning_effort
# unread, as a frontend without a reasoning parser passes none (the same answers as the whole-deployment faults'
# Dynamo form). ARCHITECTURE.md Decisions, "One worker's faults".
ONE_WORKER_FAULTS = ("reasoning_parser_off", "tool_parser_off", "invalid_tool_json", "min_tokens_ignored")
register(Fault("only_worker", "Dynamo targets: the answer-level faults given with it (" + ", ".join(ONE_WORKER_FAULTS)
               + ") act on worker K only (default 1): K counts the workers of a role from 0 in the deployment's "
               "start order (harness/pytest_ml4_sim/deploy/dynamo.py; on disagg worker K of each role, the decode one writes the "
               "answer); tool_parser_off there writes the worker's calls in the form the frontend's parser drops, "
               "reasoning_parser_off leaves its requests' reasoning_effort unread",
               "suites/test_replicas.py (every worker answers right, naming the worker)", default=1.0,
               takes_value=True))


# Load-only defects: a batching bug or scheduler regression breaks answers only while the engine is busy. The
# modifier makes the answer-level faults below act on the requests an engine admits while it holds at least N
# others (ActiveFaults.acts_at_load), so a quiet engine (one request at a time: the functional suites) is healthy.
UNDER_LOAD_FAULTS = frozenset({"reasoning_parser_off", "tool_parser_off", "invalid_tool_json", "min_tokens_ignored"})
register(Fault("under_load", "modifier: the faults " + ", ".join(sorted(UNDER_LOAD_FAULTS)) + " act only on "
               "requests admitted while the engine holds at least N others (default 8): healthy on a quiet engine",
               "suites/test_perf.py (answers stay correct under load: the probes beside each load phase)",
               default=8.0, takes_value=True))


# --- A fault per property (issue 35): each breaks exactly what one check asserts, so the check is killed by its own
# property and not only by missing evidence.
# KV usage: vllm-project/vllm#27073 (v0.10.2): after a few over-long requests failed, "GPU KV cache usage" rose
# to near 100 % and stayed there for hours until a restart: their blocks were never freed.
register(Fault("kv_leak", "a share P of the KV pool (default 0.95) is held by leaked blocks since boot (never freed, "
               "as vllm#27073): stats lines and vllm:kv_cache_usage_perc show usage at or above P under any load",
               "suites/test_kv_cache.py (peak KV usage under gates.kv_usage_pct_max)", default=0.95,
               takes_value=True))
register(Fault("wrong_answer", "every arithmetic answer is off by one (the damage broken numerics do: a wrong "
               "quantisation scale, a mismatched checkpoint)", "suites/test_smoke.py (the known question's answer)"))
register(Fault("usage_overcount", "usage.completion_tokens is F times (default 2) the tokens the answer carries: the "
               "engine counts tokens it never returned (vLLM stack: the Dynamo frontend counts the worker's token ids itself)",
               "suites/test_smoke.py (usage agrees with the streamed text)",
               default=2.0, takes_value=True))
register(Fault("parallel_calls_collapsed", "the model writes only the first of the calls a prompt asks for in "
               "parallel", "suites/test_tools.py (parallel calls: one per thing asked)"))
register(Fault("parallel_tool_calls_ignored", "parallel_tool_calls=false is ignored: every call comes back (vLLM "
               "without maybe_filter_parallel_tool_calls; on Dynamo targets the fault gateway drops the field)",
               "suites/test_tools.py (parallel_tool_calls=false keeps one call)"))
register(Fault("tool_result_ignored", "the tool messages' content never reaches the model: after a round trip it "
               "answers without the results", "suites/test_tools.py (the final answer uses the tool result)"))
