"""The session's ml4 state: the target, the run folder and the deployment, shared with xdist workers.

Built once by the core's ``pytest_configure`` from the options; every plugin module reads it with
:func:`get_state`. Imports no other plugin module, so no import circle closes through it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_ml4.client.breaker import EndpointHealth
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.client.lock import EndpointLock
from pytest_ml4.client.transport import Deadlines, parse_deadlines
from pytest_ml4.locations import targets_dir
from pytest_ml4.plugin.embedded import (
    SIM_ENGINES,
    StartFailed,
    attach_embedded,
    embedded_settings,
    public_dynamo_version,
    require_harness_for_options,
    start_embedded,
    tiny_model_overrides,
)
from pytest_ml4.plugin.endpoint import EndpointUnusable, endpoint_for
from pytest_ml4.plugin.option_group import int_opt, opt
from pytest_ml4.report.redact import redact
from pytest_ml4.stacks import stack_for
from pytest_ml4.target.model import (
    Target,
    TargetError,
    deep_merge,
    known_targets,
    load_target,
    parse_override,
)

if TYPE_CHECKING:
    from pytest_ml4_sim.deploy.embedded import Deployment, Description, Settings

STATE_KEY = pytest.StashKey["Ml4State"]()

# Keys carried from the xdist controller to its workers (like pytest-xdist's own ``testrunuid``).
WI_TARGET = "ml4_target_path"
WI_RUN_DIR = "ml4_run_dir"
WI_DEPLOYMENT = "ml4_deployment"


def get_state(config: pytest.Config) -> Ml4State:
    """The session's ml4 state (built by the core's ``pytest_configure``)."""
    return config.stash[STATE_KEY]


class Ml4State:
    """What the session knows about the target, the run folder and the deployment; shared with xdist workers."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        #: Where --target names are looked up (--target-dir / ini ml4_target_dir, else rootdir's targets/).
        self.targets_dir: Path = targets_dir(None, config.rootpath)
        self.target: Target | None = None
        self.overrides: dict[str, Any] = {}
        self.use_sim: bool = False
        self.sim_engine: str = "sim"    # --sim-engine: the simulator or real vLLM
        self.declared_target: Target | None = None  # as its YAML says (target: its engine view, --ml4-no-proxy)
        self.faults: tuple[str, ...] = ()
        self.dynamo_bridge: bool = True
        self.run_dir: Path | None = None
        #: Under --sim: the deployment this process started (controller) or attached to (xdist worker).
        self.deployment: Deployment | None = None
        self.is_worker = hasattr(config, "workerinput")
        self._endpoint_lock: EndpointLock | None = None
        self._endpoint_health: EndpointHealth | None = None

    def endpoint_lock(self) -> EndpointLock:
        """The run folder's endpoint lock (one per process: see EndpointLock)."""
        if self._endpoint_lock is None:
            self._endpoint_lock = EndpointLock(self.ensure_run_dir())
        return self._endpoint_lock

    def endpoint_health(self) -> EndpointHealth:
        """The run's breaker (``pytest_ml4.client.breaker``), shared by every process through the run folder."""
        if self._endpoint_health is None:
            self._endpoint_health = EndpointHealth.in_folder(self.ensure_run_dir())
        return self._endpoint_health

    def shares_endpoint_with_other_processes(self) -> bool:
        """True in an xdist worker of a run with a target: other workers send requests to the same endpoint."""
        return self.is_worker and self.target is not None

    @classmethod
    def from_config(cls, config: pytest.Config) -> Ml4State:
        self = cls(config)
        wi = getattr(config, "workerinput", None)
        self.targets_dir = _targets_dir(config)
        self.faults = tuple(config.getoption("ml4_faults") or ())
        self.use_sim = bool(opt(config, "ml4_sim", "ml4_sim"))
        require_harness_for_options(config, self.use_sim)
        if self.faults and not self.use_sim:
            raise pytest.UsageError("--ml4-fault needs --sim: faults are injected into the embedded simulator")
        if self.use_sim and config.getoption("ml4_endpoint"):
            raise pytest.UsageError("--sim and --endpoint exclude each other: the simulator is the endpoint")
        self.sim_engine = _sim_engine(config, self.use_sim, self.faults)
        if self.sim_engine == "vllm":
            # What the tiny CPU deployment really is; --ml4-set still goes on top.
            self.overrides = deep_merge(self.overrides, tiny_model_overrides())
        if self.use_sim:
            from pytest_ml4.control.budget import deployment_start_overrides

            # The embedded deployment's own worker start time bounds the restart phases; --ml4-set still wins.
            self.overrides = deep_merge(self.overrides, deployment_start_overrides(self.sim_engine))
        for expr in config.getoption("ml4_set") or ():
            try:
                self.overrides = deep_merge(self.overrides, parse_override(expr))
            except TargetError as err:
                raise pytest.UsageError(f"--ml4-set: {err}") from None
        name = wi[WI_TARGET] if wi and wi.get(WI_TARGET) else opt(config, "ml4_target", "ml4_target")
        if name is None and os.environ.get("ML4_TARGET"):
            name = os.environ["ML4_TARGET"]
        if name:
            try:
                self.target = load_target(name, self.targets_dir, overrides=self.overrides or None,
                                          option="--ml4-set")
            except TargetError as err:
                raise pytest.UsageError(str(err) if err.from_override else f"--target: {err}") from None
        elif self.use_sim:
            raise pytest.UsageError(f"--sim needs --target; known targets: {', '.join(known_targets(self.targets_dir))}")
        if self.use_sim and self.target is not None:
            _check_simulable(self.target)
        self.dynamo_bridge = _dynamo_bridge(config, self)
        self.declared_target = self.target
        workers_engine = stack_for(self.target).sim_worker_engine_version() if self.target is not None else None
        if self.sim_engine == "vllm" and workers_engine is not None:
            # Real workers run the engine of their own pins (dynamo.vllm: ai-dynamo 1.6.1's), not the target's.
            self.overrides = deep_merge(self.overrides, {"engine": {"version": workers_engine}})
            self.target = load_target(self.target.path or self.target.name, overrides=self.overrides)
        if opt(config, "ml4_no_proxy", "ml4_no_proxy") and self.target is not None:
            _check_no_proxy(self.target, self.use_sim, config.getoption("ml4_endpoint"))
            # Everything downstream (simulator start, suites, gates) sees the engine the run talks to.
            self.target = self.target.without_proxy()
        if wi and wi.get(WI_RUN_DIR):
            self.run_dir = Path(wi[WI_RUN_DIR])
            if wi.get(WI_DEPLOYMENT):
                self.deployment = attach_embedded(wi[WI_DEPLOYMENT])
        return self

    @property
    def description(self) -> Description | None:
        """What serves the run under --sim, once started (None live)."""
        return self.deployment.describe() if self.deployment is not None else None

    def settings(self) -> Settings:
        """How ``deploy/`` starts this run's deployment."""
        timeout = self.config.getoption("ml4_sim_timeout")
        if timeout is None and self.sim_engine == "sim":  # the ini's 60 s is the simulator's, not real vLLM's
            timeout = opt(self.config, "ml4_sim_timeout", "ml4_sim_start_timeout")
        return embedded_settings(faults=self.faults, overrides=self.overrides or None, engine=self.sim_engine,
                                 dynamo_bridge=self.dynamo_bridge,
                                 start_timeout_s=float(timeout) if timeout else None,
                                 proxy_retries=int_opt(self.config, "ml4_proxy_retries"),
                                 proxy_max_retries=int_opt(self.config, "ml4_proxy_max_retries"))

    def start_deployment(self) -> Deployment:
        """Start the --sim deployment once (controller); a key a process logged never reaches the console."""
        if self.deployment is None:
            assert self.target is not None
            try:
                self.deployment = start_embedded(self.target, self.ensure_run_dir(), self.settings())
            except StartFailed as err:
                raise pytest.UsageError(redact(str(err))) from None
        return self.deployment

    def endpoint(self) -> Endpoint:
        """The session's Endpoint (``deploy.endpoint``), or ``pytest.exit`` with one line saying what is missing or
        unreachable, secrets masked (the line may quote what the endpoint answered)."""
        assert self.target is not None
        try:
            ep = endpoint_for(self.target, self.deployment if self.use_sim else None,
                              endpoint_url=self.config.getoption("ml4_endpoint"),
                              key_var=self.config.getoption("ml4_api_key_env") or self.target.endpoint.api_key_env,
                              deadlines=session_deadlines(self.config, self.target))
        except EndpointUnusable as err:
            pytest.exit(redact(str(err)), returncode=err.returncode)
        health = self.endpoint_health()
        health.saw_answer()  # endpoint_for's check got an answer: a refused connection from now on is a death
        return dataclasses.replace(ep, health=health)

    @property
    def bypasses_proxy(self) -> bool:
        """The target has a proxy and this run talks to the engine behind it."""
        return self.target is not None and self.target.serving.bypassed_proxy is not None

    @property
    def collect_only(self) -> bool:
        """``--collect-only``: nothing runs, so no run folder is made (``ml4-report latest`` would name it)."""
        return bool(self.config.option.collectonly)

    # The run folder: one per run, never reused, so nothing is lost between runs.
    def ensure_run_dir(self) -> Path:
        if self.run_dir is not None:
            return self.run_dir
        explicit = self.config.getoption("ml4_run_dir")
        if explicit:
            path = Path(explicit)
            if path.exists() and any(path.iterdir()):
                raise pytest.UsageError(f"--ml4-run-dir {path} exists and is not empty; every run needs its own folder")
        else:
            base = Path(opt(self.config, "ml4_reports", "ml4_reports") or "reports")
            if not base.is_absolute():
                base = Path(self.config.rootpath) / base
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            label = self.target.name if self.target else "no-target"
            path = base / f"{stamp}-{label}-{secrets.token_hex(3)}"
        if not self.collect_only:
            path.mkdir(parents=True, exist_ok=True)
        self.run_dir = path.resolve()
        return self.run_dir


