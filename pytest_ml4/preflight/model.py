"""Data types shared by the preflight parsers and rules: findings, rules, and the parsed documents.

A *document* is one deployable thing read from a file: a vLLM engine launch (systemd unit or shell script),
a DynamoGraphDeployment, a LiteLLM proxy config or an aiperf perf run.  Rules look at documents (one at a
time or all together) and return :class:`Finding` objects.  Nothing here holds a secret value: parsers keep
only the *fact* that a literal secret was seen, never the secret itself.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ml4.target.model import Engine, Hardware, Target


class Severity(str, enum.Enum):
    """How bad a finding is; only ``error`` fails the CLI and the preflight tests."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One problem in one place; ``message`` and ``fix`` are single lines fit for a terminal and a report."""

    rule_id: str
    severity: Severity
    message: str
    fix: str
    source: str
    path: str
    line: int | None = None
    where: str = ""

    def location(self) -> str:
        loc = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{loc} [{self.where}]" if self.where else loc

    def format(self) -> str:
        return (f"{self.location()}: {self.severity.value}: {self.rule_id}: {self.message}\n"
                f"    fix: {self.fix}\n    source: {self.source}")

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule_id, "severity": self.severity.value, "message": self.message, "fix": self.fix,
                "source": self.source, "path": self.path, "line": self.line, "where": self.where}


@dataclass(frozen=True)
class HardwareInfo:
    """What a document runs on: from its target (full spec) or inferred from a node affinity (family only)."""

    family: str | None
    memory_per_gpu_gib: float | None = None
    spec: Hardware | None = None
    origin: str = "unknown"

    @property
    def is_95gib_card(self) -> bool:
        # Seed 000: "95.06 GiB usable per GPU" on the RTX PRO 6000 Blackwell Max-Q; the workspace OOM and the
        # start-up refusal were measured on exactly that card size.
        if self.memory_per_gpu_gib is not None:
            return 90.0 <= self.memory_per_gpu_gib <= 100.0
        return self.family == "rtxpro"


UNKNOWN_HARDWARE = HardwareInfo(family=None)


@dataclass
class SecretLiteral:
    """A place where a secret was written literally; the value itself is deliberately not kept."""

    name: str
    line: int | None = None
    where: str = ""


