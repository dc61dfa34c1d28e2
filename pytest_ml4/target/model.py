"""Deployment targets: the YAML files under ``targets/`` and their validated model.

A target describes one Mistral Large 4 deployment from the seeds: its hardware, topology, serving stack,
engine flags, where its endpoint, key, logs and restart control come from, and the gate thresholds the suites
judge it by. Secrets are never stored here, only the *names* of environment variables that hold them.

Works without pytest::

    from pytest_ml4.target.model import load_target, known_targets
    t = load_target("gb300-disagg")          # a name from targets/ ...
    t = load_target("my/variant.yaml")       # ... or a path to a YAML file

A bad file raises :class:`TargetError` whose message names the file and the offending field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from pytest_ml4.datafile import near_field, parse_yaml_value, read_yaml, yaml_error_line
from pytest_ml4.locations import BUNDLED_TARGETS_DIR, resolve_from, target_root

#: Any lowercase GPU family name (rtxpro, gb300, vr200, h100, h200, b200, gb200, mi300x, ...): what is known per
#: family (preflight rules, memory model, simulator) is the table pytest_ml4/data/hardware/families.yaml; a family
#: it does not list is still a valid target, its family-keyed checks then say "no calibration for <family>".
FAMILY_PATTERN = r"^[a-z][a-z0-9]*([-_][a-z0-9]+)*$"
TopologyKind = Literal["single_node", "agg", "disagg"]
WorkerRole = Literal["worker", "prefill", "decode"]


class TargetError(ValueError):
    """A target could not be found or is invalid; the message names the file and field (or, when an override
    caused it, the option and value: ``from_override``)."""

    def __init__(self, message: str, from_override: bool = False) -> None:
        super().__init__(message)
        self.from_override = from_override


class _Strict(BaseModel):
    # Unknown keys are typos until proven otherwise: a misspelt gate would silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hardware(_Strict):
    gpu: str = Field(description="the GPU model as the vendor names it (reports, session header)")
    family: str = Field(pattern=FAMILY_PATTERN, description=(
        "lowercase GPU family (rtxpro, gb300, vr200, h200, gb200, mi300x, ...): selects hardware markers, "
        "preflight rules, the memory model and the simulator where pytest_ml4/data/hardware/families.yaml "
        "knows the family"))
    count: int = Field(gt=0, description="GPUs of the whole deployment")
    memory_per_gpu_gib: float = Field(gt=0, description=(
        "usable memory per GPU, GiB (the memory model and preflight size the KV pool from it)"))
    memory_bandwidth_tb_s: float | None = Field(default=None, gt=0, description=(
        "HBM/GDDR bandwidth per GPU, TB/s (the perf suite's roofline estimate; none without it)"))
    interconnect: str | None = Field(default=None, description="how the GPUs are linked (documentation only)")
    compute_capability: str | None = Field(default=None, description=(
        "CUDA compute capability (the simulator's boot lines; needed under --sim when symmetric_memory is "
        "false)"))
    nodes: int = Field(default=1, gt=0, description="nodes the deployment spans")
    symmetric_memory: bool = Field(default=True, description=(
        "vLLM's SymmMemCommunicator is available (false: the simulator logs its warning)"))
    source: str = Field(default="", description="where the hardware figures come from (free text)")


class Topology(_Strict):
    kind: TopologyKind = Field(description=(
        "single_node (one engine, TP), agg (aggregated Dynamo workers) or disagg (prefill and decode workers)"))
    tensor_parallel: int = Field(gt=0, description="GPUs per engine (tensor parallel size)")
    workers: int = Field(default=1, gt=0, description="aggregated workers (replicas); 1 for single-node")
    prefill_workers: int = Field(default=0, ge=0, description="prefill workers (disagg only)")
    decode_workers: int = Field(default=0, ge=0, description="decode workers (disagg only)")
    expert_parallel_decode: bool = Field(default=False, description="the decode role runs expert parallel")

    #: The field counting the replicas that hold a running stream: the decode role when disaggregated.
    STREAM_ROLE: ClassVar[dict[str, tuple[str, str]]] = {"disagg": ("decode", "decode_workers")}

    def stream_role(self) -> tuple[str, int]:
        """The role whose worker holds a running stream, and how many replicas it has."""
        role, fld = self.STREAM_ROLE.get(self.kind, ("aggregated", "workers"))
        return role, getattr(self, fld)

    @model_validator(mode="after")
    def _roles(self) -> Topology:
        if self.kind == "disagg" and (self.prefill_workers < 1 or self.decode_workers < 1):
            raise ValueError("disagg topology needs prefill_workers >= 1 and decode_workers >= 1")
        if self.kind != "disagg" and (self.prefill_workers or self.decode_workers):
            raise ValueError(f"{self.kind} topology must not set prefill_workers/decode_workers")
        return self


class Speculative(_Strict):
    method: str = Field(description="speculative decoding method (e.g. dspark)")
    num_speculative_tokens: int = Field(gt=0, description="draft tokens per step")
    synthetic_acceptance: bool = Field(default=False, description=(
        "synthetic acceptance switched on (a pure performance run; preflight refuses it elsewhere)"))


class Engine(_Strict):
    """The vLLM engine flags the seed deployment runs with (per worker role where they differ)."""

    version: str = Field(default="0.33.0", description=(
        "vLLM release the engine runs (selects its behaviour rows, pytest_ml4/data/vllm/)"))
    model_path: str = Field(description="model path the engine loads")
    max_model_len: int = Field(gt=0, description="--max-model-len")
    max_num_seqs: int = Field(gt=0, description="--max-num-seqs")
    max_num_batched_tokens: int = Field(gt=0, description="--max-num-batched-tokens")
    gpu_memory_utilization: float = Field(gt=0, le=1, description="--gpu-memory-utilization")
    kv_cache_dtype: str = Field(description="--kv-cache-dtype")
    block_size: int = Field(default=16, gt=0, description="KV cache block size, tokens")
    dtype: str = Field(default="bfloat16", description="--dtype")
    speculative: Speculative | None = Field(default=None, description=(
        "--speculative-config (absent: no speculative decoding)"))
    reasoning_parser: str | None = Field(default="mistral", description="--reasoning-parser (null: none)")
    tool_call_parser: str | None = Field(default="mistral", description="--tool-call-parser (null: none)")
    enable_auto_tool_choice: bool = Field(default=True, description="--enable-auto-tool-choice")
    disable_hybrid_kv_cache_manager: bool = Field(default=False, description="--disable-hybrid-kv-cache-manager")
    kv_offloading_size_gib: float | None = Field(default=None, description="native CPU KV offload per replica, GiB")
    kv_connector: str | None = Field(default=None, description="--kv-transfer-config connector (disaggregated roles)")
    tokenizer_version: int = Field(default=15, ge=3, description="Mistral tokenizer version (tool-call wire format)")
    extra_args: list[str] = Field(default_factory=list, description="further engine arguments, as given")


class Proxy(_Strict):
    kind: Literal["litellm"] = Field(description="the proxy in front of the engine")
    config: str = Field(description=(
        "path of the proxy config (relative to the target's repository root, else the package's data)"))
    model_alias: str = Field(description="the model name clients use at the proxy")
    num_retries: int = Field(default=0, description="the proxy's num_retries")
    max_retries: int = Field(default=0, description="the proxy's max_retries (per deployment)")


#: The target field naming the Dynamo release (a stack's ``release_field`` in pytest_ml4/data/stacks/stacks.yaml).
DYNAMO_VERSION_FIELD = "serving.dynamo_version"


def _adapter(stack: str) -> Any:
    """The stack's adapter: what the model checks of a stack is what its row says (the Literal above has
    already refused an unknown name)."""
    from pytest_ml4.stacks import stack_named  # the stacks read targets

    return stack_named(stack)


def _stack_names() -> list[str]:
    from pytest_ml4.stacks import REGISTRY

    return list(REGISTRY)


class Serving(_Strict):
    stack: Literal["vllm", "vllm+litellm", "dynamo+vllm"] = Field(description=(
        "what serves the endpoint: vllm, vllm+litellm (proxy) or dynamo+vllm"))
    served_model_name: str = Field(description="the model name clients send")
    engine_served_model_name: str | None = Field(default=None, description=(
        "the engine's --served-model-name when it differs (behind a proxy)"))
    proxy: Proxy | None = Field(default=None, description="the proxy section (stack vllm+litellm)")
    #: Set only on the view ``Target.without_proxy()`` gives (--ml4-no-proxy): the proxy the run goes around.
    bypassed_proxy: Proxy | None = Field(default=None, description=(
        "set by --ml4-no-proxy, never in a file: the proxy the run goes around"))
    dynamo_router: Literal["kv", "round_robin", "random"] | None = Field(default=None, description="Dynamo router mode")
    session_affinity: bool = Field(default=False, description="the router pins a session to a worker")
    #: The KV router's conditional disaggregation (Dynamo's ``--router-conditional-disagg``, experimental in
    #: 1.6.1): the router may skip the remote prefill and prefill on the decode worker. None of the seeds sets it.
    conditional_disagg: bool = Field(default=False, description=(
        "Dynamo KV router's conditional disaggregation (dynamo_router kv only)"))
    migration_limit: int | None = Field(default=None, description="Dynamo request migration limit")
    #: The Dynamo release the deployment runs (its image tag); a row of pytest_ml4/data/dynamo/versions.yaml.
    dynamo_version: str | None = Field(default=None, description=(
        "Dynamo release (image tag) the deployment runs: a row of dynamo/versions.yaml (package or team); an "
        "unknown release is assumed to behave as the nearest lower known row, reported as an estimate"))

    @model_validator(mode="after")
    def _proxy(self) -> Serving:
        if _adapter(self.stack).proxy is not None and self.proxy is None:
            raise ValueError(f"stack {self.stack} needs a proxy section")
        return self

    @model_validator(mode="after")
    def _conditional_disagg(self) -> Serving:
        if self.conditional_disagg and self.dynamo_router != "kv":
            raise ValueError(f"conditional_disagg is a setting of Dynamo's KV router (dynamo_router: kv), not of "
                             f"dynamo_router {self.dynamo_router}")
        return self

    @model_validator(mode="after")
    def _dynamo_version(self) -> Serving:
        if _adapter(self.stack).release_field != DYNAMO_VERSION_FIELD:
            if self.dynamo_version is not None:
                readers = [name for name in _stack_names() if _adapter(name).release_field == DYNAMO_VERSION_FIELD]
                raise ValueError(f"dynamo_version is only for stack {', '.join(readers)}, not {self.stack}")
            return self
        # A release in no versions table is not refused: pytest_ml4.stacks.dynamo_versions.row_for assumes an estimate.
        if not self.dynamo_version:
            raise ValueError(f"stack {self.stack} needs dynamo_version (the image tag, e.g. "
                             "1.7.0-mistral-large-4-dev.1)")
        return self


class EndpointSource(_Strict):
    url_env: str = Field(description="variable holding the OpenAI-compatible base URL (…/v1)")
    api_key_env: str | None = Field(default=None, description="variable holding the API key (never the key itself)")
    requires_api_key: bool = Field(default=True, description="the endpoint refuses requests without a key")
    metrics_url_env: str | None = Field(default=None, description=(
        "variable holding the engine's /metrics URL (default: the endpoint's)"))
    default_url: str | None = Field(default=None, description="URL used when url_env is unset")
    #: Dynamo: the environment variable holding the workers' /metrics URLs per role (comma-separated), where the
    #: ``vllm:*`` families live (the frontend's /metrics has only ``dynamo_*``; reference/real-dynamo.md).
    worker_metrics_url_env: dict[WorkerRole, str] = Field(default_factory=dict, description=(
        "Dynamo: worker role (worker, prefill, decode) -> variable holding that role's comma-separated worker"
        " /metrics URLs, where the vllm:* families live"))


#: Where a Kubernetes deployment lives is given once, under ``control``; logs of kind kubernetes read it there.
KUBERNETES_PLACE = ("dgd", "namespace_env", "namespace")


class Logs(_Strict):
    kind: Literal["journald", "file", "kubernetes"] = Field(description=(
        "journald (unit), file (path) or kubernetes (the pods of control.dgd)"))
    unit: str | None = Field(default=None, description=(
        "systemd unit whose journal holds the engine log (kind journald)"))
    path: str | None = Field(default=None, description="engine log file (kind file)")
    ssh_host_env: str | None = Field(default=None, description=(
        "variable naming the host to read the journal over ssh (kind journald; unset: local)"))

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        moved = [k for k in KUBERNETES_PLACE if isinstance(data, dict) and k in data]
        if moved:
            raise ValueError(f"{', '.join(moved)} moved to the control section: the DGD and its namespace are given "
                             f"once, under control, for log reading and restarts alike (remove them from logs)")
        return data

    @model_validator(mode="after")
    def _need(self) -> Logs:
        need = {"journald": "unit", "file": "path"}.get(self.kind)
        if need and getattr(self, need) in (None, ""):
            raise ValueError(f"logs of kind {self.kind} need '{need}'")
        return self


class Control(_Strict):
    kind: Literal["systemd", "kubernetes"] = Field(description=(
        "how the engine is restarted: systemd (unit) or kubernetes (delete the DGD's pods)"))
    unit: str | None = Field(default=None, description="systemd unit restarted (kind systemd)")
    ssh_host_env: str | None = Field(default=None, description=(
        "variable naming the host to run systemctl on over ssh (kind systemd; unset: local)"))
    dgd: str | None = Field(default=None, description=(
        "DynamoGraphDeployment name (kind kubernetes): restarts and kubernetes logs address its pods"))
    namespace_env: str | None = Field(default=None, description="variable holding the DGD's namespace")
    namespace: str | None = Field(default=None, description="the DGD's namespace (instead of namespace_env)")
    restart_timeout_s: float = Field(default=900, gt=0, description=(
        "how long a restart may take to serve again, seconds"))
    worker_start_s: float = Field(default=600, gt=0, description=(
        "declared seconds from one worker pod's deletion (or the engine's stop) to its replacement registered and "
        "serving: the bound of each pod's leave and register phases in the restart suite (under --sim the embedded "
        "deployment's own figure)"))

    @model_validator(mode="after")
    def _need(self) -> Control:
        if self.kind == "kubernetes" and not self.dgd:
            raise ValueError("control of kind kubernetes needs 'dgd' (the DynamoGraphDeployment's name)")
        return self


class Gates(_Strict):
    """Thresholds the suites judge by; each one traces back to a seed line (see the target YAML comments)."""

    ttft_p50_s_max: float | None = Field(default=None, description="sweep gate: TTFT p50 at most this, seconds")
    decode_tok_s_user_p50_min: float | None = Field(default=None, description=(
        "sweep gate: decode tok/s/user p50 at least this"))
    ttft_p99_knee_s: float = Field(default=5.0, description="TTFT p99 defining the latency knee, seconds")
    #: The latency knee (first TTFT p99 over ttft_p99_knee_s) must not come before this concurrency.
    knee_not_before: int | None = Field(default=None, gt=0, description=(
        "the knee must not come before this concurrency"))
    request_error_rate_max: float = Field(default=0.0, description="largest share of failed requests in a perf point")
    kv_pool_tokens_min: int | None = Field(default=None, description=(
        "smallest KV pool the engine must log, tokens (default: max_model_len)"))
    kv_max_concurrency_min: float = Field(default=1.0, description="smallest KV max concurrency at max_model_len")
    kv_usage_pct_max: float = Field(default=90.0, description="largest KV cache usage under load, percent")
    spec_acceptance_length: tuple[float, float] | None = Field(default=None, description=(
        "[low, high] mean speculative acceptance length"))
    spec_position_rate: tuple[float, float] | None = Field(default=None, description=(
        "[low, high] per-position acceptance rate"))
    recovery_time_s_max: float = Field(default=600.0, description="longest restart-to-serving time, seconds")
    restart_client_errors_allowed: bool = Field(default=False, description="client errors across a restart are allowed")
    reasoning_share: tuple[float, float] | None = Field(default=None, description=(
        "[low, high] share of answers with reasoning (absent: judged against the stored baseline)"))
    perf_tolerance: float = Field(default=0.10, description=(
        "largest regression against the perf baseline (0.10 = 10 %)"))


WorkloadName = Literal["chat", "sessions"]


#: Validation context key: the file is one of the package's bundled targets (pytest_ml4/data/targets).
BUNDLED = "bundled"


def _cited(source: str, info: ValidationInfo) -> str:
    # The bundled targets trace every SLO back to a seed line or say it is an estimate: a bare number would pass for
    # a stated one. A team's own target cites its own SLO document, so its source is free text.
    if (info.context or {}).get(BUNDLED) and not source.startswith(("seed ", "estimate")):
        raise ValueError(f"source must cite a seed ('seed NNN: ...') or start with 'estimate' in a bundled target, "
                         f"got {source!r}")
    return source


class Slo(_Strict):
    """Latency objectives every request of a workload must meet to count as good (aiperf ``--goodput``).

    Named after the p99 they bound: with the goodput floor at 0.99 the share of good requests is the joint p99."""

    ttft_p99_s: float = Field(gt=0, description="time to first token, seconds")
    itl_p99_ms: float = Field(gt=0, description="a request's mean inter-token latency, milliseconds")
    e2e_p99_s: float = Field(gt=0, description="end-to-end request latency, seconds")
    source: str = Field(description=(
        "where the SLO comes from: a seed line or 'estimate' in bundled targets, free text (e.g. your SLO "
        "document) in a team's"))

    @model_validator(mode="after")
    def _source(self, info: ValidationInfo) -> Slo:
        _cited(self.source, info)
        return self

    def aiperf_goodput(self) -> str:
        """aiperf's ``--goodput`` value: metric tags with thresholds in their display unit (ms)."""
        return (f"time_to_first_token:{self.ttft_p99_s * 1000:g} inter_token_latency:{self.itl_p99_ms:g} "
                f"request_latency:{self.e2e_p99_s * 1000:g}")