def _dynamo_bridge(config: pytest.Config, state: Ml4State) -> bool:
    """The bridge setting; turned off under --sim it makes the target describe public Dynamo 1.6.1 (through the
    normal override path, so xdist workers and the simulator's workers see the same target)."""
    bridge = opt(config, "ml4_dynamo_bridge", "ml4_dynamo_bridge")
    if config.getoption("ml4_dynamo_bridge") is None or bridge:
        return True if bridge is None else bool(bridge)
    if not state.use_sim:
        raise pytest.UsageError("--ml4-no-dynamo-bridge needs --sim: it changes the embedded Dynamo deployment")
    stack = stack_for(state.target) if state.target is not None else None
    # The bridge stands in for the frontend release the target declares: none declared, nothing to bridge.
    if stack is not None and stack.release(state.target) is None:
        raise pytest.UsageError(f"--ml4-no-dynamo-bridge: target {state.target.name} is not served by Dynamo "
                                f"({stack.name})")
    if state.target is not None:
        public = public_dynamo_version()
        state.overrides = deep_merge(state.overrides, {"serving": {"dynamo_version": public}})
        state.target = load_target(state.target.path or state.target.name, overrides=state.overrides)
    return False


def _sim_engine(config: pytest.Config, use_sim: bool, faults: tuple[str, ...]) -> str:
    engine = str(opt(config, "ml4_sim_engine", "ml4_sim_engine") or "sim")
    if engine not in SIM_ENGINES:
        raise pytest.UsageError(f"ml4_sim_engine = {engine!r}: choose one of {', '.join(SIM_ENGINES)}")
    if engine == "vllm" and not use_sim:
        raise pytest.UsageError("--sim-engine vllm needs --sim (it replaces the simulator behind --sim)")
    if engine == "vllm" and faults:
        raise pytest.UsageError("--ml4-fault needs the embedded simulator: real vLLM (--sim-engine vllm) has no "
                                "faults to inject")
    return engine


