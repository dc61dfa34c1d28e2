"""The registry of owned process groups: what a group leaves behind is ended, each session ends
what it started and nothing else, and the signal handlers turn SIGTERM into an interrupt and a second signal into
"kill now". Processes are checked by pid; nothing here waits for a time to pass, only for a state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_ml4.runtime import processes

# A leader that starts a child in its own group and exits on SIGINT, leaving the child running: what aiperf's
# main process does to its system_controller.
_LEADER = textwrap.dedent("""
    import subprocess, sys, time
    try:  # the pid is printed inside: a SIGINT right after the test reads it must still end the leader with 0
        child = subprocess.Popen(["sleep", "300"])
        print(child.pid, flush=True)
        time.sleep(300)
    except KeyboardInterrupt:
        sys.exit(0)
""")


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not reaped, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_dead(pids: list[int], within_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def _leader_and_child() -> tuple[subprocess.Popen[str], int]:
    proc = processes.popen([sys.executable, "-c", _LEADER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_stop_ends_what_the_leader_leaves_behind() -> None:
    proc, child = _leader_and_child()
    assert os.getpgid(child) == proc.pid, "the child is in the group the registry owns"
    processes.stop(proc, 10, first_signal=signal.SIGINT, leader_only=True)
    assert proc.returncode == 0, "the leader ended on its SIGINT, as aiperf does"
    assert wait_dead([child]) == [], "the child the leader left behind is ended with the group"
    assert proc.pid not in processes.owned_pgids()


def test_control_sigint_to_the_leader_alone_leaves_the_child() -> None:
    """Without the registry's second step the child survives (the failure the test above rules out)."""
    proc, child = _leader_and_child()
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
        assert alive(child), "the leader's SIGINT alone leaves the child running"
    finally:
        processes.stop(proc)
    assert wait_dead([child]) == []


def test_end_all_since_a_mark_ends_only_the_later_groups() -> None:
    before = processes.popen(["sleep", "300"])
    mark = processes.mark()
    after, after_child = _leader_and_child()
    try:
        ended = processes.end_all(grace_s=5, since=mark)
        assert ended == [after.pid]
        assert wait_dead([after.pid, after_child]) == []
        assert alive(before.pid), "a group started before the mark (an outer test's server) is left alone"
    finally:
        processes.stop(before)
    assert wait_dead([before.pid]) == []


_HANDLERS = textwrap.dedent("""
    import signal, sys, time
    from pytest_ml4.runtime import processes
    processes.install_signal_handlers()
    group = processes.popen(["sleep", "300"])
    try:
        print(group.pid, flush=True)
        time.sleep(300)
    except KeyboardInterrupt as exc:
        print("interrupted:", exc, flush=True)
        # The teardown a session does after an interrupt; the second signal arrives during it.
        print("teardown", flush=True)
        group.wait(60)
        print("teardown done, group code", group.returncode, flush=True)
""")


def test_sigterm_interrupts_and_a_second_signal_kills_the_groups_now() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _HANDLERS], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        group = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.stdout.readline().strip() == "interrupted: signal SIGTERM"
        assert proc.stdout.readline().strip() == "teardown"
        assert alive(group), "the first signal only interrupts: the teardown ends the servers"
        os.kill(proc.pid, signal.SIGINT)
        rest = proc.stdout.read()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert f"teardown done, group code {-signal.SIGKILL}" in rest, rest
    assert proc.returncode == 0
    assert wait_dead([group]) == []


def test_atexit_ends_groups_nobody_stopped() -> None:
    script = ("import sys; from pytest_ml4.runtime import processes; "
              "print(processes.popen(['sleep', '300']).pid, flush=True); sys.exit(3)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3
    assert wait_dead([int(proc.stdout.split()[0])]) == []


@pytest.fixture(autouse=True)
def _nothing_left() -> None:
    yield
    assert processes.owned_pgids() == [], "a test of the registry left a group registered"
