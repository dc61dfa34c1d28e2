"""Real ``dynamo.vllm`` workers in a disaggregated deployment on CPU: prefill -> decode over NIXL/UCX on loopback.
The settings are data (``pytest_ml4/data/dynamo_vllm/disagg.yaml``, each with the evidence that set
it); this module turns them into a worker's arguments and environment, and warms the deployment up once.

Why each setting exists (runs on this 2-core machine, load 30-36): vLLM's ``auto`` OpenMP binding puts both
workers' threads on the same cores and the decode crawled at 0.2 tok/s; a fresh worker's first forward pass and
the first NIXL handshake cost 16-79 s once, which the prefill's 30 s KV lease did not always cover (the
reference's "first-request stall"). Idle, a disaggregated worker's engine still busy-polls NIXL/UCX (0.6 core each,
against 0.01 for an aggregated one), which starved the Dynamo runtime past its 10 s file-discovery lease: the
keys expired and the model vanished (the reference's key expiry). Fewer NIXL threads and a lower priority for
the engine processes than for the Dynamo runtime remove that (docs/decisions/embedded-deployment.md, "Real
disaggregated workers on CPU").
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.runtime.orphans import group_members

if TYPE_CHECKING:
    from pytest_ml4_sim.deploy.worker_plan import WorkerPlan

SETTINGS_FILE = data_file("dynamo_vllm", "disagg.yaml")
ROLES = ("prefill", "decode")


class DisaggError(RuntimeError):
    """The disaggregated deployment did not serve its warm-up request: the message says what came back."""


class RoleSettings(Strict):
    mode: Literal["prefill", "decode"]
    kv_role: Literal["kv_producer", "kv_consumer"]


class WarmUpRequest(Strict):
    prompt: str
    max_tokens: int
    timeout_s: float


class DisaggSettings(Strict):
    """``pytest_ml4/data/dynamo_vllm/disagg.yaml``: the loopback KV transfer's settings (the file says why each)."""

    env: dict[str, str]
    roles: dict[Literal["prefill", "decode"], RoleSettings]
    kv_connector: str
    kv_buffer_device: str
    kv_lease_duration_s: int
    nixl_num_threads: int
    engine_nice: int
    omp_bind_own_core: bool = False
    max_workers_per_role: int
    warm_up: WarmUpRequest


@cache
def settings(path: Path = SETTINGS_FILE) -> DisaggSettings:
    return load_yaml(path, DisaggSettings)


def cap_plan(plan: WorkerPlan) -> WorkerPlan:
    """At most ``max_workers_per_role`` workers per role (one core each: a third worker would share a core again
    and bring back the crawl the own-core binding removed); the plan says why it is smaller."""
    cap = settings().max_workers_per_role
    started = {role: min(n, cap) for role, n in plan.started.items()}
    if started == plan.started:
        return plan
    return replace(plan, started=started, limit=f"{cap} worker per role, one core each (fixtures/dynamo_vllm/"
                                                f"disagg.yaml max_workers_per_role)")


def is_disagg_role(role: str) -> bool:
    return role in ROLES


def worker_args(role: str) -> list[str]:
    """``--disaggregation-mode`` and ``--kv-transfer-config`` of a prefill or decode worker."""
    s = settings()
    spec = s.roles[role]
    config = {"kv_connector": s.kv_connector, "kv_role": spec.kv_role, "kv_buffer_device": s.kv_buffer_device,
              "kv_connector_extra_config": {"kv_lease_duration": s.kv_lease_duration_s,
                                            "num_threads": s.nixl_num_threads}}
    return ["--disaggregation-mode", spec.mode, "--kv-transfer-config", json.dumps(config)]


def worker_env(side_channel_port: int, position: int, cores: int | None = None) -> dict[str, str]:
    """NIXL/UCX loopback settings, the worker's own side-channel port, and (``omp_bind_own_core``) the core its
    OpenMP threads are bound to: the ``position``-th worker of the deployment gets core ``position`` modulo the
    cores this process may use."""
    s = settings()
    env = dict(s.env)
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_channel_port)
    if s.omp_bind_own_core:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(own_core(position, cores))
    return env


def lower_engine_priority(pgid: int, leader: int) -> int:
    """Every thread of the worker's engine processes (its group but the ``dynamo.vllm`` main process, whose Dynamo
    runtime keeps the discovery keys alive and answers the request plane) at ``engine_nice``; returns how many
    threads were changed. Linux keeps a nice value per thread, so each ``/proc/<pid>/task`` entry is set."""
    nice = settings().engine_nice
    changed = 0
    for member in group_members(pgid):
        if member.pid == leader:
            continue
        for task in Path(f"/proc/{member.pid}/task").glob("*"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
            except (OSError, ValueError):   # the thread ended meanwhile
                continue
            changed += 1
    return changed


def own_core(position: int, cores: int | None = None) -> int:
    usable = sorted(os.sched_getaffinity(0)) if cores is None else list(range(cores))
    return usable[position % len(usable)]


@dataclass(frozen=True)
class WarmUp:
    """The warm-up request: how long it took and which workers prefilled and decoded it."""

    seconds: float
    prefill_worker: Any
    decode_worker: Any

    def line(self) -> str:
        return (f"warm-up request prefilled on {self.prefill_worker}, decoded on {self.decode_worker} in "
                f"{self.seconds:.1f} s (first forward passes and the NIXL handshake)")


def warm_up(base_url: str, model: str) -> WarmUp:
    """One request through the frontend, prefilled and decoded on different workers, within the data's limit."""
    spec = settings().warm_up
    body = {"model": model, "messages": [{"role": "user", "content": spec.prompt}],
            "max_tokens": spec.max_tokens, "nvext": {"extra_fields": ["worker_id"]}}
    t0 = time.monotonic()
    try:
        r = httpx.post(base_url.rstrip("/") + "/chat/completions", json=body, timeout=spec.timeout_s)
    except httpx.HTTPError as err:
        raise DisaggError(f"the disaggregated warm-up request to {base_url} got no answer within "
                          f"{spec.timeout_s:g} s: {type(err).__name__}") from None
    took = time.monotonic() - t0
    if r.status_code != 200:
        raise DisaggError(f"the disaggregated warm-up request to {base_url} answered HTTP {r.status_code} after "
                          f"{took:.1f} s: {r.text[:300]}")
    wid = (r.json().get("nvext") or {}).get("worker_id") or {}
    p, d = wid.get("prefill_worker_id"), wid.get("decode_worker_id")
    if p is None or d is None or p == d:
        raise DisaggError(f"the disaggregated warm-up request was not handed from a prefill to a decode worker: "
                          f"nvext.worker_id {wid}")
    return WarmUp(took, p, d)
