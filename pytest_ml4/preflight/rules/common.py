"""Helpers the rule modules share: walking every engine launch with its environment and target engine."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pytest_ml4.preflight.model import (
    DgdComponent,
    DgdDocument,
    Document,
    EngineArgs,
    LintContext,
    VllmLaunch,
)
from pytest_ml4.target.model import Engine

#: vLLM's default --gpu-memory-utilization since 0.22 (reference vllm.md §8: "0.9 (<= 0.19) -> 0.92 (0.22+)").
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
#: vLLM's default --max-num-batched-tokens for the OpenAI server on a GPU of >= 70 GiB (estimate: vLLM's
#: usage-context defaults, not in the reference); the seed's crashing config used exactly this value.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass
class EngineSite:
    """One engine launch: where it is, its flags and environment, and the target's engine for its role."""

    doc: Document
    args: EngineArgs
    env: dict[str, str]
    role: str
    where: str
    line: int | None
    component: DgdComponent | None = None

    def base_engine(self) -> Engine | None:
        target = self.doc.target
        if target is None:
            return None
        if self.role == "prefill" and target.prefill_engine is not None:
            return target.prefill_engine
        return target.engine

    def tensor_parallel(self) -> int | None:
        value = self.args.number("tensor-parallel-size")
        if value is not None:
            return int(value)
        return self.doc.target.topology.tensor_parallel if self.doc.target else None

    def util(self) -> float:
        value = self.args.number("gpu-memory-utilization")
        return DEFAULT_GPU_MEMORY_UTILIZATION if value is None else value

    def batched_tokens(self) -> int:
        value = self.args.number("max-num-batched-tokens")
        return DEFAULT_MAX_NUM_BATCHED_TOKENS if value is None else int(value)


def engine_sites(ctx: LintContext) -> Iterator[EngineSite]:
    for doc in ctx.documents:
        if isinstance(doc, VllmLaunch):
            yield EngineSite(doc=doc, args=doc.engine, env=doc.env, role="single", where="vllm serve",
                             line=doc.engine.line)
        elif isinstance(doc, DgdDocument):
            for comp in doc.components:
                if comp.engine is not None:
                    yield EngineSite(doc=doc, args=comp.engine, env=comp.env, role=comp.role,
                                     where=f"{doc.name}/{comp.name} ({comp.role})", line=comp.line, component=comp)


def truthy(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    return str(value).strip().lower() in ("1", "true", "yes", "y", "on")