class Workload(_Strict):
    """A request mix the goodput and capacity gates load the deployment with, at Poisson arrivals.

    ``chat``: single-turn synthetic prompts. ``sessions``: multi-turn conversations (``turns`` each, aiperf's
    ``--conversation-turn-mean``) sharing one system prompt of ``system_prompt_tokens`` (``--shared-system-prompt-
    length``); ``isl`` is then the new user text per turn, the history grows turn by turn."""

    isl: int = Field(gt=0, description="input tokens per request (per turn for sessions)")
    osl: int = Field(gt=0, description="output tokens per request")
    request_rate: float = Field(gt=0, description="production request rate, requests/s (Poisson arrivals)")
    capacity_rps: float | None = Field(default=None, gt=0, description="declared capacity, requests/s")
    turns: int = Field(default=1, ge=1, description="turns per conversation (sessions: >= 2)")
    system_prompt_tokens: int = Field(default=0, ge=0, description="shared system prompt, tokens (sessions: >= 1)")
    slo: Slo = Field(description="latency objectives every request must meet to count as good")
    source: str = Field(description=(
        "where the workload comes from: a seed line or 'estimate' in bundled targets, free text in a team's"))

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Workload:
        _cited(self.source, info)
        if self.capacity_rps is not None and self.capacity_rps < self.request_rate:
            raise ValueError(f"capacity_rps {self.capacity_rps:g} is below request_rate {self.request_rate:g}: "
                             f"the deployment would be planned to fail its production rate")
        return self


