"""The simulator process ends when asked: on SIGTERM it drains the streams in flight like uvicorn's graceful
shutdown (tooling.md §3.6), bounded, and a second signal cuts the drain; ``SimServer.stop()`` falls back to
SIGKILL and never leaves a process behind; a whole ``--sim`` session (simulator and LiteLLM proxy) ends with it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_ml4_sim.deploy.simulator import SimServer
from test_sim_support import kill_processes_mentioning, processes_mentioning

#: Below the default drain bound (8 s): an exit this fast shows the drain ended early for the reason under test.
#: Generous on purpose, the box is shared and slow.
EARLY_EXIT_S = 7.0
#: Answers at a modest, fixed rate (one token per 5 ms step) so stream durations are known.
SLOW: dict[str, Any] = {"sim": {"ttft_s": 0.01, "itl_ms": 5.0}, "engine": {"speculative": None}}


def _stream_body(tokens: int) -> dict[str, Any]:
    return {"model": "mistral-large-4", "messages": [{"role": "user", "content": "Hello"}], "stream": True,
            "min_tokens": tokens, "max_tokens": tokens, "reasoning_effort": "none"}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _open_streams(sim: SimServer, n: int, tokens: int) -> tuple[list[threading.Thread], list[list[str]]]:
    """``n`` streams of ``tokens`` tokens that have each received a few chunks; returns their lines so far."""
    lines: list[list[str]] = [[] for _ in range(n)]
    started = threading.Barrier(n + 1, timeout=30)

    def read(i: int) -> None:
        try:
            with httpx.stream("POST", sim.base_url + "/chat/completions", json=_stream_body(tokens), timeout=60) as r:
                for line in r.iter_lines():
                    if not line:
                        continue
                    lines[i].append(line)
                    if len(lines[i]) == 5:
                        started.wait()
        except httpx.HTTPError as e:
            lines[i].append(f"transport error: {e}")

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    started.wait()
    return threads, lines


def _sigterm_and_wait(sim: SimServer, limit: float, second_after: float | None = None) -> tuple[int, float]:
    proc = sim.proc
    assert proc is not None
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    if second_after is not None:
        time.sleep(second_after)
        os.kill(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the simulator did not exit within {limit} s of SIGTERM\n{sim.log_tail()}")
    return code, time.monotonic() - t0


def _sigterm_with_streams(tmp_path: Path, n: int, tokens: int, overrides: dict[str, Any] = SLOW,
                          second_after: float | None = None) -> tuple[SimServer, int | None, int, float, list[list[str]]]:
    """Start a simulator, open ``n`` streams of ``tokens`` tokens, SIGTERM it (a second time ``second_after``
    seconds later) and wait for it to exit; returns (sim, its pid, exit code, seconds to exit, stream lines)."""
    sim = SimServer("gb300-agg", overrides=overrides, log_file=tmp_path / "e.log").start()
    try:
        threads, lines = _open_streams(sim, n, tokens)
        pid = sim.pid
        code, took = _sigterm_and_wait(sim, limit=12, second_after=second_after)
        for t in threads:
            t.join(timeout=10)
    finally:
        sim.stop()
    return sim, pid, code, took, lines


def test_sigterm_drains_streams_in_flight_then_exits(tmp_path: Path) -> None:
    sim, pid, code, took, lines = _sigterm_with_streams(tmp_path, 3, tokens=500)  # ~2.5 s each
    assert code == 0, f"exit code {code} after SIGTERM\n{sim.log_tail()}"
    assert took < EARLY_EXIT_S, f"SIGTERM with 3 short (2.5 s) streams in flight took {took:.1f} s to exit"
    for i, got in enumerate(lines):
        assert got[-1] == "data: [DONE]", f"stream {i} was cut by SIGTERM instead of drained: {got[-2:]}"
        assert '"finish_reason":"length"' in got[-2] or '"finish_reason":"length"' in got[-3], got[-3:]
    log = sim.log_file.read_text()
    assert "Waiting for connections to close." in log and f"Finished server process [{pid}]" in log


def test_second_sigterm_cuts_the_drain(tmp_path: Path) -> None:
    _, _, code, took, lines = _sigterm_with_streams(tmp_path, 2, tokens=5000, second_after=0.5)  # ~25 s each
    assert code == 0 and took < EARLY_EXIT_S, f"exit code {code} after {took:.1f} s"
    assert all(got[-1] != "data: [DONE]" for got in lines), "a 25 s stream completed: the drain was not cut"


def test_drain_is_bounded(tmp_path: Path) -> None:
    overrides = {**SLOW, "sim": {**SLOW["sim"], "extra": {"shutdown_drain_s": 1.0}}}
    _, _, code, took, _ = _sigterm_with_streams(tmp_path, 2, tokens=5000, overrides=overrides)
    assert code == 0 and took < EARLY_EXIT_S, f"exit code {code} after {took:.1f} s with a 1 s drain limit"


def test_no_new_connections_while_draining(tmp_path: Path) -> None:
    sim = SimServer("gb300-agg", overrides=SLOW, log_file=tmp_path / "e.log").start()
    try:
        threads, _ = _open_streams(sim, 1, tokens=600)  # ~3 s
        proc = sim.proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.3)
        assert proc.poll() is None, "exited before the stream drained"
        with pytest.raises(httpx.ConnectError):
            httpx.get(sim.url + "/health", timeout=2)
        proc.wait(timeout=8)
        for t in threads:
            t.join(timeout=10)
    finally:
        sim.stop()


def test_stop_falls_back_to_sigkill_and_leaves_nothing(tmp_path: Path) -> None:
    sim = SimServer("gb300-agg", overrides=SLOW, log_file=tmp_path / "e.log").start()
    pid = sim.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM: stop() must escalate
    t0 = time.monotonic()
    sim.stop(timeout=1.0)
    assert time.monotonic() - t0 < 5
    assert _gone(pid), f"simulator pid {pid} still exists after stop()"
    assert not sim.alive() and sim.pid is None


def test_stop_after_the_child_died_and_twice(tmp_path: Path) -> None:
    sim = SimServer("gb300-agg", overrides=SLOW, log_file=tmp_path / "e.log").start()
    pid = sim.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while sim.alive() and time.monotonic() < deadline:
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


def test_a_sim_session_leaves_no_process_behind(pytester: pytest.Pytester, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sim`` on a proxied target starts the simulator and a LiteLLM proxy; both end with the session."""
    monkeypatch.setenv("LLM_API_KEY", "sk-process-test-0123456789")
    reports = tmp_path / "reports"
    smoke = Path(__file__).resolve().parent.parent / "suites" / "test_smoke.py"
    result = pytester.runpytest_subprocess(str(smoke), "--target", "rtxpro6000-tp8", "--sim", "-k", "test_health",
                                           "--ml4-reports", str(reports), "-p", "no:randomly", timeout=300)
    result.assert_outcomes(passed=1)
    deadline = time.monotonic() + 5
    while processes_mentioning(str(reports)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = kill_processes_mentioning(str(reports))  # found and ended: they must not outlive this test either
    assert not left, "processes of the finished --sim session are still running:\n" + "\n".join(left)