def _check_simulable(target: Target) -> None:
    from pytest_ml4.target.hardware import simulation_refusal

    refusal = simulation_refusal(target.hardware)
    if refusal:
        raise pytest.UsageError(f"target {target.name}: {refusal}")


def _check_no_proxy(target: Target, use_sim: bool, endpoint: str | None) -> None:
    if not target.has_proxy:
        raise pytest.UsageError(f"--ml4-no-proxy: target {target.name} has no proxy in front of its engine "
                                f"({stack_for(target).name})")
    if not use_sim and not endpoint:
        raise pytest.UsageError(f"--ml4-no-proxy against a live deployment needs --endpoint with the engine's URL: "
                                f"{target.endpoint.url_env} is the {target.serving.proxy.kind} proxy's")


def simulator_answers(config: pytest.Config, endpoint: object) -> bool:
    """True when the project's simulated engine answers this run (``--sim`` with ``--sim-engine sim``): the only
    runs a simulator-made baseline may judge. Real vLLM or real ``dynamo.vllm`` under ``--sim`` is another engine,
    judged like a live deployment."""
    return bool(getattr(endpoint, "simulated", False)) and get_state(config).sim_engine == "sim"


def session_deadlines(config: pytest.Config, target: Any) -> Deadlines:
    """The target's derived deadlines with those the option or ini (``--ml4-deadlines``) sets."""
    return Deadlines.for_target(target).overriding(**parse_deadlines(opt(config, "ml4_deadlines", "ml4_deadlines")))


def _targets_dir(config: pytest.Config) -> Path:
    """``--target-dir`` relative to the directory pytest was started in (what a shell user means by a relative
    path), ini ``ml4_target_dir`` relative to the ini file's folder (pytest's convention for paths in an ini)."""
    given = config.getoption("ml4_target_dir")
    if given:
        return targets_dir(given, config.rootpath, relative_to=config.invocation_params.dir)
    ini = config.getini("ml4_target_dir")
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    return targets_dir(ini or None, config.rootpath, relative_to=base)
