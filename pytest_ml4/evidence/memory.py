"""The seed's GPU memory model: what a vLLM engine does with one GPU's memory at boot and on its first big step.

Seed 000 explains the RTX PRO unit's crash this way: vLLM takes ``gpu_memory_utilization`` of the GPU as its budget,
loads the weights, profiles the activations of a ``max_num_batched_tokens`` step, and sizes the KV pool from whatever
is left. Outside that budget, on the first large step, the FusedMoE runner asks for a contiguous 792 MiB workspace;
at util 0.98 with 8192 batched tokens only 751.25 MiB is free, so the engine dies. At util 0.99 vLLM refuses to
start because the free memory (93.94 GiB) is below the budget (94.11 GiB).

:func:`plan_memory` reproduces that per GPU from a target's hardware and engine flags. Its constants live in
``pytest_ml4/data/memory/calibration.yaml`` next to the seed line each comes from; plans for hardware the seed never ran on
(GB300, VR200) or for another KV dtype are marked ``estimate=True``.

Works without pytest::

    from pytest_ml4.evidence.memory import plan_memory
    plan = plan_memory(target.hardware, target.engine, target.topology.tensor_parallel)
    plan.outcome, plan.kv_pool_tokens, plan.message
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.target.model import Engine, Hardware

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10
CALIBRATION_FILE = data_file("memory", "calibration.yaml")

Outcome = Literal["ok", "startup_refused", "oom_first_step", "no_kv_memory"]

_NO_CACHE_BLOCKS = (
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the "
    "engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). "
    "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")


@dataclass(frozen=True)
class MemoryPlan:
    """One GPU's memory at boot and on the first large step (GiB unless the name says otherwise)."""

    outcome: Outcome
    kv_pool_tokens: int
    max_concurrency: float
    available_kv_gib: float
    headroom_gib: float
    message: str | None
    estimate: bool
    # Details the simulator's boot lines print and the tests check.
    total_gib: float = 0.0
    free_at_startup_gib: float = 0.0
    requested_gib: float = 0.0
    weights_gib: float = 0.0
    activations_gib: float = 0.0
    cuda_graphs_gib: float = 0.0
    kv_bytes_per_token: int = 0
    num_gpu_blocks: int = 0
    first_step_free_mib: float = 0.0
    workspace_mib: float = 0.0
    max_model_len: int = 0
    #: The smallest engine step (tokens scheduled at once) whose activations leave less than the workspace free;
    #: the engine dies on its first step at least this large (``oom_first_step`` when it is <= the token budget).
    oom_step_tokens: int | None = None

    @property
    def boots(self) -> bool:
        """The engine reaches 'serving' (an OOM on the first step still boots first)."""
        return self.outcome in ("ok", "oom_first_step")


class Unit(Strict):
    """The unit every measured number comes from."""

    family: str
    tensor_parallel: int
    total_gib: float
    total_source: str
    free_at_startup_gib: float
    free_at_startup_source: str


class AnchorEngine(Strict):
    """The engine flags of the crashing config the anchors were logged under."""

    gpu_memory_utilization: float
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_cache_dtype: str
    source: str


class Anchor(Strict):
    max_model_len: int
    kv_pool_tokens: int
    source: str


class Workspace(Strict):
    """The FusedMoE workspace the first large step allocates outside the profiled memory."""

    requested_mib: float
    free_mib_at_anchor: float
    source: str
    unprofiled_scales_with: str


class CalibrationCheck(Strict):
    """A configuration the seed ran and what it left (the tests replay it)."""

    engine: dict[str, int | float]
    headroom_gib_about: float
    source: str


class ModelConstants(Strict):
    num_layers: int
    indexer_bytes_per_token_layer: int
    #: Latent + rope bytes per token and layer, by ``--kv-cache-dtype``.
    kv_bytes_per_token_layer: dict[str, int]
    profiled_activation_kib_per_batched_token: float
    sampler_mib_per_seq: float
    non_torch_gib: float
    cuda_graphs_gib: float


class Calibration(Strict):
    """``pytest_ml4/data/memory/calibration.yaml``: the constants and the seed line behind each."""

    unit: Unit
    anchor_engine: AnchorEngine
    anchors: tuple[Anchor, ...] = Field(min_length=1)
    fused_moe_workspace: Workspace
    checks: dict[str, CalibrationCheck]
    model: ModelConstants


@lru_cache(maxsize=4)
def load_calibration(path: Path = CALIBRATION_FILE) -> Calibration:
    """The calibration constants (see the YAML's comments for the seed line behind each)."""
    return load_yaml(Path(path), Calibration)


