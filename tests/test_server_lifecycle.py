"""The one start-up wait (``pytest_ml4_sim.deploy.launcher.wait_until_healthy``) the simulator, real vLLM and the
Dynamo processes share: ready, died first, deadline passed, and the retry hook."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from pytest_ml4_sim.deploy.launcher import wait_until_healthy


class StartFailed(RuntimeError):
    pass


def _wait(proc: subprocess.Popen[bytes], ready: bool, cleaned: list[bool], *, timeout: float,
          deadline: float | None = None, retry_on_exit: Callable[[], bool] = lambda: False) -> bool:
    def cleanup() -> None:
        cleaned.append(True)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    return wait_until_healthy(lambda: proc, lambda: ready, what="test server", url="http://127.0.0.1:9/health",
                              error=StartFailed, details=lambda: "log tail: boom", cleanup=cleanup, poll_s=0.01,
                              timeout=timeout, deadline=deadline, retry_on_exit=retry_on_exit)


def test_ready_returns_true_without_cleanup() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    cleaned: list[bool] = []
    try:
        assert _wait(proc, True, cleaned, timeout=30) is True
        assert not cleaned and proc.poll() is None
    finally:
        proc.kill()
        proc.wait(10)


def test_process_that_dies_fails_fast_naming_process_and_url() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    cleaned: list[bool] = []
    with pytest.raises(StartFailed) as err:
        _wait(proc, False, cleaned, timeout=60)
    first, _, rest = str(err.value).partition("\n")
    assert first == "test server exited with code 3 before becoming healthy on http://127.0.0.1:9/health"
    assert rest == "log tail: boom" and cleaned


def test_retry_on_exit_returns_false_instead_of_raising() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    assert _wait(proc, False, [], timeout=60, retry_on_exit=lambda: True) is False


def test_deadline_stops_the_process_and_names_the_url() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    cleaned: list[bool] = []
    with pytest.raises(StartFailed) as err:
        _wait(proc, False, cleaned, timeout=0, deadline=0.0)  # a deadline already passed: no waiting on load
    assert str(err.value).splitlines()[0] == "test server not healthy on http://127.0.0.1:9/health after 0 s"
    assert cleaned and proc.poll() is not None


# --------------------------------------------------------------------------------------- progress
# The wait is driven by what the probes return, counted in polls, not by the clock of a loaded machine: a start
# that shows progress on every poll must outlive `timeout`; one that shows none fails naming what is missing.
@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait(10)


def _progress_wait(proc: subprocess.Popen[bytes], ready: Callable[[], bool], progress: Callable[[], object], *,
                   timeout: float, cap_s: float) -> bool:
    return wait_until_healthy(lambda: proc, ready, what="test server", url="http://127.0.0.1:9/health",
                              error=StartFailed, details=lambda: "log tail: boom", cleanup=lambda: None,
                              poll_s=0.02, timeout=timeout, progress=progress, cap_s=cap_s,
                              missing=lambda: "workers registered in /health: decode#0")


def test_a_start_that_keeps_making_progress_outlives_the_window(sleeper: subprocess.Popen[bytes]) -> None:
    polls = itertools.count()
    started = time.monotonic()
    # Ready at the 3rd window's end at the earliest; every poll is progress (a log that keeps growing).
    assert _progress_wait(sleeper, lambda: time.monotonic() - started > 0.6, lambda: next(polls),
                          timeout=0.2, cap_s=120) is True


def test_a_start_without_progress_fails_naming_what_is_missing(sleeper: subprocess.Popen[bytes]) -> None:
    with pytest.raises(StartFailed) as err:
        _progress_wait(sleeper, lambda: False, lambda: "same log size", timeout=0.2, cap_s=120)
    first = str(err.value).splitlines()[0]
    assert re.fullmatch(r"test server not healthy on http://127\.0\.0\.1:9/health after \d+ s \(0 s without "
                        r"progress\); still missing: workers registered in /health: decode#0", first), first


def test_the_cap_ends_a_start_that_never_finishes(sleeper: subprocess.Popen[bytes]) -> None:
    polls = itertools.count()
    with pytest.raises(StartFailed) as err:
        _progress_wait(sleeper, lambda: False, lambda: next(polls), timeout=60, cap_s=0.3)
    first = str(err.value).splitlines()[0]
    assert re.fullmatch(r"test server not healthy on http://127\.0\.0\.1:9/health after \d+ s; still missing: "
                        r"workers registered in /health: decode#0", first), first