class Perf(_Strict):
    concurrencies: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64], description=(
        "sweep concurrencies"))
    isl: int = Field(default=512, description="sweep input tokens")
    osl: int = Field(default=4096, description="sweep output tokens")
    duration_s: float = Field(default=300, description="measured window per sweep point, seconds")
    baseline: str | None = Field(default=None, description="stored perf baseline (a team's baselines/ first)")
    trace: str | None = Field(default=None, description="mooncake trace replayed (Dynamo targets)")
    warmup_requests: int = Field(default=5, description="requests sent before measuring")
    #: The goodput and capacity gates' request mixes (``chat``, ``sessions``), each with its SLOs.
    workloads: dict[WorkloadName, Workload] = Field(default_factory=dict, description=(
        "goodput and capacity workloads: chat, sessions"))
    #: Smallest share of requests that must meet every SLO of their workload (DistServe's and aiperf's 0.95).
    goodput_floor: float = Field(default=0.95, gt=0, le=1, description=(
        "smallest share of requests that must meet every SLO of their workload"))

    @model_validator(mode="after")
    def _sessions(self) -> Perf:
        s = self.workloads.get("sessions")
        if s is not None and (s.turns < 2 or s.system_prompt_tokens < 1):
            raise ValueError("workloads.sessions needs turns >= 2 and system_prompt_tokens >= 1 (multi-turn "
                             "conversations sharing a system prompt)")
        return self


