"""The one process-launcher base (:class:`ProcessLauncher`) of every server process the project starts: the
simulator, real vLLM, the LiteLLM proxy, the Dynamo frontend, workers and fault gateway. The base holds the process
handle, its log file and addresses, liveness and log tail, the one start wait, the stop through
:mod:`pytest_ml4.runtime.processes`, the restart on the same port and the context manager; a kind gives only what
differs: its command (``argv``), environment, readiness probe, error type and the hooks it needs.

:func:`wait_until_healthy` is that start wait (also used on its own for a whole Dynamo deployment). Given a
``progress`` probe (log sizes, workers registered) it waits while the start makes progress: ``timeout`` is then the
time allowed *without* progress, and a generous cap bounds the whole wait. A loaded machine starts slowly but
visibly; a hung start is still cut after ``timeout``."""

from __future__ import annotations

import abc
import os
import socket
import subprocess
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import IO, Protocol, Self

import httpx

from pytest_ml4.runtime import processes


class LaunchError(RuntimeError):
    """A process the project starts did not come up: the message names the command and quotes its log tail.
    Each kind's error (the simulator's, real vLLM's, Dynamo's, LiteLLM's) is one of these, so a caller that
    starts any of them catches one type (:class:`pytest_ml4_sim.deploy.embedded.DeploymentFailed` for the plugin)."""


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


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free on ``host`` now (another process may take it before it is bound)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``port`` can be bound on ``host`` now."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of the file at ``path`` ("(no log)" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


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


class Engine(Protocol):
    """What every engine handle offers the suites (a :class:`ProcessLauncher`, a whole Dynamo deployment, an xdist
    worker's attached view): where clients reach it, the engine's log, the process clients reach (None in a view
    that owns none)."""

    log_file: Path

    @property
    def url(self) -> str:
        """What clients reach (``http://host:port``)."""

    @property
    def base_url(self) -> str:
        """The OpenAI API's base: ``url`` + ``/v1``."""
        return self.url + "/v1"

    @property
    def pid(self) -> int | None:
        """The process clients reach."""