def format_gib(nbytes: float) -> str:
    """vLLM's ``format_gib``: ``f"{round(b / GiB, 2)}"`` (Python float repr, so 94.11 but also 93.9)."""
    return f"{round(nbytes / GIB, 2)}"


def format_size(nbytes: float) -> str:
    """PyTorch's ``c10::format_size`` used in CUDA OOM messages: two decimals, bytes/KiB/MiB/GiB."""
    n = int(round(nbytes))
    if n <= KIB:
        return f"{n} bytes"
    if n <= MIB:
        return f"{n / KIB:.2f} KiB"
    if n <= GIB:
        return f"{n / MIB:.2f} MiB"
    return f"{n / GIB:.2f} GiB"


def kv_bytes_per_token(kv_cache_dtype: str, cal: Calibration | None = None) -> int:
    """KV cache bytes one token takes on one GPU (MLA latent + indexer, every layer, replicated per TP rank)."""
    model = (cal or load_calibration()).model
    per_layer = model.kv_bytes_per_token_layer
    key = kv_cache_dtype if kv_cache_dtype in per_layer else ("fp8" if kv_cache_dtype.startswith("fp8") else "auto")
    return model.num_layers * (per_layer[key] + model.indexer_bytes_per_token_layer)


def _fixed_gib(model: ModelConstants) -> float:
    return model.non_torch_gib + model.cuda_graphs_gib


def _activations_gib(model: ModelConstants, batched_tokens: int, num_seqs: int) -> float:
    act = model.profiled_activation_kib_per_batched_token * batched_tokens * KIB
    sampler = model.sampler_mib_per_seq * num_seqs * MIB
    return (act + sampler) / GIB


def _weights_total_gib(cal: Calibration) -> float:
    """Weights of the whole model, derived from the first anchor: the budget minus everything but the weights."""
    unit, anchor_engine, model = cal.unit, cal.anchor_engine, cal.model
    first = cal.anchors[0]
    budget = anchor_engine.gpu_memory_utilization * unit.total_gib
    acts = _activations_gib(model, anchor_engine.max_num_batched_tokens, anchor_engine.max_num_seqs)
    # Half a token of slack so that flooring the anchor's own pool gives back exactly the logged count.
    kv = (first.kv_pool_tokens + 0.5) * kv_bytes_per_token(anchor_engine.kv_cache_dtype, cal) / GIB
    return (budget - acts - _fixed_gib(model) - kv) * unit.tensor_parallel


def _mml_bonus_tokens(cal: Calibration, max_model_len: int) -> int:
    """The seed's pool grew by 2,298 tokens from max_model_len 204,800 to 262,144; interpolate, clamp outside."""
    anchors = sorted(cal.anchors, key=lambda a: a.max_model_len)
    lo, hi = anchors[0], anchors[-1]
    base = cal.anchors[0].kv_pool_tokens
    if max_model_len <= lo.max_model_len:
        return lo.kv_pool_tokens - base
    if max_model_len >= hi.max_model_len:
        return hi.kv_pool_tokens - base
    frac = (max_model_len - lo.max_model_len) / (hi.max_model_len - lo.max_model_len)
    return int(lo.kv_pool_tokens + frac * (hi.kv_pool_tokens - lo.kv_pool_tokens)) - base


def _unprofiled_mib_per_batched_token(cal: Calibration) -> float:
    """Memory a full-budget step takes outside the profiled budget, from the seed's OOM line (751.25 MiB free)."""
    unit, anchor_engine, ws = cal.unit, cal.anchor_engine, cal.fused_moe_workspace
    outside_mib = (1.0 - anchor_engine.gpu_memory_utilization) * unit.total_gib * 1024
    return (outside_mib - ws.free_mib_at_anchor) / anchor_engine.max_num_batched_tokens


def is_calibrated(hardware: Hardware, engine: Engine, tensor_parallel: int, cal: Calibration | None = None) -> bool:
    """True when the seed measured this hardware, TP size and KV dtype (otherwise the plan is an estimate)."""
    c = cal or load_calibration()
    unit = c.unit
    return (hardware.family == unit.family and math.isclose(hardware.memory_per_gpu_gib, unit.total_gib)
            and tensor_parallel == unit.tensor_parallel
            and engine.kv_cache_dtype == c.anchor_engine.kv_cache_dtype)


def refusal_message(free_gib: float, total_gib: float, util: float, requested_gib: float) -> str:
    """vLLM 0.33's start-up refusal (reference vllm.md §9.5), as the ``ValueError`` line of the traceback."""
    return (f"ValueError: Free memory on device cuda:0 ({format_gib(free_gib * GIB)}/{format_gib(total_gib * GIB)} "
            f"GiB) on startup is less than desired GPU memory utilization ({util}, {format_gib(requested_gib * GIB)} "
            "GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.")