class SimProfile(_Strict):
    """Simple latency profile of the embedded simulator (the full performance model refines it)."""

    ttft_s: float = Field(default=0.5, gt=0, description="simulated TTFT at the reference ISL, seconds")
    itl_ms: float = Field(default=12.0, gt=0, description="simulated ITL with one running sequence, ms")
    prefill_tok_s: float = Field(default=20000, gt=0, description=(
        "simulated prefill rate, tokens/s; a perf-model profile of the target's name (the bundled targets') has "
        "its own, which wins: sim.extra.prefill_tok_s overrides both"))
    #: Seconds a simulated restart keeps the port closed: from the old engine process's exit to the new one
    #: binding. A modelled figure of the target (estimate unless its YAML cites a seed), so restart verdicts do
    #: not depend on how fast this machine starts a Python process (``SimServer.restart``).
    restart_outage_s: float = Field(default=1.5, ge=0, description="seconds a simulated restart keeps the port closed")
    extra: dict[str, Any] = Field(default_factory=dict, description=(
        "further simulator knobs (pytest_ml4_sim.sim.perfmodel, faults, reasoning_field, ...)"))


class Target(_Strict):
    name: str = Field(description="target name (the file's stem)")
    description: str = Field(description="one line describing the deployment")
    source: str = Field(description="what the target is written from (free text; the bundled ones cite seeds)")
    hardware: Hardware = Field(description="the GPUs")
    topology: Topology = Field(description="engines and workers")
    serving: Serving = Field(description="what serves the endpoint")
    engine: Engine = Field(description="vLLM flags of the engine (the decode role when disaggregated)")
    prefill_engine: Engine | None = Field(default=None, description="vLLM flags of the prefill role (disagg only)")
    endpoint: EndpointSource = Field(description="where the endpoint, key and metrics come from (variable names)")
    logs: Logs = Field(description="where the engine log is read")
    control: Control = Field(description="how the engine is restarted, and where a Kubernetes deployment lives")
    gates: Gates = Field(default_factory=Gates, description="thresholds the suites judge by")
    perf: Perf = Field(default_factory=Perf, description="perf sweep, trace and workloads")
    sim: SimProfile = Field(default_factory=SimProfile, description="the embedded simulator's latency profile")
    manifests: list[str] = Field(default_factory=list, description=(
        "deployment files preflight lints against the target (relative paths)"))
    path: str | None = Field(default=None, description="file the target was loaded from (set by the loader)")

    @model_validator(mode="after")
    def _consistent(self) -> Target:
        if self.topology.kind == "disagg" and self.prefill_engine is None:
            raise ValueError("disagg targets need a prefill_engine section (the decode role is 'engine')")
        if _adapter(self.serving.stack).routes_workers and self.logs.kind != "kubernetes":
            raise ValueError(f"{self.serving.stack} targets read their logs from kubernetes")
        if self.logs.kind == "kubernetes" and self.control.kind != "kubernetes":
            raise ValueError("logs of kind kubernetes read the pods of control.dgd: set control.kind kubernetes, "
                             "control.dgd and control.namespace_env (or control.namespace)")
        return self

    # Convenience views used by markers and reports.
    @property
    def family(self) -> str:
        return self.hardware.family

    @property
    def topology_kind(self) -> str:
        return self.topology.kind

    @property
    def is_dynamo(self) -> bool:
        """Dynamo's frontend routes this target's requests to registered workers: for the embedded deployment
        (``harness/``), which launches stacks; the core and the suites ask ``pytest_ml4.stacks.stack_for``."""
        from pytest_ml4.stacks import stack_for  # the stacks read targets

        return stack_for(self).routes_workers

    @property
    def has_proxy(self) -> bool:
        return self.serving.proxy is not None

    def without_proxy(self) -> Target:
        """The deployment as a client that goes around its proxy sees it: the engine's stack and served name.

        Gates stay as declared; a check that only the proxy makes true (no client error across a restart thanks to
        its retries) looks at ``serving.bypassed_proxy`` and says it does not apply.
        """
        if self.serving.proxy is None:
            return self
        from pytest_ml4.stacks import stack_for  # the stacks read targets

        serving = self.serving.model_copy(update={
            "stack": stack_for(self).engine, "proxy": None, "bypassed_proxy": self.serving.proxy,
            "served_model_name": self.serving.engine_served_model_name or self.serving.served_model_name,
            "engine_served_model_name": None})
        return self.model_copy(update={"serving": serving})

    @property
    def root(self) -> Path:
        """The folder the YAML's relative paths start from (``locations.target_root``)."""
        return target_root(Path(self.path)) if self.path else BUNDLED_TARGETS_DIR.parent

    def resolve(self, relpath: str) -> Path:
        """A path from the YAML: absolute, or under :attr:`root`, else under the package's data."""
        return resolve_from(self.root, relpath)