class ProcessLauncher(Engine, abc.ABC):
    """One server process the project starts and owns, in a process group of its own (:func:`processes.popen`).

    A kind implements :meth:`argv` and sets :attr:`name` and :attr:`error`; it overrides what differs:
    :meth:`child_env`, :meth:`ready` / :attr:`health_url` (the readiness probe), :meth:`choose_port`,
    :meth:`before_start`, :meth:`open_output`, :meth:`details`, :meth:`progress`, :meth:`missing`,
    :meth:`port_taken`, :meth:`leader_gone`."""

    #: What start errors name ("<name> exited with code 1 before becoming healthy on <health_url>").
    name: str = "process"
    #: The start error of this kind (a :class:`LaunchError`).
    error: type[LaunchError] = LaunchError
    #: The ``start``/``restart`` timeout when none is given: the time allowed without progress (the log growing).
    default_timeout: float = 60.0
    #: The ``stop`` grace before SIGKILL when none is given.
    stop_timeout: float = 10.0
    #: SIGTERM to the leader alone (it drains and ends its children itself), not to the whole group.
    stop_leader_only: bool = False
    #: Seconds between two readiness probes, and how long one probe may take.
    poll_s: float = 0.1
    probe_timeout_s: float = 1.0
    #: Starts tried when an auto-chosen port was taken between choosing and binding it (:meth:`port_taken`).
    port_attempts: int = 3

    def __init__(self, log_file: Path, *, host: str = "127.0.0.1", port: int = 0, cwd: Path | None = None) -> None:
        self.log_file = Path(log_file)
        self.host, self.port, self.cwd = host, port, cwd
        #: The port ``start`` binds (0: a free one); ``restart`` sets it to the current one.
        self._requested_port = port
        self.proc: subprocess.Popen[bytes] | None = None
        #: The command of the last start (named in start errors).
        self.command: list[str] = []

    # -- where it is
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def health_url(self) -> str:
        """What :meth:`ready` asks by default, named in start errors."""
        return self.url + "/health"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_file, lines)

    # -- what a kind gives
    @abc.abstractmethod
    def argv(self) -> list[str]:
        """The command that starts this process (no secrets: a command line is visible to every user)."""

    def child_env(self) -> dict[str, str]:
        """The process's environment (secrets travel here, never in :meth:`argv`)."""
        return dict(os.environ)

    def ready(self) -> bool:
        """True once the process serves: by default :attr:`health_url` answers 200."""
        return answers_200(self.health_url, timeout=self.probe_timeout_s)

    def choose_port(self) -> int:
        """The port of the next start: the one asked for (or the current one, on a restart), else a free one."""
        return self._requested_port or free_port(self.host)

    def before_start(self) -> None:
        """Hook, after the port is chosen and before :meth:`argv`: write config, clear state of a previous run."""

    def open_output(self) -> IO[bytes]:
        """Where the process's stdout and stderr go: appended to its log file."""
        return open(self.log_file, "ab")

    def details(self) -> str:
        """What a start error quotes below its first line: the command and the log tail."""
        return f"command: {' '.join(self.command)}\n--- log tail ({self.log_file}) ---\n{self.log_tail()}"

    def progress(self) -> Hashable:
        """What changes while the start makes progress: by default the log's size."""
        return file_sizes(self.log_file)

    def missing(self) -> str:
        """What :meth:`ready` still lacks, for the start error ("" names nothing)."""
        return ""

    def port_taken(self) -> bool:
        """Asked when the process exited during the start: True when an auto-chosen port was taken meanwhile
        (the start then tries again on another port)."""
        return False

    def leader_gone(self, pgid: int) -> None:
        """Hook of :meth:`stop`, once the main process has exited and before the rest of its group is ended."""

    # -- life cycle
    def start(self, timeout: float | None = None) -> Self:
        """Start the process and wait until :meth:`ready`; a running one is left as it is. ``timeout`` is the
        time allowed without progress, all attempts together at most ``PROGRESS_CAP_FACTOR`` x ``timeout``."""
        if self.alive():
            return self
        timeout = self.default_timeout if timeout is None else timeout
        cap = time.monotonic() + timeout * PROGRESS_CAP_FACTOR
        for _attempt in range(self.port_attempts):
            self.spawn()
            if self.wait_ready(timeout, cap):
                return self
        raise self.error(f"{self.name}: no free port after {self.port_attempts} attempts")

    def spawn(self) -> None:
        """Start the process without waiting for it."""
        self.port = self.choose_port()
        self.before_start()
        self.command = self.argv()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.proc = self._popen(self.command, self.open_output())

    def _popen(self, argv: list[str], output: IO[bytes]) -> subprocess.Popen[bytes]:
        """``argv`` in a process group of its own, its output into ``output`` (closed here: the child has it)."""
        with output:
            return processes.popen(argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=self.child_env(), cwd=self.cwd)

    def wait_ready(self, timeout: float, cap: float | None = None) -> bool:
        """:func:`wait_until_healthy` for this process: until :meth:`ready`, while its :meth:`progress` changes
        (``timeout`` without change fails), at most until ``cap`` (a monotonic time); :meth:`stop` on failure.
        False when it exited because its port was taken (:meth:`port_taken`)."""
        return wait_until_healthy(lambda: self.proc, self.ready, what=self.name, url=self.health_url,
                                  timeout=timeout, error=self.error, details=self.details, cleanup=self.stop,
                                  poll_s=self.poll_s, deadline=cap, retry_on_exit=self.port_taken,
                                  progress=self.progress, missing=self.missing)

    def signal(self, sig: int) -> None:
        """``sig`` to whom :meth:`stop` signals first (the leader, or the whole group)."""
        if self.proc is not None:
            processes.send_signal(self.proc, sig, self.stop_leader_only)

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM (it drains), SIGKILL to the group after ``timeout``, then whatever is left of the group
        (:func:`processes.stop`)."""
        proc, self.proc = self.proc, None
        processes.stop(proc, self.stop_timeout if timeout is None else timeout, leader_only=self.stop_leader_only,
                       on_leader_gone=self.leader_gone)

    def restart(self, timeout: float | None = None) -> Self:
        """Stop and start again on the same port (clients keep their base URL)."""
        port = self.port
        self.stop()
        self._requested_port = port or self._requested_port
        return self.start(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
