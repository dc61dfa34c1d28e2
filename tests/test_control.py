"""Restart controllers: the bounded wait, the simulator controller, and the systemd controller.

The systemd controller is driven through a stand-in ``systemctl`` executable (this machine runs no systemd): a
script that keeps the unit's InvocationID in a file and restarts a real simulator process, so the controller's
whole protocol (show -p InvocationID, restart, is-active, then the engine's /health and /v1/models) runs for real.
"""

from __future__ import annotations

import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.control import (
    RestartError,
    RestartTimeout,
    SimController,
    SystemdController,
    controller_for,
    wait_for,
)
from pytest_ml4.target.model import load_target

TARGET = load_target("gb300-agg")  # needs no API key
MODEL = TARGET.serving.served_model_name


def test_wait_for_names_what_it_waits_for_and_times_out() -> None:
    said: list[str] = []
    states = iter(["booting", "booting", "loading weights", None])
    step = wait_for("engine up", lambda: next(states), time.monotonic() + 5, said.append, interval=0.01)
    assert step.what == "engine up" and step.seen == ["booting", "loading weights"]
    assert said[0] == "waiting for engine up" and "waiting for engine up: loading weights" in said
    with pytest.raises(RestartTimeout, match=r"waiting for never ready; last seen: still nope"):
        wait_for("never ready", lambda: "still nope", time.monotonic() + 0.2, interval=0.01)


def test_wait_for_treats_a_raising_probe_as_a_state() -> None:
    def probe() -> str | None:
        raise ConnectionError("refused")
    with pytest.raises(RestartTimeout, match="ConnectionError: refused"):
        wait_for("x", probe, time.monotonic() + 0.1, interval=0.01)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    with SimServer(TARGET, log_file=tmp_path_factory.mktemp("sim") / "engine.log") as server:
        yield server


def test_sim_controller_restarts_a_new_process(sim: SimServer) -> None:
    old = sim.pid
    said: list[str] = []
    result = SimController(sim, MODEL, timeout_s=60).restart(progress=said.append)
    assert sim.pid != old and result.details == {"old_pid": old, "new_pid": sim.pid}
    assert [s.what for s in result.steps] == ["a new simulator process", "engine /health 200",
                                              f"{MODEL} in /v1/models"]
    assert result.ready_s >= result.trigger_s > 0
    assert any(m.startswith("restarting simulator at") for m in said)
    assert "ready after" in result.summary()


def test_sim_controller_refuses_a_simulator_it_cannot_restart() -> None:
    class Attached:
        url, base_url, pid = "http://127.0.0.1:1", "http://127.0.0.1:1/v1", 1
    with pytest.raises(RestartError, match="cannot be restarted"):
        SimController(Attached(), MODEL)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ systemd
FAKE_SYSTEMCTL = '''#!{python}
"""Stand-in systemctl for one unit: InvocationID in a file; restart signals the test's restarter."""
import os, sys, time, uuid
state = {state!r}
args = sys.argv[1:]
inv = os.path.join(state, "invocation")
if args[:1] == ["show"]:
    print(open(inv).read() if os.path.exists(inv) else "")
elif args[:1] == ["is-active"]:
    print("active" if os.path.exists(inv) else "inactive")
elif args[:1] == ["restart"]:
    if os.path.exists(os.path.join(state, "fail")):
        sys.stderr.write("Failed to restart " + args[1] + ": Access denied\\n")
        sys.exit(1)
    open(os.path.join(state, "restart-requested"), "w").close()
    while os.path.exists(os.path.join(state, "restart-requested")):
        time.sleep(0.05)
    if not os.path.exists(os.path.join(state, "stuck")):
        open(inv, "w").write(uuid.uuid4().hex)
'''


@pytest.fixture()
def fake_systemctl(tmp_path: Path, sim: SimServer) -> Iterator[tuple[Path, Path]]:
    state = tmp_path / "state"
    state.mkdir()
    (state / "invocation").write_text("first")
    exe = tmp_path / "systemctl"
    exe.write_text(FAKE_SYSTEMCTL.format(python=sys.executable, state=str(state)))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    # The "unit": restart requests are served by restarting the real simulator process.
    import threading

    stop = threading.Event()

    def restarter() -> None:
        while not stop.is_set():
            flag = state / "restart-requested"
            if flag.exists():
                sim.restart()
                flag.unlink()
            time.sleep(0.05)
    th = threading.Thread(target=restarter, daemon=True)
    th.start()
    yield exe, state
    stop.set()
    th.join(5)


def _systemd(exe: Path, sim: SimServer, timeout: float = 30) -> SystemdController:
    return SystemdController("vllm-ml4.service", root_url=sim.url, base_url=sim.base_url, model=MODEL,
                             timeout_s=timeout, systemctl=(str(exe),))


def test_systemd_restart_waits_for_a_new_invocation_and_the_engine(fake_systemctl: tuple[Path, Path],
                                                                   sim: SimServer) -> None:
    exe, state = fake_systemctl
    old_pid = sim.pid
    result = _systemd(exe, sim).restart()
    assert sim.pid != old_pid
    assert result.details["old_invocation"] == "first"
    assert (state / "invocation").read_text() != "first"
    assert [s.what for s in result.steps] == ["a new invocation of vllm-ml4.service", "vllm-ml4.service active",
                                              "engine /health 200", f"{MODEL} in /v1/models"]


def test_systemd_restart_failure_quotes_systemctl(fake_systemctl: tuple[Path, Path], sim: SimServer) -> None:
    exe, state = fake_systemctl
    (state / "fail").touch()
    with pytest.raises(RestartError, match="exited 1: Failed to restart vllm-ml4.service: Access denied"):
        _systemd(exe, sim).restart()


def test_systemd_restart_is_bounded_and_says_what_it_waited_for(fake_systemctl: tuple[Path, Path],
                                                                sim: SimServer) -> None:
    exe, state = fake_systemctl
    (state / "stuck").touch()  # the unit restarts but keeps its old invocation id
    with pytest.raises(RestartTimeout, match="waiting for a new invocation of vllm-ml4.service; last seen: "
                                             "InvocationID still first"):
        _systemd(exe, sim, timeout=4).restart()


def test_systemd_over_ssh_wraps_the_command() -> None:
    ctl = SystemdController("vllm-ml4.service", root_url="http://h:8000", base_url="http://h:8000/v1", model="ml4",
                            ssh_host="gpu-node-1")
    argv = ctl.command("restart", "vllm-ml4.service")
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"] and argv[-2:] == ["gpu-node-1",
                                                                       "systemctl restart vllm-ml4.service"]
    assert "gpu-node-1" in ctl.describe()


def test_controller_for_picks_by_target(sim: SimServer) -> None:
    rtx = load_target("rtxpro6000-tp8")
    env = {"ML4_RTXPRO_SSH": "gpu-node-1"}
    ctl = controller_for(rtx, root_url="http://h:8000", base_url="http://h:8000/v1", env=env)
    assert isinstance(ctl, SystemdController) and ctl.ssh_host == "gpu-node-1" and ctl.timeout_s == 1200
    assert isinstance(controller_for(rtx, root_url=sim.url, base_url=sim.base_url, sim=sim, env={}), SimController)
    disagg = load_target("gb300-disagg")
    with pytest.raises(Exception, match="namespace"):
        controller_for(disagg, root_url="http://h", base_url="http://h/v1", kube_api=object(), env={})
