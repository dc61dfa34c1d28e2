"""How many real ``dynamo.vllm`` workers per role start here, against what the target declares.

Its own module so that the disaggregated settings (:mod:`pytest_ml4_sim.deploy.real_dynamo_disagg`) can cap a plan
without importing the deployment that uses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pytest_ml4.target.model import Target
from pytest_ml4_sim.deploy.dynamo import DynamoStartError

#: Resident memory of one worker (main 0.83 + EngineCore 0.77 + Worker 2.1 GiB incl. its 1 GiB KV cache), and
#: what stays free for the frontend, the suites and the machine (real-dynamo-vllm.md "Run").
WORKER_GIB = 3.7
RESERVE_GIB = 2.0


@dataclass(frozen=True)
class WorkerPlan:
    """How many real workers per role start, against what the target declares."""

    declared: dict[str, int]
    started: dict[str, int]
    available_gib: float
    #: What the deployment was reduced to fit (the memory, or the disaggregated workers' one core each).
    limit: str = "the memory here"

    @property
    def reduced(self) -> bool:
        return self.started != self.declared

    def note(self) -> str | None:
        """One line for the report when the deployment is smaller than the target, else None."""
        if not self.reduced:
            return None
        parts = ", ".join(f"{role} {self.started[role]} of {n}" for role, n in self.declared.items())
        return (f"reduced to {self.limit}: {parts} real dynamo.vllm workers ({WORKER_GIB} GiB each, "
                f"{self.available_gib:.1f} GiB available)")


def declared_workers(target: Target) -> dict[str, int]:
    """role -> the worker count the target declares (``worker`` for aggregated, ``prefill``/``decode``)."""
    topo = target.topology
    if topo.kind == "disagg":
        return {"prefill": topo.prefill_workers, "decode": topo.decode_workers}
    return {"worker": topo.workers}


def plan_workers(declared: Mapping[str, int], free_gib: float) -> WorkerPlan:
    """Fit ``declared`` into ``free_gib`` (less the reserve): the role with most workers gives one up until the
    rest fits. DynamoStartError (one line) when even one worker per role does not fit."""
    started = dict(declared)
    budget = free_gib - RESERVE_GIB
    while sum(started.values()) * WORKER_GIB > budget:
        role = max(started, key=lambda r: started[r])
        if started[role] <= 1:
            need = len(started) * WORKER_GIB + RESERVE_GIB
            raise DynamoStartError(f"not enough memory for real dynamo.vllm workers: {len(started)} worker(s) "
                                   f"({', '.join(started)}) need {need:.1f} GiB ({WORKER_GIB} GiB each + "
                                   f"{RESERVE_GIB} GiB reserve), MemAvailable is {free_gib:.1f} GiB")
        started[role] -= 1
    return WorkerPlan(dict(declared), started, round(free_gib, 1))
