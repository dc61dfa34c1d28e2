"""The simulator process ends when asked: SIGTERM with streams in flight, and ``SimServer.stop()``'s SIGKILL
fallback, never leaving a process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from pytest_ml4.sim import SimServer

#: Long answers at a modest rate: a stream lasts far longer than the test allows for shutdown.
SLOW = {"sim": {"ttft_s": 0.01, "itl_ms": 5.0}, "engine": {"speculative": None}}
LONG_STREAM = {"model": "mistral-large-4", "messages": [{"role": "user", "content": "Hello"}], "stream": True,
               "min_tokens": 5000, "max_tokens": 5000, "reasoning_effort": "none"}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _open_streams(sim: SimServer, n: int) -> tuple[list[threading.Thread], list[int]]:
    """``n`` streams that have each received a few chunks; the list counts lines per stream."""
    seen = [0] * n
    started = threading.Barrier(n + 1, timeout=30)

    def read(i: int) -> None:
        try:
            with httpx.stream("POST", sim.base_url + "/chat/completions", json=LONG_STREAM, timeout=60) as r:
                for line in r.iter_lines():
                    seen[i] += 1
                    if seen[i] == 5:
                        started.wait()
        except httpx.HTTPError:
            pass  # the server going away mid-stream is the point of the test

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    started.wait()
    return threads, seen


def test_sigterm_with_streams_in_flight_exits_promptly(tmp_path: Path) -> None:
    sim = SimServer("gb300-agg", overrides=SLOW, log_file=tmp_path / "e.log").start()
    proc = sim.proc
    assert proc is not None
    try:
        threads, seen = _open_streams(sim, 3)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=8)
        took = time.monotonic() - t0
    finally:
        sim.stop()
    assert code == 0, f"exit code {code} after SIGTERM\n{sim.log_tail()}"
    assert took < 5, f"SIGTERM with 3 streams in flight took {took:.1f} s to exit"
    for t in threads:
        t.join(timeout=10)
    assert all(n < 5000 for n in seen), "a stream ran to completion: SIGTERM did not cut it"
    log = sim.log_file.read_text()
    assert "Shutting down" in log and f"Finished server process [{proc.pid}]" in log


def test_stop_falls_back_to_sigkill_and_leaves_nothing(tmp_path: Path) -> None:
    sim = SimServer("gb300-agg", overrides=SLOW, log_file=tmp_path / "e.log").start()
    pid = sim.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM: stop() must escalate
    t0 = time.monotonic()
    sim.stop(timeout=1.0)
    assert time.monotonic() - t0 < 5
    assert _gone(pid), f"simulator pid {pid} still exists after stop()"
    assert not sim.is_running() and sim.pid is None


def test_stop_after_the_child_died_and_twice(tmp_path: Path) -> None:
    sim = SimServer("gb300-agg", overrides=SLOW, log_file=tmp_path / "e.log").start()
    pid = sim.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while sim.is_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    sim.stop()
    sim.stop()
    assert _gone(pid)


def test_cli_exits_on_sigterm_during_boot(tmp_path: Path) -> None:
    """A SIGTERM that arrives before the server listens still ends the process (default disposition)."""
    log = tmp_path / "boot.log"
    proc = subprocess.Popen(SimServer("gb300-agg", log_file=log).argv(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("the simulator ignored SIGTERM during boot")
    assert code != 0 or "Finished server process" in log.read_text()
