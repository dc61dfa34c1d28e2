"""The embedded Dynamo deployment: the REAL ``python -m dynamo.frontend`` (public Dynamo 1.6.1) in front of one
Dynamo worker process per worker of the target, of one of two kinds: :class:`DynamoSim`'s simulated workers (real
Dynamo Python workers, :mod:`pytest_ml4_sim.sim.dynamo_worker`, built on the project's simulated engine) or
:class:`~pytest_ml4_sim.deploy.real_dynamo.RealDynamoDeployment`'s real ``dynamo.vllm`` workers.

Everything a Dynamo deployment does between the client and the engine is Dynamo's own: routing (KV, session
affinity), discovery, migration, the stale-instance window after a kill, draining on SIGTERM, request validation
and error bodies, tool/reasoning parsing (shared/reference/real-dynamo.md). Where 1.6.1 differs from the seed's
image, :mod:`pytest_ml4_sim.sim.dynamo_bridge` decides (the one place).

No external service runs: discovery is Dynamo's file backend under the deployment's folder, the request plane is
TCP and the event plane ZMQ, every socket on 127.0.0.1, ``HOME`` (Dynamo caches model cards in
``$HOME/.cache/dynamo``) inside the folder and ``HF_HUB_OFFLINE=1``. Dynamo runs from its own venv
(``scripts/install.d/50-dynamo.sh``, located by :func:`pytest_ml4.runtime.installed.dynamo_python`); the workers import the
checkout through ``PYTHONPATH``.

Handles: :class:`DynamoDeployment`, the base of both kinds, is an :class:`~pytest_ml4_sim.deploy.launcher.Engine`
(``url``/``pid`` = the frontend or the gateway in front of it, ``log_file`` = the first decode/agg worker's engine
log; ``frontend_log``), with ``.workers`` (:class:`DynamoWorker`: role, index, instance_id, system port /
``metrics_url``, stop/start/restart/alive), ``.frontend`` (:class:`FrontendProcess`) and ``.gateway``; the restart
hooks (``recover``, ``crash_busy_worker``, ``migration_evidence``) and ``supervised`` are what the plugin and the
fake Kubernetes API use, whatever the workers' kind. Each process is a
:class:`~pytest_ml4_sim.deploy.launcher.ProcessLauncher`.
"""

from __future__ import annotations

import abc
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import httpx

from pytest_ml4.locations import PACKAGE_PARENT
from pytest_ml4.runtime.orphans import Leftover, end_group
from pytest_ml4.target.model import Target
from pytest_ml4_sim import HARNESS_PARENT
from pytest_ml4_sim.deploy.gateway import gateway_faults
from pytest_ml4_sim.deploy.launcher import (
    PROGRESS_CAP_FACTOR,
    Engine,
    LaunchError,
    ProcessLauncher,
    file_sizes,
    free_port,
    port_free,
    tail,
    wait_until_healthy,
)
from pytest_ml4_sim.deploy.simulator import SimServer, _flatten
from pytest_ml4_sim.sim.dynamo_bridge import PUBLIC_VERSION, behaviour
from pytest_ml4_sim.sim.faults import ActiveFaults

if TYPE_CHECKING:
    from pytest_ml4.control.crash import Crash

#: ``serving.dynamo_router`` -> the frontend's ``--router-mode``.
ROUTER_MODES = {"kv": "kv", "round_robin": "round-robin", "random": "random", None: "round-robin"}
#: Session-affinity TTL when the target asks for affinity (the seed's manifests: 3600 s, itself an estimate).
SESSION_AFFINITY_TTL_S = 3600
#: Loopback-only, no etcd/NATS (real-dynamo.md "Run time").
LOOPBACK_ENV = {"DYN_DISCOVERY_BACKEND": "file", "DYN_REQUEST_PLANE": "tcp", "DYN_EVENT_PLANE": "zmq",
                "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
                "DYN_EVENT_PLANE_HOST": "127.0.0.1", "DYN_HTTP_RPC_HOST": "127.0.0.1",
                "DYN_SYSTEM_HOST": "127.0.0.1", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "DYN_SDK_DISABLE_ANSI_LOGGING": "1",
                "PYTHONUNBUFFERED": "1"}
