"""Deployment targets: the YAML files under ``targets/`` and their validated model.

A target describes one Mistral Large 4 deployment from the seeds: its hardware, topology, serving stack,
engine flags, where its endpoint, key, logs and restart control come from, and the gate thresholds the suites
judge it by. Secrets are never stored here, only the *names* of environment variables that hold them.

Works without pytest::

    from pytest_ml4.targets import load_target, known_targets
    t = load_target("gb300-disagg")          # a name from targets/ ...
    t = load_target("my/variant.yaml")       # ... or a path to a YAML file

A bad file raises :class:`TargetError` whose message names the file and the offending field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pytest_ml4.locations import BUNDLED_TARGETS_DIR, resolve_from, target_root

HardwareFamily = Literal["rtxpro", "gb300", "vr200"]
TopologyKind = Literal["single_node", "agg", "disagg"]
WorkerRole = Literal["worker", "prefill", "decode"]


class TargetError(ValueError):
    """A target could not be found or is invalid; the message names the file and field."""


class _Strict(BaseModel):
    # Unknown keys are typos until proven otherwise: a misspelt gate would silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hardware(_Strict):
    gpu: str
    family: HardwareFamily
    count: int = Field(gt=0)
    memory_per_gpu_gib: float = Field(gt=0)
    memory_bandwidth_tb_s: float = Field(gt=0, description="HBM/GDDR bandwidth per GPU, TB/s")
    interconnect: str
    compute_capability: str
    nodes: int = Field(default=1, gt=0)
    symmetric_memory: bool = True
    source: str = ""


class Topology(_Strict):
    kind: TopologyKind
    tensor_parallel: int = Field(gt=0)
    workers: int = Field(default=1, gt=0, description="aggregated workers (replicas); 1 for single-node")
    prefill_workers: int = Field(default=0, ge=0)
    decode_workers: int = Field(default=0, ge=0)
    expert_parallel_decode: bool = False

    #: The field counting the replicas that hold a running stream: the decode role when disaggregated.
    STREAM_ROLE: ClassVar[dict[str, tuple[str, str]]] = {"disagg": ("decode", "decode_workers")}

    def stream_role(self) -> tuple[str, int]:
        """The role whose worker holds a running stream, and how many replicas it has."""
        role, fld = self.STREAM_ROLE.get(self.kind, ("aggregated", "workers"))
        return role, getattr(self, fld)

    @model_validator(mode="after")
    def _roles(self) -> "Topology":
        if self.kind == "disagg" and (self.prefill_workers < 1 or self.decode_workers < 1):
            raise ValueError("disagg topology needs prefill_workers >= 1 and decode_workers >= 1")
        if self.kind != "disagg" and (self.prefill_workers or self.decode_workers):
            raise ValueError(f"{self.kind} topology must not set prefill_workers/decode_workers")
        return self


class Speculative(_Strict):
    method: str
    num_speculative_tokens: int = Field(gt=0)
    synthetic_acceptance: bool = False


class Engine(_Strict):
    """The vLLM engine flags the seed deployment runs with (per worker role where they differ)."""

    version: str = "0.33.0"
    model_path: str
    max_model_len: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    max_num_batched_tokens: int = Field(gt=0)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    kv_cache_dtype: str
    block_size: int = Field(default=16, gt=0)
    dtype: str = "bfloat16"
    speculative: Speculative | None = None
    reasoning_parser: str | None = "mistral"
    tool_call_parser: str | None = "mistral"
    enable_auto_tool_choice: bool = True
    disable_hybrid_kv_cache_manager: bool = False
    kv_offloading_size_gib: float | None = None
    kv_connector: str | None = None
    tokenizer_version: int = Field(default=15, ge=3)
    extra_args: list[str] = Field(default_factory=list)


class Proxy(_Strict):
    kind: Literal["litellm"]
    config: str = Field(description="path (relative to the repo root) of the proxy config")
    model_alias: str
    num_retries: int = 0
    max_retries: int = 0


class Serving(_Strict):
    stack: Literal["vllm", "vllm+litellm", "dynamo+vllm"]
    served_model_name: str
    engine_served_model_name: str | None = None
    proxy: Proxy | None = None
    #: Set only on the view ``Target.without_proxy()`` gives (--ml4-no-proxy): the proxy the run goes around.
    bypassed_proxy: Proxy | None = None
    dynamo_router: Literal["kv", "round_robin", "random"] | None = None
    session_affinity: bool = False
    #: The KV router's conditional disaggregation (Dynamo's ``--router-conditional-disagg``, experimental in
    #: 1.6.1): the router may skip the remote prefill and prefill on the decode worker. None of the seeds sets it.
    conditional_disagg: bool = False
    migration_limit: int | None = None
    #: The Dynamo release the deployment runs (its image tag); a row of pytest_ml4/data/dynamo/versions.yaml.
    dynamo_version: str | None = None

    @model_validator(mode="after")
    def _proxy(self) -> "Serving":
        if self.stack == "vllm+litellm" and self.proxy is None:
            raise ValueError("stack vllm+litellm needs a proxy section")
        return self

    @model_validator(mode="after")
    def _conditional_disagg(self) -> "Serving":
        if self.conditional_disagg and self.dynamo_router != "kv":
            raise ValueError(f"conditional_disagg is a setting of Dynamo's KV router (dynamo_router: kv), not of "
                             f"dynamo_router {self.dynamo_router}")
        return self

    @model_validator(mode="after")
    def _dynamo_version(self) -> "Serving":
        if self.stack != "dynamo+vllm":
            if self.dynamo_version is not None:
                raise ValueError(f"dynamo_version is only for stack dynamo+vllm, not {self.stack}")
            return self
        from pytest_ml4.dynamo_versions import behaviour, known_versions

        if not self.dynamo_version:
            raise ValueError("stack dynamo+vllm needs dynamo_version (the image tag, e.g. "
                             "1.7.0-mistral-large-4-dev.1)")
        if behaviour(self.dynamo_version) is None:
            raise ValueError(f"dynamo_version {self.dynamo_version!r} is not in pytest_ml4/data/dynamo/versions.yaml "
                             f"(known: {', '.join(known_versions())})")
        return self


class EndpointSource(_Strict):
    url_env: str
    api_key_env: str | None = None
    requires_api_key: bool = True
    metrics_url_env: str | None = None
    default_url: str | None = None
    #: Dynamo: the environment variable holding the workers' /metrics URLs per role (comma-separated), where the
    #: ``vllm:*`` families live (the frontend's /metrics has only ``dynamo_*``; reference/real-dynamo.md).
    worker_metrics_url_env: dict[WorkerRole, str] = Field(default_factory=dict)


class Logs(_Strict):
    kind: Literal["journald", "file", "kubernetes"]
    unit: str | None = None
    path: str | None = None
    ssh_host_env: str | None = None
    namespace_env: str | None = None
    namespace: str | None = None
    dgd: str | None = None

    @model_validator(mode="after")
    def _need(self) -> "Logs":
        need = {"journald": "unit", "file": "path", "kubernetes": "dgd"}[self.kind]
        if getattr(self, need) in (None, ""):
            raise ValueError(f"logs of kind {self.kind} need '{need}'")
        return self


class Control(_Strict):
    kind: Literal["systemd", "kubernetes"]
    unit: str | None = None
    ssh_host_env: str | None = None
    dgd: str | None = None
    namespace_env: str | None = None
    namespace: str | None = None
    restart_timeout_s: float = Field(default=900, gt=0)
    #: Declared seconds from one worker pod's deletion (or the engine's stop) to its replacement registered and
    #: serving: the bound of each pod's leave and register phases in the restart suite (README "Deadlines";
    #: under --sim the embedded deployment's figure, pytest_ml4/data/restart/deployment-start.yaml).
    worker_start_s: float = Field(default=600, gt=0)


class Gates(_Strict):
    """Thresholds the suites judge by; each one traces back to a seed line (see the target YAML comments)."""

    ttft_p50_s_max: float | None = None
    decode_tok_s_user_p50_min: float | None = None
    ttft_p99_knee_s: float = 5.0
    #: The latency knee (first TTFT p99 over ttft_p99_knee_s) must not come before this concurrency.
    knee_not_before: int | None = Field(default=None, gt=0)
    request_error_rate_max: float = 0.0
    kv_pool_tokens_min: int | None = None
    kv_max_concurrency_min: float = 1.0
    kv_usage_pct_max: float = 90.0
    spec_acceptance_length: tuple[float, float] | None = None
    spec_position_rate: tuple[float, float] | None = None
    recovery_time_s_max: float = 600.0
    restart_client_errors_allowed: bool = False
    reasoning_share: tuple[float, float] | None = None
    perf_tolerance: float = 0.10


WorkloadName = Literal["chat", "sessions"]


def _cited(source: str) -> str:
    # Every SLO traces back to a seed line or says it is an estimate: a bare number would pass for a stated one.
    if not source.startswith(("seed ", "estimate")):
        raise ValueError(f"source must cite a seed ('seed NNN: ...') or start with 'estimate', got {source!r}")
    return source


class Slo(_Strict):
    """Latency objectives every request of a workload must meet to count as good (aiperf ``--goodput``).

    Named after the p99 they bound: with the goodput floor at 0.99 the share of good requests is the joint p99."""

    ttft_p99_s: float = Field(gt=0, description="time to first token, seconds")
    itl_p99_ms: float = Field(gt=0, description="a request's mean inter-token latency, milliseconds")
    e2e_p99_s: float = Field(gt=0, description="end-to-end request latency, seconds")
    source: str

    @model_validator(mode="after")
    def _source(self) -> "Slo":
        _cited(self.source)
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

    isl: int = Field(gt=0)
    osl: int = Field(gt=0)
    request_rate: float = Field(gt=0, description="production request rate, requests/s (Poisson arrivals)")
    capacity_rps: float | None = Field(default=None, gt=0, description="declared capacity, requests/s")
    turns: int = Field(default=1, ge=1)
    system_prompt_tokens: int = Field(default=0, ge=0)
    slo: Slo
    source: str

    @model_validator(mode="after")
    def _consistent(self) -> "Workload":
        _cited(self.source)
        if self.capacity_rps is not None and self.capacity_rps < self.request_rate:
            raise ValueError(f"capacity_rps {self.capacity_rps:g} is below request_rate {self.request_rate:g}: "
                             f"the deployment would be planned to fail its production rate")
        return self


class Perf(_Strict):
    concurrencies: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    isl: int = 512
    osl: int = 4096
    duration_s: float = 300
    baseline: str | None = None
    trace: str | None = None
    warmup_requests: int = 5
    #: The goodput and capacity gates' request mixes (``chat``, ``sessions``), each with its SLOs.
    workloads: dict[WorkloadName, Workload] = Field(default_factory=dict)
    #: Smallest share of requests that must meet every SLO of their workload (DistServe's and aiperf's 0.95).
    goodput_floor: float = Field(default=0.95, gt=0, le=1)

    @model_validator(mode="after")
    def _sessions(self) -> "Perf":
        s = self.workloads.get("sessions")
        if s is not None and (s.turns < 2 or s.system_prompt_tokens < 1):
            raise ValueError("workloads.sessions needs turns >= 2 and system_prompt_tokens >= 1 (multi-turn "
                             "conversations sharing a system prompt)")
        return self


class SimProfile(_Strict):
    """Simple latency profile of the embedded simulator (the full performance model refines it)."""

    ttft_s: float = Field(default=0.5, gt=0)
    itl_ms: float = Field(default=12.0, gt=0)
    prefill_tok_s: float = Field(default=20000, gt=0)
    #: Seconds a simulated restart keeps the port closed: from the old engine process's exit to the new one
    #: binding. A modelled figure of the target (estimate unless its YAML cites a seed), so restart verdicts do
    #: not depend on how fast this machine starts a Python process (``SimServer.restart``).
    restart_outage_s: float = Field(default=1.5, ge=0)
    extra: dict[str, Any] = Field(default_factory=dict)


class Target(_Strict):
    name: str
    description: str
    source: str = Field(description="the seed/reference lines this target is written from")
    hardware: Hardware
    topology: Topology
    serving: Serving
    engine: Engine
    prefill_engine: Engine | None = None
    endpoint: EndpointSource
    logs: Logs
    control: Control
    gates: Gates = Field(default_factory=Gates)
    perf: Perf = Field(default_factory=Perf)
    sim: SimProfile = Field(default_factory=SimProfile)
    manifests: list[str] = Field(default_factory=list)
    path: str | None = Field(default=None, description="file the target was loaded from (set by the loader)")

    @model_validator(mode="after")
    def _consistent(self) -> "Target":
        if self.topology.kind == "disagg" and self.prefill_engine is None:
            raise ValueError("disagg targets need a prefill_engine section (the decode role is 'engine')")
        if self.serving.stack == "dynamo+vllm" and self.logs.kind != "kubernetes":
            raise ValueError("dynamo+vllm targets read their logs from kubernetes")
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
        return self.serving.stack == "dynamo+vllm"

    @property
    def has_proxy(self) -> bool:
        return self.serving.proxy is not None

    def without_proxy(self) -> "Target":
        """The deployment as a client that goes around its proxy sees it: the engine's stack and served name.

        Gates stay as declared; a check that only the proxy makes true (no client error across a restart thanks to
        its retries) looks at ``serving.bypassed_proxy`` and says it does not apply.
        """
        if self.serving.proxy is None:
            return self
        engine_stack = self.serving.stack.split("+", 1)[0]
        serving = self.serving.model_copy(update={
            "stack": engine_stack, "proxy": None, "bypassed_proxy": self.serving.proxy,
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


def _format_validation(path: Path, err: ValidationError) -> str:
    """One line: the file, then each bad field with pydantic's reason."""
    fields = []
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "<top level>"
        fields.append(f"field '{field}': {e['msg']}")
    return f"invalid target file {path}: " + "; ".join(fields)