def known_targets(directory: Path | None = None) -> list[str]:
    d = directory or BUNDLED_TARGETS_DIR
    return sorted(p.stem for p in d.glob("*.yaml"))


def _leaves(over: dict[str, Any], trail: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out: list[tuple[tuple[str, ...], Any]] = []
    for key, value in over.items():
        path = (*trail, str(key))
        out += _leaves(value, path) if isinstance(value, dict) and value else [(path, value)]
    return out


def _override_of(loc: tuple[str, ...], overrides: dict[str, Any]) -> tuple[tuple[str, ...], Any] | None:
    """The override an error at ``loc`` comes from: one that set ``loc`` or a value under or above it."""
    for path, value in _leaves(overrides):
        n = min(len(path), len(loc))
        if path[:n] == loc[:n]:
            return path, value
    return None


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _format_validation(path: Path, err: ValidationError, overrides: dict[str, Any] | None = None,
                       option: str = "override") -> TargetError:
    """One line: the file (or the override option and value when every bad field came from one), then each bad
    field with pydantic's reason and, for an unknown key, the near field name."""
    in_file: list[str] = []
    from_option: list[str] = []
    for e in err.errors():
        loc = tuple(str(x) for x in e["loc"])
        field = ".".join(loc) or "<top level>"
        reason = near_field(Target, e["loc"]) if e["type"] == "extra_forbidden" else e["msg"]
        source = _override_of(loc, overrides or {}) if loc else None
        if source is None:
            in_file.append(f"field '{field}': {reason}")
        else:
            from_option.append(f"{option} {'.'.join(source[0])}={_shown(source[1])}: field '{field}': {reason}")
    if not in_file:
        return TargetError(f"invalid {'; '.join(from_option)}", from_override=True)
    return TargetError(f"invalid target file {path}: " + "; ".join(in_file + from_option))


def is_bundled(path: Path) -> bool:
    """The file is one of the package's own targets (they cite the seeds for every SLO)."""
    return path.resolve().is_relative_to(BUNDLED_TARGETS_DIR.resolve())


def parse_target(data: Any, path: Path, overrides: dict[str, Any] | None = None,
                 option: str = "override") -> Target:
    if not isinstance(data, dict):
        raise TargetError(f"invalid target file {path}: top level must be a mapping, got {type(data).__name__}")
    try:
        return Target.model_validate({**data, "path": str(path)}, context={BUNDLED: is_bundled(path)})
    except ValidationError as err:
        raise _format_validation(path, err, overrides, option) from None


def load_target(name_or_path: str | os.PathLike[str], directory: Path | None = None,
                overrides: dict[str, Any] | None = None, option: str = "override") -> Target:
    """Load a target by name (``targets/<name>.yaml``) or by path; ``overrides`` is a nested dict merged on top.

    An error caused by an override names ``option`` (``--ml4-set``, ``--set``) and the value, not the file."""
    text = str(name_or_path)
    d = directory or BUNDLED_TARGETS_DIR
    candidate = Path(text)
    if text.endswith((".yaml", ".yml")) or os.sep in text or candidate.is_file():
        path = candidate
        if not path.is_file():
            raise TargetError(f"target file not found: {path}")
    else:
        path = d / f"{text}.yaml"
        if not path.is_file():
            raise TargetError(f"unknown target '{text}'; known targets: {', '.join(known_targets(d)) or '(none)'}"
                              f" (in {d})")
    data = read_yaml(path, "target file", TargetError)  # one line: file, line; a key given twice too
    if overrides:
        data = deep_merge(data if isinstance(data, dict) else {}, overrides)
    return parse_target(data, path, overrides, option)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(expr: str) -> dict[str, Any]:
    """``engine.max_num_seqs=32`` -> ``{"engine": {"max_num_seqs": 32}}`` (value parsed as YAML)."""
    if "=" not in expr:
        raise TargetError(f"override '{expr}' must look like section.field=value")
    key, _, raw = expr.partition("=")
    try:
        value = parse_yaml_value(raw)
    except yaml.YAMLError as err:
        raise TargetError(f"override '{key}=...': the value is not valid YAML: {yaml_error_line(err)}") from None
    out: dict[str, Any] = {}
    cur = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
    return out
