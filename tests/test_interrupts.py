"""A run that is stopped leaves nothing running and a summary saying so.

Each test starts pytest as a user does, waits for a *state* (aiperf running, LiteLLM starting), takes the pids of
every process below pytest at that moment, signals, and then checks by pid that none of them is alive and that
``summary.json`` says ``"interrupted": true``. The Ctrl-C test after the first perf point
(``test_plugin_bad_input.py``) covers the single Ctrl-C; these cover SIGTERM, a second Ctrl-C, and Ctrl-C while
the deployment starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_process_groups import wait_dead
from test_sim_support import kill_processes_mentioning, processes_mentioning

REPO = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]
PERF = ["--target", "rtxpro6000-tp8", "--sim", "-m", "perf", "--perf-short", "--perf-concurrencies=1,2",
        "--perf-duration=30", "suites/test_perf.py"]
#: The engine alone (no LiteLLM): half the start-up; the proxy's end is proven by the other tests.
NO_PROXY = ["--ml4-no-proxy"]


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every process below ``pid`` (in its own session or not)."""
    children, found, todo = _children_map(), {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            try:
                found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
            except OSError:
                continue
            todo.append(child)
    return found


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # see test_plugin_bad_input._sigint_as_in_a_terminal


@pytest.fixture
def run_pytest(tmp_path: Path) -> Iterator[Callable[[list[str]], subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(args: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen([*PYTEST, f"--ml4-run-dir={tmp_path / 'run'}", *args], cwd=REPO,
                                env=dict(os.environ, PYTEST_ADDOPTS=""), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                preexec_fn=_sigint_as_in_a_terminal)  # noqa: PLW1509 (one signal call)
        started.append(proc)
        return proc

    yield start
    for proc in started:  # a failed test must not leave its run behind either
        below = list(descendants(proc.pid))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _wait_for(proc: subprocess.Popen[str], what: str, found: Callable[[dict[int, str]], bool],
              within_s: float = 240) -> dict[int, str]:
    """The processes below pytest once ``found`` says yes about them."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and proc.poll() is None:
        below = descendants(proc.pid)
        if found(below):
            return below
        time.sleep(0.1)
    out = proc.stdout.read() if proc.poll() is not None and proc.stdout else "(still running)"
    raise AssertionError(f"never saw {what} below pytest:\n{out[-3000:]}")


def _aiperf_profiling(run: Path) -> Callable[[dict[int, str]], bool]:
    """aiperf is running and its first point has started writing (its workers are up)."""
    def found(below: dict[int, str]) -> bool:
        return any("aiperf" in cmd for cmd in below.values()) and bool(list(run.glob("perf/sweep-*/c1/*")))
    return found


def _finish(proc: subprocess.Popen[str], run: Path, watched: dict[int, str]) -> str:
    out, _ = proc.communicate(timeout=120)
    left = wait_dead(list(watched), within_s=10)
    for pid in left:  # ended here either way: nothing may outlive this test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, "still running after the run ended:\n" + "\n".join(f"{p}: {watched[p]}" for p in left)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True, out[-3000:]
    return out


def test_sigterm_during_a_perf_run_ends_simulator_and_aiperf(run_pytest, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = run_pytest(PERF + NO_PROXY)
    below = _wait_for(proc, "aiperf profiling", _aiperf_profiling(run))
    kinds = " ".join(below.values())
    assert "pytest_ml4_sim.deploy.sim_cli" in kinds and "aiperf" in kinds, kinds
    os.kill(proc.pid, signal.SIGTERM)  # pytest alone, as `kill PID` or a service manager does
    _finish(proc, run, below)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED


@pytest.mark.nightly
def test_double_ctrl_c_during_aiperf_leaves_nothing_running(run_pytest, tmp_path: Path) -> None:
    """The second Ctrl-C arrives while the first one's teardown waits for aiperf: every group is killed at once,
    aiperf's system_controller and LiteLLM included, and the teardown still writes the summary.

    Nightly: simulator, LiteLLM and aiperf start for it (about a minute on two loaded cores); CI keeps the parts:
    the second signal (test_process_groups), aiperf's leftovers (test_process_groups), SIGTERM and LiteLLM
    (the tests beside this one)."""
    run = tmp_path / "run"
    proc = run_pytest(PERF)
    below = _wait_for(proc, "aiperf profiling", _aiperf_profiling(run))
    kinds = " ".join(below.values())
    assert "litellm" in kinds and "pytest_ml4_sim.deploy.sim_cli" in kinds and "aiperf" in kinds, kinds
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole foreground group
    time.sleep(0.3)  # a second press, not the same one (a state cannot be awaited from outside here)
    os.killpg(proc.pid, signal.SIGINT)
    _finish(proc, run, below)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED


def test_ctrl_c_while_the_proxy_starts(run_pytest, tmp_path: Path) -> None:
    """LiteLLM is started but not live yet: nothing holds its port afterwards and the run folder has its summary."""
    run = tmp_path / "run"
    proc = run_pytest(["--target", "rtxpro6000-tp8", "--sim", "suites/test_smoke.py", "-k", "health"])
    below = _wait_for(proc, "LiteLLM starting", lambda b: any("litellm" in cmd for cmd in b.values()))
    assert not list(run.glob("allure-results/*-result.json")), "the proxy was live already: too late to test"
    os.killpg(proc.pid, signal.SIGINT)
    out = _finish(proc, run, below)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]


@pytest.mark.nightly
def test_a_failed_start_ends_what_started_and_leaves_a_summary(run_pytest, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator starts, LiteLLM cannot (not installed): one line, exit 4, the simulator ended, and the run
    folder's summary says interrupted (pytest calls no sessionfinish after a failed start).

    Nightly: a simulator start (about 30 s on two loaded cores) for a path that differs from the Ctrl-C-while-
    the-proxy-starts test above only by the exception (the same summary hook and the same teardown)."""
    run = tmp_path / "run"
    empty_tools = tmp_path / "tools"
    empty_tools.mkdir()
    monkeypatch.setenv("ML4_TOOLS", str(empty_tools))
    proc = run_pytest(["--target", "rtxpro6000-tp8", "--sim", "suites/test_smoke.py", "-k", "health"])
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    assert "ERROR: ml4: the LiteLLM proxy for rtxpro6000-tp8 did not start: LiteLLM" in out
    assert (run / "sim" / "engine.log").is_file(), "the simulator had started"
    # The simulator's command line names the run folder: by then nothing may still run that names it.
    deadline = time.monotonic() + 10
    while processes_mentioning(str(run)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = kill_processes_mentioning(str(run))
    assert not left, "still running after the failed start:\n" + "\n".join(left)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["exit_status"] == 4
