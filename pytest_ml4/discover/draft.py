"""A target being written: each field's value with where it came from, filled source by source.

A field keeps the first value offered (:meth:`Draft.offer`): the sources are applied in the order of
``pytest_ml4/data/discover/fields.yaml`` (flags, /v1/models, /metrics, /health, the engine log), and a required
field none of them showed gets its estimate last. Which source sets which field is that table, not code.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter

from pytest_ml4.control.dynamo import role_instance_ids
from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.discover.probe import DiscoverError, Shown
from pytest_ml4.locations import data_file
from pytest_ml4.logs import EngineArgsLogged, LogView
from pytest_ml4.stacks import REGISTRY, STACK_FIELD, Stack, dynamo, stack_named, vllm
from pytest_ml4.target.model import Engine, Hardware, Serving, Target, Topology

FIELDS_FILE = data_file("discover", "fields.yaml")
HARDWARE_FILE = data_file("discover", "hardware.yaml")

#: The model class of each section, to give a value the field's type (a label "64" becomes 64).
SECTIONS: dict[str, type[BaseModel]] = {"engine": Engine, "prefill_engine": Engine, "hardware": Hardware,
                                        "serving": Serving, "topology": Topology}


class Estimate(Strict):
    """A required field no source showed: the value written and how to set the real one."""

    value: Any
    how: str


class AccessEstimate(Strict):
    """The logs and control sections written for a stack, and how to make each real."""

    logs: dict[str, Any]
    control: dict[str, Any]
    how: dict[Literal["logs", "control"], str]


class FieldsTable(Strict):
    """``pytest_ml4/data/discover/fields.yaml``: where each discovered figure goes in the target (the file says
    what each section maps)."""

    models_context_keys: tuple[str, ...]
    metric_gauges: dict[str, str]
    cache_config_labels: dict[str, str]
    engine_args: dict[str, str]
    engine_args_defaults: dict[str, Any]
    estimates: dict[str, Estimate]
    #: The target's ``perf`` section as written (the target model validates it with the draft).
    perf_estimate: dict[str, Any]
    access_estimates: dict[str, AccessEstimate]
    optional_unset: dict[str, str]
    dgd_engine_flags: dict[str, str]
    dgd_engine_defaults: dict[str, Any]
    dgd_frontend_flags: dict[str, str]


class HardwareFigures(Strict):
    """A family's spec-sheet figures, offered as ``hardware.<field>`` estimates."""

    gpu: str
    memory_per_gpu_gib: float
    symmetric_memory: bool | None = None

    def offered(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class HardwareTable(Strict):
    families: dict[str, HardwareFigures]


@cache
def fields_table() -> FieldsTable:
    return load_yaml(FIELDS_FILE, FieldsTable)


@cache
def hardware_table() -> dict[str, HardwareFigures]:
    return load_yaml(HARDWARE_FILE, HardwareTable).families


@dataclass(frozen=True)
class Value:
    value: Any
    source: str

    @property
    def estimated(self) -> bool:
        return self.source.startswith("estimate")


@dataclass
class Draft:
    """Dotted field path -> :class:`Value`, in the order fields were first offered."""

    values: dict[str, Value] = field(default_factory=dict)

    def offer(self, path: str, value: Any, source: str) -> None:
        """Set ``path`` unless an earlier source already did; the value takes the model field's type."""
        if path not in self.values:
            self.values[path] = Value(typed(path, value), source)

    def get(self, path: str, default: Any = None) -> Any:
        v = self.values.get(path)
        return v.value if v is not None else default

    def estimated(self) -> list[tuple[str, Value]]:
        return [(p, v) for p, v in self.values.items() if v.estimated]


def typed(path: str, value: Any) -> Any:
    """``value`` as the target model's field at ``path`` types it (strings from Prometheus labels)."""
    section, _, name = path.partition(".")
    model = SECTIONS.get(section)
    info = model.model_fields.get(name) if model is not None and "." not in name else None
    if info is None or value is None or isinstance(value, (dict, list)):
        return value  # a section (speculative) stays a mapping for the YAML
    try:
        return TypeAdapter(info.annotation).validate_python(value)
    except ValueError:
        return value  # the loader names the field when the whole file is validated


# ------------------------------------------------------------------------------------------------ flags
def from_hardware(draft: Draft, family: str, gpus: int, gpu: str | None, memory_gib: float | None,
                  bandwidth_tb_s: float | None) -> None:
    draft.offer("hardware.family", family, "flag --hardware")
    draft.offer("hardware.count", gpus, "flag --gpus")
    for path, value, flag in (("hardware.gpu", gpu, "--gpu"), ("hardware.memory_per_gpu_gib", memory_gib,
                                                               "--gpu-memory-gib"),
                              ("hardware.memory_bandwidth_tb_s", bandwidth_tb_s, "--bandwidth-tb-s")):
        if value:
            draft.offer(path, value, f"flag {flag}")
    row = hardware_table().get(family)
    if row is None:
        missing = [flag for flag, path in (("--gpu NAME", "hardware.gpu"),
                                           ("--gpu-memory-gib GIB", "hardware.memory_per_gpu_gib"))
                   if path not in draft.values]
        if missing:
            raise DiscoverError(f"--hardware {family}: no figures for this family in {HARDWARE_FILE} (known: "
                                f"{', '.join(sorted(hardware_table()))}); pass {' '.join(missing)}")
    for name, value in (row.offered() if row is not None else {}).items():
        draft.offer(f"hardware.{name}", value, f"estimate: {family} spec sheet ({HARDWARE_FILE.name})")
    if gpus > 8:
        draft.offer("hardware.nodes", math.ceil(gpus / 8), "estimate: 8 GPUs a node")


# ------------------------------------------------------------------------------------------------ endpoint
def served_card(shown: Shown, model: str | None) -> dict[str, Any]:
    """The model card the target is about: ``--model``, else the only (first) one listed."""
    if model is None:
        return shown.models[0]
    for card in shown.models:
        if card.get("id") == model:
            return card
    listed = ", ".join(str(c.get("id")) for c in shown.models)
    raise DiscoverError(f"--model {model}: {shown.models_url} does not list it (listed: {listed})")


def from_models(draft: Draft, shown: Shown, card: dict[str, Any]) -> None:
    src = f"discovered: {shown.models_url}"
    draft.offer("serving.served_model_name", card["id"], src)
    for where, each in ((shown.engine_models_url, shown.engine_models[:1]), (shown.models_url, [card])):
        for engine_card in each:
            _model_card(draft, engine_card, f"discovered: {where}")
    if shown.requires_key is not None:
        answer = "refused" if shown.requires_key else "answered"
        draft.offer("endpoint.requires_api_key", shown.requires_key, f"{src} {answer} a request without the key")
    if shown.version:
        draft.offer("engine.version", shown.version, f"discovered: {shown.version_url}")


def _model_card(draft: Draft, card: dict[str, Any], src: str) -> None:
    """The engine's context length and model path from its model card."""
    for key in fields_table().models_context_keys:
        if isinstance(card.get(key), int):
            draft.offer("engine.max_model_len", card[key], f"{src} ({key})")
    if isinstance(card.get("root"), str) and card["root"]:
        draft.offer("engine.model_path", card["root"], f"{src} (root)")


def from_metrics(draft: Draft, shown: Shown, served: str) -> None:
    snap = shown.metrics
    if snap is None:
        return
    table = fields_table()
    for family, path in table.metric_gauges.items():
        samples = snap.samples(family, model=served) or snap.samples(family)
        if samples:
            draft.offer(path, samples[0].value, f"discovered: {shown.metrics_url} {family}")
    # The engine's cache config, in vLLM's family (every stack's workers run vLLM: stacks.yaml worker_engine).
    family = vllm.adapter().engine_metric("cache_config_info")
    info = snap.samples(family)
    if info:
        for label, path in table.cache_config_labels.items():
            if info[0].labels.get(label) not in (None, "", "None"):
                draft.offer(path, info[0].labels[label], f"discovered: {shown.metrics_url} {family} {label}")


def from_health(draft: Draft, shown: Shown) -> list[str]:
    """A Dynamo frontend's worker list sets the stack and the topology (prefill component or not); when the DGD
    already declared the topology, a different count registered now is returned as a note."""
    if shown.health is None:
        draft.offer(STACK_FIELD, vllm.NAME, f"discovered: {shown.health_url} lists no Dynamo workers")
        draft.offer("topology.kind", "single_node", "discovered: one vLLM server")
        return []
    src = f"discovered: {shown.health_url}"
    draft.offer(STACK_FIELD, dynamo.NAME, f"{src} lists Dynamo worker instances")
    roles = role_instance_ids(shown.health)
    prefill, decode = len(roles["prefill"]), len(roles["decode"])
    if decode == 0:
        raise DiscoverError(f"{shown.health_url} lists no worker on a generate endpoint: start the workers first")
    seen = {"topology.prefill_workers": prefill, "topology.decode_workers": decode} if prefill else {
        "topology.workers": decode}
    if "topology.kind" in draft.values:
        declared = sum(draft.get(p, 0) for p in ("topology.workers", "topology.prefill_workers",
                                                  "topology.decode_workers"))
        return [] if declared == prefill + decode else [
            f"{shown.health_url} lists {prefill + decode} worker instance(s) now, the DGD declares {declared}"]
    draft.offer("topology.kind", "disagg" if prefill else "agg",
                f"{src} ({prefill} prefill instance(s))" if prefill else f"{src} (no prefill component)")
    for path, n in seen.items():
        draft.offer(path, n, f"{src} {path.rsplit('.', 1)[1].replace('_', ' ')} (instances on generate)")
    return []


# ------------------------------------------------------------------------------------------------ log
def from_log(draft: Draft, view: LogView) -> bool:
    """The engine's last ``non-default args`` line; False when the log has none."""
    event = view.last(EngineArgsLogged)
    if event is None or not event.args:
        return False
    table = fields_table()
    src = f"discovered: {view.source} non-default args"
    for key, path in table.engine_args.items():
        if key in event.args:
            draft.offer(path, arg_value(key, event.args[key]), f"{src} ({key})")
    for key, value in table.engine_args_defaults.items():
        if key not in event.args:
            draft.offer(table.engine_args[key], value, f"{src}: no {key}, vLLM's default")
    return True


def arg_value(key: str, value: Any) -> Any:
    if key == "speculative_config" and isinstance(value, dict):
        spec = {"method": str(value.get("method", "unknown")),
                "num_speculative_tokens": int(value.get("num_speculative_tokens") or 1)}
        if any("synthetic" in str(k) for k in value):
            spec["synthetic_acceptance"] = True
        return spec
    return value


# ------------------------------------------------------------------------------------------------ estimates
def drafted_stack(draft: Draft) -> Stack:
    """The stack the draft describes so far (vLLM until a source says otherwise)."""
    return stack_named(draft.get(STACK_FIELD, vllm.NAME), f"the drafted {STACK_FIELD}")


def env_prefix(name: str) -> str:
    """``ML4_<NAME>`` for the variable names the target gives (``my-h200`` -> ``ML4_MY_H200``)."""
    return "ML4_" + re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()


def estimates(draft: Draft, name: str) -> None:
    """Required fields no source showed (and the sections a live run needs that no endpoint shows)."""
    stack = drafted_stack(draft)
    # A frontend's release (serving.dynamo_version) is estimated only for the stack that reads it.
    release_fields = {factory().release_field for factory in REGISTRY.values()} - {stack.release_field}
    for path, row in fields_table().estimates.items():
        if path in release_fields:
            continue
        draft.offer(path, row.value, f"estimate: {row.how}")
    if "engine.model_path" not in draft.values:
        draft.offer("engine.model_path", draft.get("serving.served_model_name"),
                    "estimate: the served name; set the path the engine loads")
    workers = draft.get("topology.workers", 1) if draft.get("topology.kind") == "agg" else (
        draft.get("topology.prefill_workers", 0) + draft.get("topology.decode_workers", 0)
        if draft.get("topology.kind") == "disagg" else 1)
    draft.offer("topology.tensor_parallel", max(1, int(draft.get("hardware.count", 1)) // max(1, workers)),
                f"estimate: --gpus / {workers} worker(s); set each worker's --tensor-parallel-size")
    if draft.get("topology.kind") == "disagg":
        for path, v in list(draft.values.items()):
            if path.startswith("engine."):
                draft.offer("prefill_" + path, v.value, v.source if v.estimated else
                            f"estimate: the decode workers' {path} ({v.source}); set the prefill workers' own")
    if stack.routes_workers:
        roles = ("prefill", "decode") if draft.get("topology.kind") == "disagg" else ("worker",)
        draft.offer("endpoint.worker_metrics_url_env",
                    {role: f"{env_prefix(name)}_{role.upper()}_METRICS" for role in roles},
                    "estimate: set each variable to its workers' /metrics URLs, comma-separated (the vllm:* "
                    "families live there, not on the frontend)")
    access = fields_table().access_estimates[stack.name]
    for section in ("logs", "control"):
        if not any(p.startswith(section + ".") for p in draft.values):
            for key, value in getattr(access, section).items():
                draft.offer(f"{section}.{key}", name if value == "NAME" else value, f"estimate: {access.how[section]}")


def target_from(draft: Draft) -> dict[str, Any]:
    """The nested mapping the YAML holds (values only)."""
    out: dict[str, Any] = {}
    for path, v in draft.values.items():
        *parents, leaf = path.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v.value
    return out


def check(data: dict[str, Any], where: str) -> Target:
    """The loader's verdict on the mapping (``TargetError`` naming the field)."""
    from pathlib import Path

    from pytest_ml4.target.model import parse_target

    return parse_target(data, Path(where))
