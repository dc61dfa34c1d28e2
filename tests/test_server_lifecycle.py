"""The one start-up wait (``pytest_ml4.server_lifecycle.wait_until_healthy``) the simulator, real vLLM and the
Dynamo processes share: ready, died first, deadline passed, and the retry hook."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from pytest_ml4.server_lifecycle import wait_until_healthy


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
