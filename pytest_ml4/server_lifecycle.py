"""What every server process the project starts has in common (the simulator, real vLLM): addresses, log tail,
restart on the same port, context manager, the wait until healthy. Subclasses set ``host``, ``port``,
``_requested_port``, ``proc``, ``log_file`` and implement ``start(timeout)`` and ``stop()``.

:func:`wait_until_healthy` is the one start-up wait of every server process the project starts (the simulator,
real vLLM, the Dynamo frontend and workers, which are not :class:`ServerLifecycle` objects)."""

from __future__ import annotations

import abc
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import httpx


def _never() -> bool:
    return False


def answers_200(url: str, timeout: float) -> bool:
    """True when ``url`` answers HTTP 200 within ``timeout`` (a refused or hung connection is a no)."""
    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until_healthy(proc: Callable[[], subprocess.Popen[bytes] | None], ready: Callable[[], bool], *,
                       what: str, url: str, timeout: float, error: type[Exception], details: Callable[[], str],
                       cleanup: Callable[[], None], poll_s: float, deadline: float | None = None,
                       retry_on_exit: Callable[[], bool] = _never) -> bool:
    """Poll ``ready()`` until it says yes (True). If the process is gone first (exited, or ``proc()`` is None
    because someone stopped it) or ``deadline`` (default: now + ``timeout``) passes: ``cleanup()``, then raise
    ``error`` whose first line names ``what`` and ``url``, ``details()`` (command, log tail) below it.

    ``retry_on_exit`` (asked after ``cleanup``): return False instead of raising, for a process that died of a
    cause the caller retries (an auto-chosen port taken meanwhile)."""
    deadline = time.monotonic() + timeout if deadline is None else deadline
    while True:
        process = proc()
        code = None if process is None else process.poll()
        if process is None or code is not None:
            # proc() is read once per round: another thread may stop the server while we wait.
            cleanup()
            if retry_on_exit():
                return False
            raise error(f"{what} exited with code {code} before becoming healthy on {url}\n{details()}")
        if ready():
            return True
        if time.monotonic() > deadline:
            cleanup()
            raise error(f"{what} not healthy on {url} after {timeout:.0f} s\n{details()}")
        time.sleep(poll_s)


class ServerLifecycle(abc.ABC):
    host: str
    port: int
    _requested_port: int
    proc: subprocess.Popen[bytes] | None
    log_file: Path
    #: The ``restart``/``start`` timeout when none is given.
    default_timeout: float = 60.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @abc.abstractmethod
    def start(self, timeout: float | None = None) -> Self:
        """Start the server and wait until it answers."""

    @abc.abstractmethod
    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (drain, then kill after ``timeout``)."""

    def _wait_until_healthy(self, ready: Callable[[], bool], timeout: float, *, what: str, error: type[Exception],
                            details: Callable[[], str], poll_s: float, deadline: float | None = None,
                            retry_on_exit: Callable[[], bool] = _never) -> bool:
        """:func:`wait_until_healthy` for this server: its ``proc``, ``/health`` named in errors, ``stop()`` on
        failure."""
        return wait_until_healthy(lambda: self.proc, ready, what=what, url=self.url + "/health", timeout=timeout,
                                  error=error, details=details, cleanup=self.stop, poll_s=poll_s, deadline=deadline,
                                  retry_on_exit=retry_on_exit)

    def restart(self, timeout: float | None = None) -> Self:
        """Stop and start again on the same port (clients keep their base URL)."""
        port = self.port
        self.stop()
        self._requested_port = port or self._requested_port
        return self.start(timeout if timeout is not None else self.default_timeout)

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