POLL_S = 0.1
STOP_TIMEOUT_S = 15.0
#: A killed worker back and the deployment serving (a real dynamo.vllm worker boots in 35-140 s here).
RECOVER_TIMEOUT_S = 240.0


class DynamoStartError(LaunchError):
    """A frontend or worker did not start: the message carries the command and its log tail."""


#: Dynamo 1.6.1 reads ``DYN_SYSTEM_PORT`` as an i16: a worker's system port must be below 32768.
SYSTEM_PORT_RANGE = (20000, 32767)


def free_system_port() -> int:
    """A free loopback port that Dynamo accepts as ``DYN_SYSTEM_PORT`` (the OS hands out ports above 32767)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(*SYSTEM_PORT_RANGE)
        if port_free(port):
            return port
    raise DynamoStartError(f"no free port in {SYSTEM_PORT_RANGE} for a Dynamo worker's system server")


@dataclass(frozen=True)
class KillRecord:
    """One end of a process: how (``SIGKILL``, ``stop``), when (wall clock), the processes its group still held
    once the main process was gone (ended with SIGKILL) and any that outlived that."""

    process: str
    pid: int
    how: str
    wall: float
    leftovers: list[Leftover]
    surviving: list[Leftover]

    def line(self) -> str:
        left = ", ".join(p.line() for p in self.leftovers) or "none"
        return f"{self.how} of {self.process} (pid {self.pid}): processes left in its group: {left}" + \
            (" (ended with SIGKILL)" if self.leftovers else "")

    def as_dict(self) -> dict[str, Any]:
        return {"process": self.process, "pid": self.pid, "how": self.how, "wall": self.wall,
                "leftovers": [vars(p) for p in self.leftovers], "surviving": [vars(p) for p in self.surviving]}


class DynamoProcess(ProcessLauncher):
    """One process of the deployment. It keeps its port across restarts unless something took it meanwhile; a
    stop SIGTERMs it alone (Dynamo deregisters and drains) and what it left in its group is recorded; a
    :meth:`kill` is a crashed pod's end."""

    error = DynamoStartError
    stop_timeout = STOP_TIMEOUT_S
    stop_leader_only = True
    poll_s = POLL_S

    def __init__(self, log_file: Path, env: Mapping[str, str], cwd: Path, *, port: int = 0) -> None:
        super().__init__(log_file, cwd=cwd, port=port)
        self.port = port or self.any_free_port()
        self._env = dict(env)
        #: Every kill or stop that left processes behind (the report names them).
        self.kills: list[KillRecord] = []

    def any_free_port(self) -> int:
        return free_port()

    def choose_port(self) -> int:
        """The port it had, unless busy (another run, a leftover): then another free one."""
        return self.port if port_free(self.port) else self.any_free_port()

    def child_env(self) -> dict[str, str]:
        return dict(self._env)

    def missing(self) -> str:
        return f"{self.health_url} answering 200"

    def leader_gone(self, pgid: int) -> None:
        """What the stopped process left in its group is recorded (:meth:`end_leftovers`)."""
        self.end_leftovers(pgid, "stop")

    def kill(self) -> KillRecord | None:
        """SIGKILL, no deregistration (a crashed pod): the frontend keeps the instance listed for a while. The
        processes the main one spawned survive it (real ``dynamo.vllm``'s EngineCore and Worker): they are found
        and ended as a kubelet ending the container would, and the record says they were there."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return None
        proc.kill()
        proc.wait(5)
        return self.end_leftovers(proc.pid, "SIGKILL")

    def end_leftovers(self, pgid: int, how: str) -> KillRecord:
        """End the processes still alive in the (dead) main process's group; recorded in :attr:`kills`."""
        found, surviving = end_group(pgid)
        record = KillRecord(self.name, pgid, how, time.time(), found, surviving)
        if found:
            self.kills.append(record)
        if surviving:
            raise DynamoStartError(f"{self.name}: processes of group {pgid} survive SIGKILL: "
                                   f"{', '.join(p.line() for p in surviving)}")
        return record


