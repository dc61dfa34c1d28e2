"""What every server process the project starts has in common (the simulator, real vLLM): addresses, log tail,
restart on the same port, context manager. Subclasses set ``host``, ``port``, ``_requested_port``, ``proc``,
``log_file`` and implement ``start(timeout)`` and ``stop()``."""

from __future__ import annotations

import abc
import subprocess
from pathlib import Path
from typing import Self


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
