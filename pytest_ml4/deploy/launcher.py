"""What every server process the project starts has in common (the simulator, real vLLM): addresses, log tail,
restart on the same port, context manager, the wait until healthy. Subclasses set ``host``, ``port``,
``_requested_port``, ``proc``, ``log_file`` and implement ``start(timeout)`` and ``stop()``.

:func:`wait_until_healthy` is the one start-up wait of every server process the project starts (the simulator,
real vLLM, the Dynamo frontend and workers, which are not :class:`ServerLifecycle` objects). Given a ``progress``
probe (log sizes, workers registered) it waits while the start makes progress: ``timeout`` is then the time
allowed *without* progress, and a generous cap bounds the whole wait. A loaded machine starts slowly but visibly;
a hung start is still cut after ``timeout``."""

from __future__ import annotations

import abc
import subprocess
import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Self

import httpx


class LaunchError(RuntimeError):
    """A process the project starts did not come up: the message names the command and quotes its log tail.
    Each kind's error (the simulator's, real vLLM's, Dynamo's, LiteLLM's) is one of these, so a caller that
    starts any of them catches one type (:class:`pytest_ml4.deploy.embedded.DeploymentFailed` for the plugin)."""


#: With a progress probe, the whole wait may last this many times the no-progress window (``cap_s`` default).
PROGRESS_CAP_FACTOR = 5.0


def _never() -> bool:
    return False


def _nothing_missing() -> str:
    return ""


def file_sizes(*paths: Path | str) -> tuple[int, ...]:
    """A progress probe: the sizes of the given files (-1 for one not there yet); a growing log is progress."""
    return tuple(_size(p) for p in paths)


def _size(path: Path | str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return -1


def answers_200(url: str, timeout: float) -> bool:
    """True when ``url`` answers HTTP 200 within ``timeout`` (a refused or hung connection is a no)."""
    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until_healthy(proc: Callable[[], subprocess.Popen[bytes] | None], ready: Callable[[], bool], *,
                       what: str, url: str, timeout: float, error: type[Exception], details: Callable[[], str],
                       cleanup: Callable[[], None], poll_s: float, deadline: float | None = None,
                       retry_on_exit: Callable[[], bool] = _never, progress: Callable[[], Hashable] | None = None,
                       cap_s: float | None = None, missing: Callable[[], str] = _nothing_missing) -> bool:
    """Poll ``ready()`` until it says yes (True). If the process is gone first (exited, or ``proc()`` is None
    because someone stopped it) or the wait is over: ``cleanup()``, then raise ``error`` whose first line names
    ``what``, ``url`` and ``missing()`` (what the start still lacked), ``details()`` (command, log tail) below it.

    Without ``progress`` the wait is over at ``deadline`` (default: now + ``timeout``). With it, each change of
    what ``progress()`` returns restarts a ``timeout`` window, and the wait is over when a window passes without
    change or at the cap (``deadline`` when given, else now + ``cap_s``, default ``PROGRESS_CAP_FACTOR`` x
    ``timeout``).

    ``retry_on_exit`` (asked after ``cleanup``): return False instead of raising, for a process that died of a
    cause the caller retries (an auto-chosen port taken meanwhile)."""
    started = time.monotonic()
    if progress is None:
        cap = started + timeout if deadline is None else deadline
    else:
        cap = deadline if deadline is not None else started + (cap_s or timeout * PROGRESS_CAP_FACTOR)
    quiet_until, last = started + timeout, progress() if progress is not None else None
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
        now = time.monotonic()
        if progress is not None and (seen := progress()) != last:
            last, quiet_until = seen, now + timeout
        if now > cap or (progress is not None and now > quiet_until):
            lacking = missing()
            cleanup()
            raise error(f"{what} not healthy on {url} after {now - started:.0f} s"
                        + (f" ({timeout:.0f} s without progress)" if progress is not None and now <= cap else "")
                        + (f"; still missing: {lacking}" if lacking else "") + f"\n{details()}")
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
                            retry_on_exit: Callable[[], bool] = _never,
                            logs: Iterable[Path | str] | None = None) -> bool:
        """:func:`wait_until_healthy` for this server: its ``proc``, ``/health`` named in errors, ``stop()`` on
        failure; while its ``logs`` (default: its log file) grow, the start is making progress."""
        paths = tuple(logs) if logs is not None else (self.log_file,)
        return wait_until_healthy(lambda: self.proc, ready, what=what, url=self.url + "/health", timeout=timeout,
                                  error=error, details=details, cleanup=self.stop, poll_s=poll_s, deadline=deadline,
                                  retry_on_exit=retry_on_exit, progress=lambda: file_sizes(*paths))

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