class FrontendProcess(DynamoProcess):
    """``python -m dynamo.frontend`` configured from the target (router mode, session affinity, migration)."""

    name = "dynamo.frontend"

    def __init__(self, target: Target, python: Path, log_file: Path, env: Mapping[str, str], cwd: Path, *,
                 port: int = 0, migration_limit: int | None = None) -> None:
        super().__init__(log_file, env, cwd, port=port)
        self.target, self.python = target, python
        limit = migration_limit if migration_limit is not None else target.serving.migration_limit
        self.migration_limit = int(limit or 0)

    def argv(self) -> list[str]:
        s = self.target.serving
        cmd = [str(self.python), "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(self.port),
               "--router-mode", ROUTER_MODES[s.dynamo_router]]
        if s.session_affinity:
            cmd += ["--router-session-affinity-ttl-secs", str(SESSION_AFFINITY_TTL_S)]
        if s.conditional_disagg:
            cmd.append("--router-conditional-disagg")
        if self.migration_limit:
            cmd += ["--migration-limit", str(self.migration_limit)]
        return cmd

    @property
    def health_url(self) -> str:
        return self.url + "/live"


class GatewayProcess(DynamoProcess):
    """The faulty ingress in front of the frontend (:mod:`pytest_ml4_sim.deploy.gateway`), started only for its faults."""

    name = "ml4 fault gateway"

    def __init__(self, frontend: FrontendProcess, served_model: str, faults: Sequence[str], log_file: Path,
                 env: Mapping[str, str], cwd: Path) -> None:
        super().__init__(log_file, env, cwd)
        self.frontend, self.served_model, self.faults = frontend, served_model, list(faults)

    def argv(self) -> list[str]:
        # The checkout's own interpreter (aiohttp), not Dynamo's venv: the gateway is no part of Dynamo.
        cmd = [sys.executable, "-m", "pytest_ml4_sim.deploy.gateway", "--upstream", self.frontend.url,
               "--port", str(self.port), "--served-model", self.served_model]
        for f in self.faults:
            cmd += ["--fault", f]
        return cmd

    @property
    def health_url(self) -> str:
        return self.url + "/live"   # forwarded to the frontend: the gateway serves once both answer


class DynamoWorker(DynamoProcess):
    """One Dynamo worker process (agg ``worker``, ``prefill`` or ``decode``) of a :class:`DynamoDeployment`, whatever
    its engine: a kind implements :meth:`argv`, :meth:`ready` and :meth:`missing` (how it starts and how its
    instance id is learnt)."""

    def __init__(self, owner: DynamoDeployment, role: str, index: int, log_file: Path, target_file: Path,
                 overrides: list[str], faults: Sequence[str]) -> None:
        super().__init__(log_file, owner.env, owner.folder)
        self.owner, self.role, self.index = owner, role, index
        self.name = f"Dynamo {role} worker #{index}"
        self.target_file, self.overrides, self.faults = target_file, overrides, list(faults)
        self.instance_id: int | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.role}#{self.index}, id={self.instance_id}, pid={self.pid})"

    def any_free_port(self) -> int:
        """Its port is the system server's (``/health``, ``/metrics`` with the ``vllm:*`` series)."""
        return free_system_port()

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    @property
    def pre_stop_s(self) -> float:
        """Seconds a stop for a restart waits before SIGTERM while the worker keeps serving (fault ``delayed_stop``:
        a pod's preStop hook or termination delay; the same fault as ``SimServer.restart``'s stop delay)."""
        from pytest_ml4_sim.deploy.sim_cli import target_faults

        return ActiveFaults([*target_faults(self.owner.target), *self.faults]).value("delayed_stop", 0.0)

    def restart(self, timeout: float | None = None) -> Self:
        if self.alive():  # as the kubelet: a dead container has no preStop to run
            time.sleep(self.pre_stop_s)
        return super().restart(timeout)

    def before_start(self) -> None:
        self.instance_id = None

    def child_env(self) -> dict[str, str]:
        return {**self._env, "DYN_SYSTEM_PORT": str(self.port)}