def too_short_message(max_model_len: int, needed_gib: float, available_gib: float, estimated_max_len: int) -> str:
    """vLLM's refusal when not even one ``max_model_len`` request fits the KV pool (vllm.md §9.5)."""
    return (f"ValueError: To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({format_gib(needed_gib * GIB)} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({format_gib(available_gib * GIB)} GiB). Based on the available memory, the estimated maximum "
            f"model length is {estimated_max_len}. Try increasing `gpu_memory_utilization` (which also controls CPU "
            "memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. "
            "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")


def oom_message(requested_mib: float, total_gib: float, free_mib: float) -> str:
    """The seed's FusedMoE OOM line, with sizes in PyTorch's ``format_size``."""
    return (f"MemoryError: CUDA out of memory. Tried to allocate {format_size(requested_mib * MIB)}. GPU 0 has a "
            f"total capacity of {format_size(total_gib * GIB)} of which {format_size(free_mib * MIB)} is free.")


def plan_memory(hardware: Hardware, engine: Engine, tensor_parallel: int) -> MemoryPlan:
    """Boot and first-step outcome of one engine of ``tensor_parallel`` GPUs with ``engine``'s flags."""
    cal = load_calibration()
    unit, model, ws = cal.unit, cal.model, cal.fused_moe_workspace
    calibrated = is_calibrated(hardware, engine, tensor_parallel, cal)
    total = float(hardware.memory_per_gpu_gib)
    free_startup = total - (unit.total_gib - unit.free_at_startup_gib)
    requested = engine.gpu_memory_utilization * total
    kvb = kv_bytes_per_token(engine.kv_cache_dtype, cal)
    weights = _weights_total_gib(cal) / tensor_parallel
    acts = _activations_gib(model, engine.max_num_batched_tokens, engine.max_num_seqs)
    base = dict(estimate=not calibrated, total_gib=total, free_at_startup_gib=round(free_startup, 4),
                requested_gib=requested, weights_gib=weights, activations_gib=acts,
                cuda_graphs_gib=model.cuda_graphs_gib, kv_bytes_per_token=kvb,
                workspace_mib=ws.requested_mib, max_model_len=engine.max_model_len,
                headroom_gib=total - requested)
    # vLLM compares its budget with the free memory of its start-up snapshot before loading anything.
    if requested > free_startup:
        return MemoryPlan(outcome="startup_refused", kv_pool_tokens=0, max_concurrency=0.0, available_kv_gib=0.0,
                          message=refusal_message(free_startup, total, engine.gpu_memory_utilization, requested),
                          **base)
    available = requested - weights - acts - _fixed_gib(model)
    if available <= 0:
        return MemoryPlan(outcome="no_kv_memory", kv_pool_tokens=0, max_concurrency=0.0,
                          available_kv_gib=round(available, 2), message=f"ValueError: {_NO_CACHE_BLOCKS}", **base)
    pool = int(available * GIB // kvb)
    if calibrated:
        # Only the calibration unit has the measured max_model_len dependence; elsewhere there is no data for it.
        pool += _mml_bonus_tokens(cal, engine.max_model_len)
    blocks = pool // engine.block_size
    concurrency = pool / engine.max_model_len
    if pool < engine.max_model_len:
        estimated_len = blocks * engine.block_size
        msg = too_short_message(engine.max_model_len, engine.max_model_len * kvb / GIB, available, estimated_len)
        return MemoryPlan(outcome="no_kv_memory", kv_pool_tokens=pool, max_concurrency=concurrency,
                          available_kv_gib=round(available, 2), message=msg, num_gpu_blocks=blocks, **base)
    # First large step: the workspace comes out of the memory outside the budget, after the unprofiled activations.
    per_token = _unprofiled_mib_per_batched_token(cal)
    first_free = (total - requested) * 1024 - per_token * engine.max_num_batched_tokens
    oom = first_free < ws.requested_mib
    oom_step = max(1, math.floor(((total - requested) * 1024 - ws.requested_mib) / per_token) + 1)
    return MemoryPlan(outcome="oom_first_step" if oom else "ok", kv_pool_tokens=pool, max_concurrency=concurrency,
                      available_kv_gib=round(available, 2), num_gpu_blocks=blocks,
                      message=oom_message(ws.requested_mib, total, first_free) if oom else None,
                      first_step_free_mib=first_free, oom_step_tokens=oom_step, **base)
