"""A cross-process reader/writer lock on the endpoint under test, for suites that need it to themselves.

Some checks are only true when nothing else talks to the deployment: the fixed-OSL suite compares the engine's
generated-token counter with exactly its own requests, the perf sweep measures throughput and latency, the restart
suite takes the engine away. Under pytest-xdist the other workers would otherwise keep sending smoke or tool
requests meanwhile and turn a healthy deployment into a failed (or a flattering) result. The plugin holds the lock
exclusively around each test of an exclusive suite (with the fixtures it sets up and tears down) and shared around
every other test.

``flock(2)`` on two files in the run folder, so it works between any processes that share that folder and is
released by the kernel if a worker dies. A turnstile (the gate file) gives a waiting exclusive holder priority:
without it a stream of short shared holders could keep it waiting forever. Works without pytest.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".endpoint.lock"
GATE_NAME = ".endpoint.gate"


class EndpointLock:
    """``with lock.exclusive(): ...`` / ``with lock.shared(): ...`` across processes sharing ``folder``.

    One instance per process: a process that holds the lock exclusively may ask for it shared again (a no-op), which
    would otherwise deadlock on its own ``flock``.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.gate = self.folder / GATE_NAME
        self._exclusive_depth = 0

    @property
    def held_exclusively(self) -> bool:
        return self._exclusive_depth > 0

    @contextmanager
    def exclusive(self, timeout: float | None = None) -> Iterator[None]:
        if self._exclusive_depth:
            self._exclusive_depth += 1
            try:
                yield
            finally:
                self._exclusive_depth -= 1
            return
        with self._locked(self.gate, fcntl.LOCK_EX, timeout):
            lock_fd = self._acquire(self.path, fcntl.LOCK_EX, timeout)
        self._exclusive_depth = 1
        try:
            yield
        finally:
            self._exclusive_depth = 0
            _release(lock_fd)

    @contextmanager
    def shared(self, timeout: float | None = None) -> Iterator[None]:
        if self._exclusive_depth:
            yield
            return
        with self._locked(self.gate, fcntl.LOCK_SH, timeout):
            lock_fd = self._acquire(self.path, fcntl.LOCK_SH, timeout)
        try:
            yield
        finally:
            _release(lock_fd)

    @contextmanager
    def _locked(self, path: Path, mode: int, timeout: float | None) -> Iterator[int]:
        fd = self._acquire(path, mode, timeout)
        try:
            yield fd
        finally:
            _release(fd)

    def _acquire(self, path: Path, mode: int, timeout: float | None) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if timeout is None:
                fcntl.flock(fd, mode)
                return fd
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        kind = "exclusively" if mode == fcntl.LOCK_EX else "shared"
                        raise TimeoutError(f"could not lock {path} {kind} within {timeout:g} s: another test holds "
                                           f"the endpoint") from None
                    time.sleep(0.05)
        except BaseException:
            os.close(fd)
            raise


def _release(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