class SimDynamoWorker(DynamoWorker):
    """A Dynamo Python worker on the simulated engine (:mod:`pytest_ml4_sim.deploy.dynamo_worker_cli`); it writes
    its instance id to a file once registered."""

    def __init__(self, owner: DynamoDeployment, role: str, index: int, log_file: Path, target_file: Path,
                 overrides: list[str], faults: Sequence[str]) -> None:
        super().__init__(owner, role, index, log_file, target_file, overrides, faults)
        self.id_file = log_file.with_suffix(".instance")
        #: Boots of this worker before the current one (0: the first start): a pod replacement or an in-place
        #: restart boots the next generation; the faults that break only a restarted engine read it.
        self.generation = -1

    def missing(self) -> str:
        if self.instance_id is None:
            return f"its instance id (file {self.id_file}: not written yet)"
        return f"status 'ready' on {self.health_url}"

    def before_start(self) -> None:
        super().before_start()
        self.generation += 1
        self.id_file.unlink(missing_ok=True)

    def argv(self) -> list[str]:
        cmd = [str(self.owner.python), "-m", "pytest_ml4_sim.deploy.dynamo_worker_cli", "--target", str(self.target_file),
               "--role", self.role, "--model-dir", str(self.owner.model_dir), "--log-file", str(self.log_file),
               "--id-file", str(self.id_file), "--generation", str(self.generation), "--index", str(self.index)]
        for expr in self.overrides:
            cmd += ["--set", expr]
        for f in self.faults:
            cmd += ["--fault", f]
        if not self.owner.bridge:
            cmd.append("--no-bridge")
        return cmd

    def ready(self) -> bool:
        if self.instance_id is None:
            try:
                self.instance_id = int(self.id_file.read_text().strip())
            except (OSError, ValueError):
                return False
        try:
            return httpx.get(self.health_url, timeout=1.0).json().get("status") == "ready"
        except (httpx.HTTPError, ValueError):
            return False


def started_workers(declared: int, faults: Sequence[str], role: str = "worker") -> int:
    """How many workers of a role start: the declared count less its fault's (``workers_down`` for aggregated
    workers, ``prefill_workers_down``/``decode_workers_down``); at least one, so the deployment still serves and
    the check that counts /health's instances is what fails."""
    fault = "workers_down" if role == "worker" else f"{role}_workers_down"
    down = ActiveFaults(faults).value(fault, 0.0)
    return max(1, declared - int(down))


def refuse_idle_only_worker(faults: Sequence[str], roles: Sequence[tuple[str, Any]]) -> None:
    """``only_worker=K`` must name a worker that starts: a fault acting on none would kill nothing."""
    active = ActiveFaults(faults)
    if not active.has("only_worker"):
        return
    k = int(active.value("only_worker"))
    counts = {role: sum(1 for r, _ in roles if r == role) for role, _ in roles}
    if k < 0 or k >= max(counts.values()):
        raise DynamoStartError(f"fault only_worker={k}: no such worker; the deployment starts "
                         + ", ".join(f"{n} {'aggregated' if role == 'worker' else role} worker(s)"
                                     for role, n in counts.items())
                         + " (K counts a role's workers from 0 in start order)")