def parse_target(data: Any, path: Path) -> Target:
    if not isinstance(data, dict):
        raise TargetError(f"invalid target file {path}: top level must be a mapping, got {type(data).__name__}")
    try:
        return Target.model_validate({**data, "path": str(path)})
    except ValidationError as err:
        raise TargetError(_format_validation(path, err)) from None


def load_target(name_or_path: str | os.PathLike[str], directory: Path | None = None,
                overrides: dict[str, Any] | None = None) -> Target:
    """Load a target by name (``targets/<name>.yaml``) or by path; ``overrides`` is a nested dict merged on top."""
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
    data = read_yaml_strict(path)
    if overrides:
        data = deep_merge(data if isinstance(data, dict) else {}, overrides)
    return parse_target(data, path)


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key]})", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def yaml_error_line(err: yaml.YAMLError) -> str:
    """A YAML error on one line: ``line L, column C: problem`` (PyYAML's own text spans several lines)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(problem).split())


def read_yaml_strict(path: Path) -> Any:
    """A target file's YAML, or a :class:`TargetError` of one line naming the file and line: not UTF-8, a
    YAML error, a tag the safe loader refuses, or a key given twice."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise TargetError(f"invalid target file {path}: line {line}: not UTF-8 text (byte "
                          f"0x{raw[err.start]:02x})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise TargetError(f"invalid target file {path}: {yaml_error_line(err)}") from None


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
        value = yaml.load(raw, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise TargetError(f"override '{key}=...': the value is not valid YAML: {yaml_error_line(err)}") from None
    out: dict[str, Any] = {}
    cur = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
    return out