@dataclass
class EngineArgs:
    """One vLLM engine launch (``vllm serve`` or ``python -m dynamo.vllm``) as parsed flags.

    Flag names are normalised to ``--dash-case`` without the dashes (``max-model-len``); a flag given several
    times keeps every value.  A flag without a value is stored as ``None`` (a boolean switch).
    """

    program: str
    model: str | None = None
    flags: dict[str, list[str | None]] = field(default_factory=dict)
    dotted: dict[str, dict[str, str]] = field(default_factory=dict)
    line: int | None = None
    parse_errors: list[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in self.flags or name in self.dotted

    def get(self, name: str) -> str | None:
        values = self.flags.get(name)
        return values[-1] if values else None

    def switch(self, name: str) -> bool:
        """A boolean flag: present without value, or with a true-ish value; ``--no-<name>`` turns it off."""
        if f"no-{name}" in self.flags:
            return False
        if name not in self.flags:
            return False
        value = self.get(name)
        return value is None or value.lower() in ("1", "true", "yes", "on")

    def number(self, name: str) -> float | None:
        value = self.get(name)
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            return None

    def json(self, name: str) -> dict[str, Any] | None:
        """A JSON-valued flag (``--speculative-config '{...}'``) merged with its dotted form (``--x.key v``)."""
        out: dict[str, Any] = {}
        raw = self.get(name)
        if raw is not None:
            try:
                parsed = json.loads(raw)
            except json.JSONDecodeError:
                return None
            if not isinstance(parsed, dict):
                return None
            out.update(parsed)
        for key, value in self.dotted.get(name, {}).items():
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                out[key] = value
        return out if (raw is not None or name in self.dotted) else None

    def speculative(self) -> dict[str, Any] | None:
        return self.json("speculative-config")

    def kv_transfer(self) -> dict[str, Any] | None:
        return self.json("kv-transfer-config")

    def block_size(self) -> int | None:
        value = self.number("block-size")
        return int(value) if value is not None else None

    def kv_cache_dtype(self) -> str | None:
        return self.get("kv-cache-dtype")

    def disaggregation_mode(self) -> str | None:
        return self.get("disaggregation-mode")

    def to_engine(self, base: Engine | None) -> Engine | None:
        """The target's :class:`Engine` with the values this launch sets (for the memory model)."""
        if base is None:
            return None
        update: dict[str, Any] = {}
        for flag, attr, conv in (("max-model-len", "max_model_len", int),
                                 ("max-num-seqs", "max_num_seqs", int),
                                 ("max-num-batched-tokens", "max_num_batched_tokens", int),
                                 ("gpu-memory-utilization", "gpu_memory_utilization", float),
                                 ("block-size", "block_size", int)):
            value = self.number(flag)
            if value is not None:
                update[attr] = conv(value)
        if self.kv_cache_dtype():
            update["kv_cache_dtype"] = self.kv_cache_dtype()
        return base.model_copy(update=update)


@dataclass
class FrontendArgs:
    """A Dynamo frontend launch (``python -m dynamo.frontend``) with its flags, as :class:`EngineArgs`."""

    args: EngineArgs
    env: dict[str, str]

    def setting(self, flag: str, env_name: str) -> str | None:
        """A frontend option given either as a flag or as its ``DYN_*`` environment twin."""
        value = self.args.get(flag)
        if value is not None:
            return value
        return self.env.get(env_name)


@dataclass
class Document:
    """Common part of everything the loader hands to the rules."""

    path: str
    kind: str
    hardware: HardwareInfo = UNKNOWN_HARDWARE
    target: Target | None = None
    secrets: list[SecretLiteral] = field(default_factory=list)
    # "performance" only when the document declares itself a pure performance run (see rules.spec).
    run_purpose: str | None = None
    line: int | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class VllmLaunch(Document):
    """A ``vllm serve`` engine started by a systemd unit or a shell script."""

    engine: EngineArgs = field(default_factory=lambda: EngineArgs(program="vllm serve"))
    env: dict[str, str] = field(default_factory=dict)
    env_files: list[str] = field(default_factory=list)


@dataclass
class DgdComponent:
    """One component of a DynamoGraphDeployment with its resolved role, launch flags and environment."""

    name: str
    role: str  # frontend | agg | prefill | decode | planner | other
    replicas: int | None
    env: dict[str, str]
    env_refs: dict[str, str]
    engine: EngineArgs | None = None
    frontend: FrontendArgs | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    shared_memory: str | None = None
    line: int | None = None
    #: The main container's image reference (its tag is the Dynamo release, pytest_ml4/data/dynamo/versions.yaml).
    image: str | None = None


@dataclass
class DgdDocument(Document):
    """A DynamoGraphDeployment in either the v1alpha1 (``services``) or v1beta1 (``components``) shape."""

    name: str = ""
    namespace: str | None = None
    api_version: str = ""
    annotations: dict[str, str] = field(default_factory=dict)
    components: list[DgdComponent] = field(default_factory=list)

    def by_role(self, role: str) -> list[DgdComponent]:
        return [c for c in self.components if c.role == role]

    @property
    def is_disagg(self) -> bool:
        return bool(self.by_role("prefill") or self.by_role("decode"))


@dataclass
class LiteLLMConfig(Document):
    """A LiteLLM proxy config (``model_list`` + settings)."""

    data: dict[str, Any] = field(default_factory=dict)

    def section(self, name: str) -> dict[str, Any]:
        value = self.data.get(name)
        return value if isinstance(value, dict) else {}

    def deployments(self) -> list[dict[str, Any]]:
        return [m for m in self.data.get("model_list") or [] if isinstance(m, dict)]


@dataclass
class AiperfInvocation:
    """One ``aiperf profile`` command line with its flags and the shell context it runs in."""

    args: EngineArgs
    line: int | None
    loop_vars: frozenset[str]
    artifact_dir: str | None

    def extra_inputs(self) -> dict[str, Any]:
        """``--extra-inputs`` values (``key:value`` pairs or JSON objects) merged into one dict."""
        out: dict[str, Any] = {}
        for raw in self.args.flags.get("extra-inputs", []):
            if raw is None:
                continue
            text = raw.strip()
            if text.startswith("{"):
                try:
                    parsed = json.loads(text)
                except json.JSONDecodeError:
                    continue
                if isinstance(parsed, dict):
                    out.update(parsed)
                continue
            key, sep, value = text.partition(":")
            if sep:
                out[key.strip()] = _scalar(value.strip())
        return out


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@dataclass
class PerfRun(Document):
    """A performance run: an aiperf Job manifest, a ConfigMap'd script, a shell script or a command line."""

    name: str = ""
    invocations: list[AiperfInvocation] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    run_unique_vars: frozenset[str] = frozenset()
    target_dgd: str | None = None
    namespace: str | None = None


CheckFn = Callable[["LintContext"], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    """A lint rule: id, severity, one-line message and fix, and the seed line or reference fact it encodes."""

    id: str
    severity: Severity
    message: str
    fix: str
    source: str
    kinds: tuple[str, ...]
    check: CheckFn

    def finding(self, doc: Document, detail: str = "", *, line: int | None = None, where: str = "",
                severity: Severity | None = None) -> Finding:
        message = f"{self.message}: {detail}" if detail else self.message
        return Finding(rule_id=self.id, severity=severity or self.severity, message=message, fix=self.fix,
                       source=self.source, path=doc.path, line=line if line is not None else doc.line, where=where)


@dataclass
class LintContext:
    """Everything one lint run sees: all documents from all given files (cross-file rules need them together)."""

    documents: list[Document]

    def of(self, cls: type) -> list[Any]:
        return [d for d in self.documents if isinstance(d, cls)]


def relpath(path: Path) -> str:
    """A path as shown in findings: relative to the working directory when below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
