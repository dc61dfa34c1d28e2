"""The ``--sim`` deployment behind one interface: start it, describe it, attach to it from an xdist worker, stop it.

The kind (the simulator, real vLLM, the Dynamo frontend with simulated or real ``dynamo.vllm`` workers, and a real
LiteLLM proxy in front for targets served behind one) follows from the target and :class:`Settings`; the caller
(the pytest plugin, a benchmark) knows none of them. What an xdist worker needs travels as :class:`Description`
(plain data, so execnet can carry it), and a worker's :func:`attach` gives the same view without owning anything.
Every start failure is one :class:`DeploymentFailed` line (the command and log tail of what failed).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_ml4.target.model import Target
from pytest_ml4_sim.deploy.launcher import Engine

if TYPE_CHECKING:
    from pytest_ml4_sim.deploy.dynamo import DynamoSim

#: The engines ``--sim`` can run: the project's simulated engine, or real vLLM on the CPU.
ENGINES = ("sim", "vllm")
#: Start timeouts when none is given: the simulator needs seconds, real vLLM and real dynamo.vllm minutes here.
DEFAULT_START_S = {"sim": 60.0, "vllm": 600.0}


class DeploymentFailed(RuntimeError):
    """The deployment did not start; the message is the one line (plus log tail) a run prints."""


class Proxy(Protocol):
    """The proxy in front of the engine (the LiteLLM process, or a worker's :class:`ProxyView` of it)."""

    url: str
    base_url: str
    pid: int | None
    num_retries: int


@dataclass(frozen=True)
class Settings:
    """How to start the deployment, beyond the target itself."""

    faults: tuple[str, ...] = ()
    overrides: Mapping[str, Any] | None = None
    engine: str = "sim"
    dynamo_bridge: bool = True
    #: None: the engine's default (:data:`DEFAULT_START_S`).
    start_timeout_s: float | None = None
    proxy_retries: int | None = None
    proxy_max_retries: int | None = None


@dataclass(frozen=True)
class ProxyView:
    """The LiteLLM proxy in front of the engine, as an xdist worker sees it (where it is, not how to own it)."""

    url: str
    base_url: str
    pid: int | None
    num_retries: int


@dataclass(frozen=True)
class Description:
    """Where the deployment is and what serves it; the xdist controller hands it to its workers."""

    url: str
    base_url: str
    log_file: str
    pid: int | None
    #: ``DynamoDeployment.info()``: the frontend's command and version, the workers, the gateway (Dynamo targets).
    dynamo: dict[str, Any] | None = None
    worker_metrics_urls: dict[str, tuple[str, ...]] = field(default_factory=dict)
    proxy: ProxyView | None = None

    def to_wire(self) -> dict[str, Any]:
        """Plain data for ``workerinput``."""
        return asdict(self)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Description:
        proxy = data.get("proxy")
        return cls(**{**data, "proxy": ProxyView(**proxy) if proxy else None,
                      "worker_metrics_urls": {role: tuple(urls)
                                              for role, urls in (data.get("worker_metrics_urls") or {}).items()}})

    @property
    def front_url(self) -> str:
        """The URL clients use: the proxy's when there is one."""
        return self.proxy.url if self.proxy else self.url


class AttachedEngine:
    """The controller's engine seen from an xdist worker: where it is, not how to own it."""

    def __init__(self, info: Description) -> None:
        self.url, self.base_url, self.log_file, self.pid = info.url, info.base_url, Path(info.log_file), info.pid
        self.dynamo = info.dynamo
        self.worker_metrics_urls = dict(info.worker_metrics_urls)

    def __repr__(self) -> str:
        return f"AttachedEngine({self.url}, pid={self.pid})"


class Deployment:
    """A running deployment: its engine handle, the proxy in front (or None), and its description.

    Owned (``owned``) when this process started it: ``stop`` ends it. Attached (an xdist worker): ``stop`` does
    nothing, the controller owns the processes."""

    def __init__(self, engine: Engine, proxy: Proxy | None, info: Description, *, owned: bool) -> None:
        self.engine, self.proxy, self.info, self.owned = engine, proxy, info, owned

    def describe(self) -> Description:
        return self.info

    def stop(self) -> None:
        if not self.owned:
            return
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        if self.engine is not None:
            self.engine.stop()
            self.engine = None


def attach(info: Description) -> Deployment:
    """The deployment an xdist controller started, seen from a worker."""
    return Deployment(AttachedEngine(info), info.proxy, info, owned=False)


def start(target: Target, run_dir: Path, settings: Settings) -> Deployment:
    """Start the deployment the target describes under ``--sim``; DeploymentFailed (one line) when it does not."""
    _sim_api_key(target)
    engine = _start_engine(target, run_dir, settings)
    info = _describe_engine(target, engine)
    deployment = Deployment(engine, None, info, owned=True)
    if target.has_proxy:
        try:
            deployment.proxy = _start_proxy(target, engine.base_url, run_dir, settings)
        except DeploymentFailed:
            deployment.stop()
            raise
        p = deployment.proxy
        deployment.info = Description(**{**asdict(info), "proxy": ProxyView(p.url, p.base_url, p.pid,
                                                                            p.num_retries)})
    return deployment


def start_own_dynamo(target: Target, log_file: Path, settings: Settings) -> DynamoSim:
    """A simulated Dynamo deployment of this process's own, beside the session's (an xdist worker's restart suite
    restarts pods; it must not restart the ones the controller's deployment serves every other worker from)."""
    from pytest_ml4_sim.deploy.dynamo import DynamoSim

    dsim = DynamoSim(target, faults=settings.faults, overrides=dict(settings.overrides or {}) or None,
                     bridge=settings.dynamo_bridge, log_file=log_file)
    try:
        dsim.start()
    except Exception as err:  # noqa: BLE001 - the deployment's own error carries the log tail
        dsim.stop()
        raise DeploymentFailed(f"ml4: the Dynamo simulator for {target.name} did not start: {err}") from None
    return dsim


def _sim_api_key(target: Target) -> None:
    """A simulated target that requires a key gets a fresh random one in its env var (never printed)."""
    var = target.endpoint.api_key_env
    if target.endpoint.requires_api_key and var and not os.environ.get(var):
        os.environ[var] = "sk-sim-" + secrets.token_urlsafe(18)


def _describe_engine(target: Target, engine: Any) -> Description:
    info = Description(url=engine.url, base_url=engine.base_url, log_file=str(engine.log_file), pid=engine.pid)
    if target.is_dynamo:
        return Description(**{**asdict(info), "dynamo": engine.info(),
                              "worker_metrics_urls": dict(engine.worker_metrics_urls)})
    return info


def _engine_class(target: Target, engine: str) -> type:
    """The handle class of the kind the target and ``--sim-engine`` ask for (a table of two questions)."""
    if target.is_dynamo and engine == "vllm":
        from pytest_ml4_sim.deploy.real_dynamo import RealDynamoDeployment

        return RealDynamoDeployment
    if target.is_dynamo:
        from pytest_ml4_sim.deploy.dynamo import DynamoSim

        return DynamoSim
    from pytest_ml4_sim.deploy.simulator import SimServer

    return SimServer


def _start_engine(target: Target, run_dir: Path, settings: Settings) -> Any:
    if settings.engine == "vllm" and not target.is_dynamo:
        return _start_real_vllm(target, run_dir, settings)
    from pytest_ml4.logs import start_failure_summary
    from pytest_ml4.runtime.installed import ToolMissing
    from pytest_ml4_sim.deploy.launcher import LaunchError

    timeout = settings.start_timeout_s or DEFAULT_START_S[settings.engine]
    extra = {"bridge": settings.dynamo_bridge} if target.is_dynamo else {}
    try:
        engine = _engine_class(target, settings.engine)(
            target, faults=settings.faults, overrides=dict(settings.overrides or {}) or None,
            log_file=run_dir / "sim" / "engine.log", **extra)
    except (ToolMissing, LaunchError) as err:  # not installed, not enough memory: one line, nothing started
        raise DeploymentFailed(f"ml4: --sim for {target.name}: {err}") from None
    try:
        engine.start(timeout=timeout)
    except Exception as err:  # the kind's own error carries the log tail
        engine.stop()
        if target.is_dynamo:  # command + log tail of the Dynamo process that failed
            raise DeploymentFailed(f"ml4: the Dynamo deployment for target {target.name} did not start: "
                                   f"{err}") from None
        # The refusal/OOM line first: a long traceback after it can push it out of the tail.
        if not Path(engine.log_file).exists():
            raise DeploymentFailed(f"ml4: the simulator for target {target.name} did not start: {err}") from None
        raise DeploymentFailed(f"ml4: the simulator for target {target.name} did not start\n"
                               f"{start_failure_summary(engine.log_file)}") from None
    return engine


def _start_real_vllm(target: Target, run_dir: Path, settings: Settings) -> Any:
    """Real vLLM with the scripted model instead of the simulator (``--sim-engine vllm``), or the running one
    ``ML4_REAL_VLLM_URL`` names (a test harness that started it once for several runs)."""
    from pytest_ml4.runtime.installed import ToolMissing
    from pytest_ml4_sim.deploy.launcher import LaunchError
    from pytest_ml4_sim.deploy.real_vllm import RealVllm

    ep = target.endpoint
    attach_url = os.environ.get("ML4_REAL_VLLM_URL")
    if attach_url:
        return RealVllm.attached(target, attach_url, os.environ.get("ML4_REAL_VLLM_LOG"))
    key = os.environ.get(ep.api_key_env) if ep.requires_api_key and ep.api_key_env else None
    engine = RealVllm(target, log_file=run_dir / "sim" / "engine.log", api_key=key)
    try:
        engine.start(timeout=settings.start_timeout_s or DEFAULT_START_S["vllm"])
    except (ToolMissing, LaunchError) as err:
        raise DeploymentFailed(f"ml4: --sim-engine vllm: {err}") from None
    return engine


def _start_proxy(target: Target, engine_base_url: str, run_dir: Path, settings: Settings) -> Any:
    from pytest_ml4.runtime.installed import ToolMissing
    from pytest_ml4.stacks.litellm import ProxySettings
    from pytest_ml4_sim.deploy.launcher import LaunchError
    from pytest_ml4_sim.deploy.litellm import LiteLLMProxy

    proxy_settings = ProxySettings.from_target(target, engine_base_url, num_retries=settings.proxy_retries,
                                               max_retries=settings.proxy_max_retries)
    proxy = LiteLLMProxy(proxy_settings, run_dir / "proxy" / "main")
    try:
        proxy.start()
    except (LaunchError, ToolMissing, OSError) as err:
        proxy.stop()
        raise DeploymentFailed(f"ml4: the LiteLLM proxy for {target.name} did not start: {err}") from None
    return proxy
