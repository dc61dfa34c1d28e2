"""One process-launcher base (``pytest_ml4_sim.deploy.launcher.ProcessLauncher``): every kind of server process the
project starts derives from it, only it calls ``processes.popen`` among the classes of ``pytest_ml4/``, and what it
gives every kind (start wait, restart on the same port, stop of the group, context manager) holds for a plain
HTTP server. Costs about 2 s (two short-lived ``python -m http.server`` processes)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from pytest_ml4_sim import HARNESS_PARENT
from pytest_ml4_sim.deploy.dynamo import (
    DynamoDeployment,
    DynamoSim,
    DynamoWorker,
    FrontendProcess,
    GatewayProcess,
    SimDynamoWorker,
)
from pytest_ml4_sim.deploy.launcher import Engine, LaunchError, ProcessLauncher
from pytest_ml4_sim.deploy.litellm import LiteLLMProxy, ProxyError
from pytest_ml4_sim.deploy.real_dynamo import RealDynamoDeployment, RealDynamoWorker
from pytest_ml4_sim.deploy.real_vllm import RealVllm
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.locations import PACKAGE_PARENT
from pytest_ml4.runtime import processes
from pytest_ml4.stacks.litellm import ProxySettings

#: The suite's package and the embedded deployment's (harness/): every process either starts goes through here.
PACKAGES = (PACKAGE_PARENT / "pytest_ml4", HARNESS_PARENT / "pytest_ml4_sim")
KINDS = [SimServer, RealVllm, LiteLLMProxy, FrontendProcess, GatewayProcess, SimDynamoWorker, RealDynamoWorker]
#: The functions (not classes) that start a process beside the tests without being a server of the deployment:
#: the headless browser that prints the report, and aiperf.
TOOL_STARTERS = {("report/html.py", "_start_chromium"), ("perf/runner.py", "run_aiperf")}


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_every_launcher_kind_derives_from_the_one_base(kind: type) -> None:
    assert issubclass(kind, ProcessLauncher), f"{kind.__name__} is not a ProcessLauncher"
    assert Engine in kind.__mro__ and kind.base_url is Engine.base_url, f"{kind.__name__} writes base_url again"
    assert issubclass(kind.error, LaunchError), f"{kind.__name__}.error {kind.error.__name__} is no LaunchError"


@pytest.mark.parametrize("deployment", [DynamoSim, RealDynamoDeployment], ids=lambda k: k.__name__)
def test_a_dynamo_deployment_is_an_engine_without_being_one_process(deployment: type) -> None:
    # Engine is a Protocol (not runtime-checkable): its subclasses name it in their MRO.
    assert Engine in deployment.__mro__ and not issubclass(deployment, ProcessLauncher)
    assert deployment.base_url is Engine.base_url, f"{deployment.__name__} writes base_url again"


def test_the_real_dynamo_deployment_is_no_kind_of_simulator() -> None:
    """Simulated and real dynamo.vllm workers are two kinds of one Dynamo deployment, neither a kind of the other;
    the base alone is no deployment (it has no workers' kind)."""
    pairs = [(DynamoSim, RealDynamoDeployment, DynamoDeployment), (SimDynamoWorker, RealDynamoWorker, DynamoWorker)]
    for sim, real, base in pairs:
        assert issubclass(sim, base) and issubclass(real, base), f"{sim.__name__}, {real.__name__} not {base.__name__}"
        assert not issubclass(real, sim) and not issubclass(sim, real), f"{real.__name__} and {sim.__name__} related"
    with pytest.raises(TypeError, match="abstract"):
        DynamoDeployment(None)  # type: ignore[abstract,arg-type]


def _popen_callers() -> set[tuple[str, str]]:
    """(file, the class or else the module-level function) of every ``processes.popen(...)`` in the packages."""
    found: set[tuple[str, str]] = set()
    for path in sorted(p for package in PACKAGES for p in package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for top in tree.body:
            if not isinstance(top, ast.ClassDef | ast.FunctionDef):
                continue
            for node in ast.walk(top):
                func = node.func if isinstance(node, ast.Call) else None
                if isinstance(func, ast.Attribute) and func.attr == "popen" and \
                        isinstance(func.value, ast.Name) and func.value.id == "processes":
                    found.add((path.relative_to(next(p for p in PACKAGES if path.is_relative_to(p))).as_posix(), top.name))
    return found


def test_only_the_base_starts_server_processes() -> None:
    callers = _popen_callers()
    classes = {c for c in callers if c not in TOOL_STARTERS}
    assert classes == {("deploy/launcher.py", "ProcessLauncher")}, \
        f"processes.popen called outside ProcessLauncher: {sorted(classes - {('deploy/launcher.py', 'ProcessLauncher')})}"
    assert TOOL_STARTERS <= callers, f"the tool starters moved: {sorted(TOOL_STARTERS - callers)}"


class HttpServer(ProcessLauncher):
    """The smallest kind: a command and a readiness probe (the base's: its health URL answers 200)."""

    name = "test http server"
    poll_s = 0.05

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "http.server", "--bind", self.host, str(self.port)]

    @property
    def health_url(self) -> str:
        return self.url + "/"


def test_the_base_starts_restarts_on_the_same_port_and_stops_the_group(tmp_path: Path) -> None:
    with HttpServer(tmp_path / "server.log", cwd=tmp_path) as server:
        port, pid = server.port, server.pid
        assert port and pid and server.alive() and pid in processes.owned_pgids()
        assert server.start() is server and server.pid == pid, "a running process is left as it is"
        server.restart(timeout=30)
        assert server.port == port and server.pid not in (None, pid) and server.alive()
        assert not processes.group_alive(pid), "the first process outlived the restart"
        second = server.pid
    assert server.pid is None and not server.alive() and not processes.group_alive(second)
    assert "GET / HTTP" in server.log_tail(), "the readiness probe is in the log the base wrote"


def test_a_process_that_dies_at_start_is_one_error_with_command_and_log_tail(tmp_path: Path) -> None:
    class Dies(HttpServer):
        def argv(self) -> list[str]:
            return [sys.executable, "-c", "import sys; print('boom: no model'); sys.exit(3)"]

    server = Dies(tmp_path / "dies.log")
    with pytest.raises(LaunchError) as err:
        server.start(timeout=30)
    first, _, rest = str(err.value).partition("\n")
    assert first == f"test http server exited with code 3 before becoming healthy on {server.url}/"
    assert rest.startswith(f"command: {sys.executable} -c ") and "boom: no model" in rest
    assert server.proc is None


def test_the_litellm_proxy_waits_with_the_shared_start_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM's start goes through the base's wait: its error is the shared one, with its command and log tail."""
    from pytest_ml4_sim.deploy import litellm

    from pytest_ml4.target.model import load_target

    fake = tmp_path / "litellm"
    fake.write_text("#!/bin/sh\necho 'ImportError: no module named litellm (test)'\nexit 5\n")
    fake.chmod(0o755)
    monkeypatch.setattr(litellm, "litellm_executable", lambda required=True: fake)
    target = load_target("rtxpro6000-tp8")
    settings = ProxySettings.from_target(target, "http://127.0.0.1:9/v1")
    proxy = LiteLLMProxy(settings, tmp_path / "proxy", env={settings.key_env: "sk-test-not-a-secret"})
    with pytest.raises(ProxyError) as err:
        proxy.start(timeout=30)
    message = str(err.value)
    assert message.startswith(f"LiteLLM proxy exited with code 5 before becoming healthy on {proxy.url}"
                              "/health/liveliness\ncommand: "), message
    assert "ImportError: no module named litellm (test)" in message and "sk-test" not in message
