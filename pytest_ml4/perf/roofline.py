"""Roofline ESTIMATE: measured decode throughput against a memory-bandwidth bound.

Decode of a memory-bound MoE reads the active weights on every step (seed 000's interpretation: "the NVFP4
weights have to be read on every decode step"), so one sequence cannot decode faster than
``bandwidth of the GPUs of one model replica / bytes of the active weights`` tokens per second (one token per step;
speculative decoding multiplies that by the acceptance length). All inputs are estimates and labelled so:

* active parameters: 52B (seed 000: "Mistral-Large-4-1T-A52B-NVFP4, ~1T total / 52B active"), 54B on the Dynamo
  recipes (seed 002: "1,051B-parameter mixture-of-experts model (54B active)");
* NVFP4 = 4-bit values plus one FP8 scale per 16 values = 4.5 bits per parameter;
* bandwidth: ``target.hardware.memory_bandwidth_tb_s`` (itself a spec-sheet estimate) times the GPUs of one
  replica (``topology.tensor_parallel``); a target that does not give it has no roofline (``None``: reported as
  not computed, never gated);
* KV-cache reads, activations and interconnect traffic are ignored, so the real bound is lower.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pytest_ml4.target.model import Target

NVFP4_BITS_PER_PARAM = 4.5
ACTIVE_PARAMS_SEED000 = 52e9
ACTIVE_PARAMS_SEED002 = 54e9
LABEL = "ESTIMATE (memory-bandwidth roofline; ignores KV reads, activations, interconnect)"


@dataclass(frozen=True)
class Roofline:
    label: str
    active_params: float
    bits_per_param: float
    replica_gpus: int
    bandwidth_tb_s: float          # of one replica
    bytes_per_step: float
    steps_per_s_bound: float       # = tokens/s/user bound without speculative decoding
    measured_tok_s_user: float | None
    measured_at_concurrency: int | None
    pct_of_bound: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        head = (f"{self.label}: {self.active_params / 1e9:.0f}B active x {self.bits_per_param} bit over "
                f"{self.replica_gpus} GPU(s) at {self.bandwidth_tb_s:.1f} TB/s -> bound "
                f"{self.steps_per_s_bound:.0f} decode steps/s per sequence")
        if self.pct_of_bound is None:
            return head
        return (head + f"; measured {self.measured_tok_s_user:.1f} tok/s/user at c{self.measured_at_concurrency} "
                f"= {self.pct_of_bound:.0%} of the bound")


def active_params(target: Target) -> float:
    return ACTIVE_PARAMS_SEED000 if target.hardware.family == "rtxpro" else ACTIVE_PARAMS_SEED002


def roofline(target: Target, measured_tok_s_user: float | None = None,
             concurrency: int | None = None) -> Roofline | None:
    """The bound for ``target`` and, when given, the measured single-sequence decode rate as a share of it; None
    when the target does not give ``hardware.memory_bandwidth_tb_s``."""
    if target.hardware.memory_bandwidth_tb_s is None:
        return None
    gpus = target.topology.tensor_parallel
    bw = target.hardware.memory_bandwidth_tb_s * gpus
    params = active_params(target)
    bytes_per_step = params * NVFP4_BITS_PER_PARAM / 8
    bound = bw * 1e12 / bytes_per_step
    pct = None if measured_tok_s_user is None else measured_tok_s_user / bound
    return Roofline(label=LABEL, active_params=params, bits_per_param=NVFP4_BITS_PER_PARAM, replica_gpus=gpus,
                    bandwidth_tb_s=bw, bytes_per_step=bytes_per_step, steps_per_s_bound=bound,
                    measured_tok_s_user=measured_tok_s_user, measured_at_concurrency=concurrency,
                    pct_of_bound=pct)
