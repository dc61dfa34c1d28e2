"""The pytest plugin (``pytest11`` entry point ``ml4``): the session's start and end, the report header.

A thin layer over the core: :mod:`pytest_ml4.target.model` loads the deployment's description, :mod:`pytest_ml4_sim.deploy`
starts the embedded one, :mod:`pytest_ml4.client.endpoint` builds clients. The plugin's own concerns are modules of this
package listed in ``pytest_plugins`` below: the options (``options``, the one ``ml4`` group), the session state
(``state``), the markers and skipping (``markers``), the core fixtures (``fixtures``) and one module per concern.
This module imports none of those that import it back.

Under pytest-xdist the controller resolves the target, chooses the run folder and starts the deployment once;
workers receive them through ``workerinput`` (like pytest-xdist's own ``testrunuid``) and attach to it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from pytest_ml4.plugin.state import (
    STATE_KEY,
    WI_DEPLOYMENT,
    WI_RUN_DIR,
    WI_TARGET,
    Ml4State,
    get_state,
)
from pytest_ml4.runtime import processes
from pytest_ml4.stacks import stack_for
from pytest_ml4.target.model import known_targets

pytest_plugins = [
    "pytest_ml4.plugin.options",
    # Before the modules that import it (accuracy, perf, reasoning), so pytest rewrites its asserts as a plugin's.
    "pytest_ml4.plugin.record",
    "pytest_ml4.plugin.markers",
    "pytest_ml4.plugin.fixtures",
    "pytest_ml4.plugin.access",
    "pytest_ml4.plugin.accuracy",
    "pytest_ml4.plugin.args",
    "pytest_ml4.plugin.breaker",
    "pytest_ml4.plugin.deadlines",
    "pytest_ml4.plugin.logs",
    "pytest_ml4.plugin.perf",
    "pytest_ml4.plugin.preflight",
    "pytest_ml4.plugin.reasoning",
    "pytest_ml4.plugin.report",
    "pytest_ml4.plugin.restart",
]

_GROUPS_MARK = pytest.StashKey[int]()
_STOP = pytest.StashKey[BaseException]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[STATE_KEY] = Ml4State.from_config(config)
    # SIGTERM is an interrupt like Ctrl-C; a second one ends every process the session started at once.
    config.stash[_GROUPS_MARK] = processes.mark()
    processes.install_signal_handlers()
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(), "ml4-xdist-hooks")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    state = get_state(session.config)
    if state.is_worker or state.target is None or state.collect_only:
        return
    state.ensure_run_dir()
    if state.use_sim:
        state.start_deployment()
    if _xdist_workers(session.config) and not state.use_sim and _needs_endpoint(session.config):
        # Workers cannot stop the whole session cleanly, so the controller checks a live endpoint up front. It
        # stops the session at collection: pytest prints an exit raised here twice ("Exit: ..." and "! ... !").
        try:
            state.endpoint()
        except pytest.exit.Exception as stop:
            session.stash[_STOP] = stop


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
        node.workerinput[WI_TARGET] = state.target.path
        node.workerinput[WI_RUN_DIR] = str(state.ensure_run_dir())
        if state.use_sim:
            node.workerinput[WI_DEPLOYMENT] = state.start_deployment().describe().to_wire()


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is None:
        return
    if state.deployment is not None:
        state.deployment.stop()     # the controller owns the processes; a worker's attached view stops nothing
        state.deployment = None
    # Whatever the objects above no longer knew about (a proxy interrupted while it started, an aiperf group
    # interrupted while it was being stopped) is ended by the registry.
    processes.end_all(since=config.stash.get(_GROUPS_MARK, 0))
    processes.uninstall_signal_handlers()


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = get_state(config)
    if state.target is None:
        return [f"ml4: no target (use --target; known: {', '.join(known_targets(state.targets_dir))})"]
    t = state.target
    direct = ", engine direct (--ml4-no-proxy)" if state.bypasses_proxy else ""
    info = state.description
    if state.use_sim:
        host = info.front_url.split("//", 1)[-1] if info else "simulator not started yet"
        mode = ("simulated" + (", through a real LiteLLM proxy" if info and info.proxy else "") + direct
                + (f", faults: {', '.join(state.faults)}" if state.faults else ""))
    else:
        url = state.config.getoption("ml4_endpoint") or os.environ.get(t.endpoint.url_env) or t.endpoint.default_url
        host = _host_only(url) if url else f"(unset: export {t.endpoint.url_env} or pass --endpoint)"
        mode = "live" + direct
    lines = [f"ml4: target {t.name} ({t.hardware.count}x {t.hardware.gpu}, {t.topology.kind}, {stack_for(t).name})",
             f"ml4: endpoint {host} [{mode}]"]
    if info and info.dynamo:
        dyn, fe = info.dynamo, info.dynamo["frontend"]
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