class DynamoDeployment(Engine, abc.ABC):
    """An embedded Dynamo deployment (the :class:`~pytest_ml4_sim.deploy.launcher.Engine` the suites see) and its
    processes: the frontend, the workers, the fault gateway. A kind sets :attr:`worker_class` and
    :attr:`restart_timeout_s` and says which Dynamo install runs it (:meth:`_tools`)."""

    #: The worker process class of the kind.
    worker_class: type[DynamoWorker]
    #: How long a restart may take to serve again (real dynamo.vllm workers need minutes here).
    restart_timeout_s: float

    def __init__(self, target: Target, *, port: int = 0, faults: Sequence[str] = (),
                 overrides: dict[str, Any] | None = None, log_file: Path | str | None = None,
                 env: Mapping[str, str] | None = None, migration_limit: int | None = None,
                 prefill_workers: int | None = None, decode_workers: int | None = None,
                 agg_workers: int | None = None, bridge: bool = True) -> None:
        if not target.is_dynamo:
            raise ValueError(f"target {target.name} is not served by Dynamo ({target.serving.stack})")
        self.python, self.model_dir = self._tools()
        self.target, self.bridge = target, bridge
        self.log_file = Path(log_file) if log_file else Path(os.environ.get("TMPDIR", "/tmp")) / \
            f"ml4-dynamo-{os.getpid()}-{os.urandom(3).hex()}" / "engine.log"
        self.folder = self.log_file.parent.resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.frontend_log = self.folder / "frontend.log"
        self.env = self._environment(env)
        # The workers get exactly this Target object (in-memory overrides included) as a YAML file.
        target_file = Path(SimServer._materialise(target, self.folder / "target.yaml"))
        over = _flatten("", overrides or {})
        roles: list[tuple[str, list[str]]] = []
        if target.topology.kind == "disagg":
            prefill_over = list(over)
            if target.prefill_engine is not None:
                prefill_over = _flatten("engine", target.prefill_engine.model_dump(mode="json")) + over
            roles += [("prefill", prefill_over)] * started_workers(
                prefill_workers or target.topology.prefill_workers, faults, "prefill")
            roles += [("decode", over)] * started_workers(
                decode_workers or target.topology.decode_workers, faults, "decode")
        else:
            roles += [("worker", over)] * started_workers(agg_workers or target.topology.workers, faults)
        refuse_idle_only_worker(faults, roles)
        primary = "decode" if target.topology.kind == "disagg" else "worker"
        self.workers: list[DynamoWorker] = []
        counts: dict[str, int] = {}
        for role, role_over in roles:
            i = counts[role] = counts.get(role, -1) + 1
            log = self.log_file if (role, i) == (primary, 0) else self.folder / f"{role}-{i}.log"
            self.workers.append(self.worker_class(self, role, i, log, target_file, role_over, faults))
        self.frontend = FrontendProcess(target, self.python, self.frontend_log, self.env, self.folder, port=port,
                                        migration_limit=migration_limit)
        # Faults of the HTTP layer in front of Dynamo: the endpoint then points at the gateway, never otherwise.
        at_gateway = gateway_faults(faults)
        self.gateway = GatewayProcess(self.frontend, target.serving.served_model_name, at_gateway,
                                      self.folder / "gateway.log", self.env, self.folder) if at_gateway else None
        self.lock = threading.RLock()
        #: True while something else restarts workers that die (the fake Kubernetes API's kubelet watchdog):
        #: :meth:`recover` then waits for it instead of starting a second process.
        self.supervised = False

    @abc.abstractmethod
    def _tools(self) -> tuple[Path, Path]:
        """(Python of the Dynamo venv, model dir) the frontend and the workers run with."""

    def _environment(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        base = dict(os.environ if extra is None else extra)
        home = self.folder / "home"
        kv = self.folder / "discovery"
        home.mkdir(exist_ok=True)
        kv.mkdir(exist_ok=True)
        path = [str(PACKAGE_PARENT), str(HARNESS_PARENT), *[p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]]
        env = {**base, **LOOPBACK_ENV, "HOME": str(home), "DYN_FILE_KV": str(kv),
               "PYTHONPATH": os.pathsep.join(path), **behaviour(self.bridge).frontend_env}
        env.pop("VIRTUAL_ENV", None)
        return env

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target.name}, frontend={self.frontend.url}, workers={len(self.workers)})"

    # -- the Engine interface
    @property
    def url(self) -> str:
        """The fault gateway when one runs, else the frontend."""
        return self.gateway.url if self.gateway is not None else self.frontend.url

    @property
    def pid(self) -> int | None:
        return self.frontend.pid

    def info(self) -> dict[str, Any]:
        """What served the run, for the run's logs and ``summary.json``."""
        return {"frontend": {"command": self.frontend.command, "dynamo_version": PUBLIC_VERSION,
                             "pid": self.frontend.pid, "log": str(self.frontend_log)},
                "bridge": self.bridge,
                "gateway": None if self.gateway is None else {"faults": self.gateway.faults, "url": self.gateway.url,
                                                              "pid": self.gateway.pid, "log": str(self.gateway.log_file)},
                "workers": [{"role": w.role, "instance_id": w.instance_id, "pid": w.pid, "metrics_url": w.metrics_url,
                             "log": str(w.log_file)} for w in self.workers],
                "leftover_processes": [k.as_dict() for k in self.kill_records()]}

    @property
    def worker_metrics_urls(self) -> dict[str, tuple[str, ...]]:
        """role -> the workers' ``/metrics`` URLs (``Endpoint.worker_metrics_urls``)."""
        out: dict[str, list[str]] = {}
        for w in self.workers:
            out.setdefault(w.role, []).append(w.metrics_url)
        return {role: tuple(urls) for role, urls in out.items()}

    def start(self, timeout: float = 120.0) -> Self:
        """Start every process; each step waits while its logs grow (``timeout`` without progress fails it), all
        of them together at most ``PROGRESS_CAP_FACTOR`` x ``timeout``: a fixed overall deadline mostly spent by
        slow workers on a loaded machine left the frontend too little."""
        cap = time.monotonic() + timeout * PROGRESS_CAP_FACTOR
        try:
            self.frontend.spawn()
            self.frontend.wait_ready(timeout, cap)
            for w in self.workers:       # boots overlap: spawn all, then wait for each
                w.spawn()
            for w in self.workers:
                w.wait_ready(timeout, cap)
            self.wait_serving(timeout, cap)
            if self.gateway is not None:
                self.gateway.spawn()
                self.gateway.wait_ready(timeout, cap)
        except BaseException:
            self.stop()     # processes already up must not outlive a failed start
            raise
        return self

    def serving_state(self) -> tuple[bool, str]:
        """(model listed and ``/health`` lists exactly the running workers' instances, what is still missing)."""
        gaps = self.serving_gaps()
        return not gaps, gaps

    def serving_gaps(self) -> str:
        """What keeps the deployment from serving ("" when nothing): the model unlisted, workers not registered,
        instances of stopped workers still listed."""
        try:
            # The frontend itself: a gateway fault (model_unlisted) must not make the deployment look unready.
            h = httpx.get(self.frontend.url + "/health", timeout=2.0).json()
            m = httpx.get(self.frontend.url + "/v1/models", timeout=2.0).json()
        except (httpx.HTTPError, ValueError) as err:
            return f"the frontend's /health and /v1/models ({type(err).__name__})"
        listed = {int(i.get("instance_id", 0)) for i in h.get("instances", [])}
        running = {w.instance_id: f"{w.role}#{w.index}" for w in self.workers if w.alive()}
        gaps = []
        if not any(d.get("id") == self.target.serving.served_model_name for d in m.get("data", [])):
            gaps.append(f"model {self.target.serving.served_model_name} in /v1/models")
        if not running:
            gaps.append("a running worker")
        unregistered = [name for iid, name in running.items() if iid not in listed]
        if unregistered:
            gaps.append(f"workers registered in /health: {', '.join(unregistered)}")
        # Equal, not a subset: a killed worker's instance stays listed for a while (Dynamo's stale-instance
        # window); the deployment has settled once only the running workers are listed.
        stale = sorted(listed - set(running))
        if stale:
            gaps.append(f"stale instances {stale} gone from /health")
        return "; ".join(gaps)

    def wait_serving(self, timeout: float, cap: float | None = None) -> None:
        """Until the model is listed and ``/health`` lists every running worker (real-dynamo.md: ``/health`` alone
        says healthy with zero workers), while that state or the logs change (``timeout`` without change fails)."""
        logs = [self.frontend_log, *(w.log_file for w in self.workers)]
        wait_until_healthy(lambda: self.frontend.proc, lambda: not self.serving_gaps(), what="Dynamo deployment",
                           url=self.frontend.url + "/health", timeout=timeout, error=DynamoStartError,
                           cleanup=lambda: None, poll_s=POLL_S, deadline=cap, missing=self.serving_gaps,
                           progress=lambda: (self.serving_gaps(), file_sizes(*logs)),
                           details=lambda: f"  frontend log {self.frontend_log}, tail:\n{tail(self.frontend_log, 30)}")

    def stop(self) -> None:
        """Stop every worker, then the frontend; one that fails to stop does not keep the others running."""
        errors: list[BaseException] = []
        procs: list[DynamoProcess] = [*self.workers, self.frontend, *([self.gateway] if self.gateway else [])]
        for proc in procs:
            proc.signal(signal.SIGTERM)  # all drain at once rather than one after another
        for proc in procs:
            try:
                proc.stop()
            except Exception as err:  # noqa: BLE001 - collected and re-raised after the others are stopped
                errors.append(err)
        if errors:
            raise errors[0]

    def restart(self) -> None:
        """Restart every worker (one at a time, like a rolling pod deletion) and wait until serving again."""
        for w in self.workers:
            w.restart()
        self.wait_serving(self.restart_timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- a crash (pytest_ml4.control.crash.Crasher)
    def busy_worker(self, settle_s: float = 5.0) -> DynamoWorker:
        """The one worker whose engine runs a request now (its own ``vllm:num_requests_running``). A lone live
        worker is the one serving. The gauge is refreshed by the engine's stats loop, not per token, so it is
        polled for up to ``settle_s`` before the crash is given up as not judged."""
        from pytest_ml4.checks.verdict import NotJudged
        from pytest_ml4.evidence.metrics import scrape

        alive = [w for w in self.workers if w.alive()]
        if len(alive) == 1:
            return alive[0]
        deadline = time.monotonic() + settle_s
        while True:
            busy = [w for w in alive if scrape(w.metrics_url).sum("vllm:num_requests_running") > 0]
            if len(busy) == 1:
                return busy[0]
            if time.monotonic() >= deadline:
                raise NotJudged(f"{len(busy)} workers report vllm:num_requests_running > 0 ({busy}): the worker "
                                f"serving the stream cannot be told (another request running?)")
            time.sleep(0.2)

    def crash_busy_worker(self) -> Crash:
        """SIGKILL the worker serving the running request; its leftover processes are found and ended."""
        from pytest_ml4.control.crash import Crash

        victim = self.busy_worker()
        instance, pid = victim.instance_id, victim.pid
        record = victim.kill()
        return Crash(victim.name, instance, pid, [p.line() for p in (record.leftovers if record else [])],
                     record.wall if record else time.time())

    def migration_evidence(self, instance_id: Any) -> str | None:
        """The frontend's "migration retry" log line off ``instance_id`` (its span fields), or None."""
        mark = f"migration.from_worker_id={instance_id}"
        try:
            lines = self.frontend_log.read_text(errors="replace").splitlines()
        except OSError:
            return None
        line = next((x for x in lines if mark in x and "migration.is_retry=true" in x), None)
        return None if line is None else line[line.find("request_span:"):][:400]

    def recover(self, timeout: float = RECOVER_TIMEOUT_S) -> None:
        """Bring a killed worker back and wait until the deployment serves: started here, or, when a supervisor
        restarts dead processes (:attr:`supervised`, the fake kubelet of ``--sim`` runs), waited for."""
        deadline = time.monotonic() + timeout
        for w in self.workers:
            if self.supervised:
                while not w.alive() and time.monotonic() < deadline:
                    time.sleep(POLL_S)
            elif not w.alive():
                w.start(timeout=max(5.0, deadline - time.monotonic()))
        self.wait_serving(max(5.0, deadline - time.monotonic()))

    def kill_records(self) -> list[KillRecord]:
        """Every kill or stop of this deployment's processes that left processes behind."""
        return [k for p in (*self.workers, self.frontend) for k in p.kills]

    def workers_of(self, role: str) -> list[DynamoWorker]:
        return [w for w in self.workers if w.role == role]

    def worker_by_id(self, instance_id: int) -> DynamoWorker | None:
        return next((w for w in self.workers if w.instance_id == instance_id), None)


class DynamoSim(DynamoDeployment):
    """The embedded Dynamo deployment with simulated workers (:class:`SimDynamoWorker`), from the Dynamo venv."""

    worker_class = SimDynamoWorker
    restart_timeout_s = 60.0

    def _tools(self) -> tuple[Path, Path]:
        from pytest_ml4.runtime.installed import dynamo_model_dir, dynamo_python

        return dynamo_python(), dynamo_model_dir()
