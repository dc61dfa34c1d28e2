"""``SimServer``: start/stop the simulator as a subprocess on a free loopback port (Python API).

Pattern of vLLM's ``RemoteOpenAIServer`` / pytest-httpserver: spawn ``python -m pytest_ml4.sim``, poll
``/health`` until it answers 200, fail fast with the log tail when the process dies or the wait times out, stop
by PID (SIGTERM, then SIGKILL).  The API key travels in the child's environment, never in argv.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx

from pytest_ml4.server_lifecycle import ServerLifecycle
from pytest_ml4.sim.faults import FaultSpec, parse_fault
from pytest_ml4.targets import Target


class SimServerError(RuntimeError):
    """The simulator did not come up (the message carries the reason and the log tail)."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _flatten(prefix: str, value: Any) -> list[str]:
    if isinstance(value, Mapping):
        out: list[str] = []
        for k, v in value.items():
            out += _flatten(f"{prefix}.{k}" if prefix else str(k), v)
        return out
    import json

    # JSON is valid YAML, so parse_override on the other side restores the exact value.
    return [f"{prefix}={json.dumps(value)}"]


class SimServer(ServerLifecycle):
    """A simulator subprocess for one target."""

    def __init__(self, target: Target | str, *, port: int = 0, faults: Iterable[str | FaultSpec] = (),
                 overrides: Mapping[str, Any] | Iterable[str] | None = None, log_file: str | os.PathLike[str] | None
                 = None, env: Mapping[str, str] | None = None, host: str = "127.0.0.1",
                 extra_args: Iterable[str] = ()) -> None:
        self.target = target if isinstance(target, Target) else None
        self.host = host
        self._requested_port = port
        self.port = port
        self.faults = tuple(parse_fault(f) for f in faults)
        self.overrides = self._override_args(overrides)
        self._own_log = log_file is None
        self.log_file = Path(log_file) if log_file else Path(tempfile.mkstemp(prefix="ml4-sim-", suffix=".log")[1])
        # A Target object may carry in-memory overrides: hand the child exactly that object, as a YAML file
        # written next to the log (a run artifact, and no stray temp files).
        self.target_ref = (self._materialise(target, self.log_file.with_name(self.log_file.name + ".target.yaml"))
                           if isinstance(target, Target) else str(target))
        self.env = dict(env) if env is not None else None
        # Extra CLI arguments for other roles (e.g. a Dynamo frontend mode added later).
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _materialise(target: Target, path: Path) -> str:
        import yaml

        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as fh:
            yaml.safe_dump(target.model_dump(mode="json", exclude={"path"}), fh, sort_keys=False)
        return str(path)

    @staticmethod
    def _override_args(overrides: Mapping[str, Any] | Iterable[str] | None) -> list[str]:
        if overrides is None:
            return []
        if isinstance(overrides, Mapping):
            return _flatten("", overrides)
        return [str(o) for o in overrides]

    # ------------------------------------------------------------------ properties
    def argv(self) -> list[str]:
        args = [sys.executable, "-m", "pytest_ml4.sim", "--target", str(self.target_ref), "--host", self.host,
                "--port", str(self.port), "--log-file", str(self.log_file)]
        for f in self.faults:
            args += ["--fault", str(f)]
        for o in self.overrides:
            args += ["--set", o]
        return args + self.extra_args

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60.0) -> SimServer:
        if self.proc and self.proc.poll() is None:
            return self
        deadline = time.monotonic() + timeout
        for _attempt in range(3):
            if self._spawn_and_wait(deadline, timeout):
                return self
        raise SimServerError(f"simulator for {self.target_ref}: no free port after 3 attempts")

    def _spawn_and_wait(self, deadline: float, timeout: float) -> bool:
        """True once healthy; False if an auto-chosen port was taken meanwhile (retry); raises otherwise."""
        self.port = self._requested_port or free_port(self.host)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else {**os.environ, **self.env})
        stderr_path = self.log_file.with_suffix(self.log_file.suffix + ".stderr")
        self._stderr = open(stderr_path, "wb")  # noqa: SIM115 - the child writes to it until stop()
        self.proc = subprocess.Popen(self.argv(), env=env, stdout=subprocess.DEVNULL, stderr=self._stderr,
                                     start_new_session=True)
        url = self.url + "/health"
        while True:
            code = self.proc.poll()
            if code is not None:
                err = stderr_path.read_text(errors="replace").strip()[-2000:]
                self.stop()
                if not self._requested_port and "address already in use" in err.lower():
                    return False
                raise SimServerError(f"simulator for {self.target_ref} exited with code {code} before becoming "
                                     f"healthy\n--- log tail ({self.log_file}) ---\n{self.log_tail()}"
                                     + (f"\n--- stderr ---\n{err}" if err else ""))
            if self._own_process_listening():
                try:
                    if httpx.get(url, timeout=1.0).status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass
            if time.monotonic() > deadline:
                self.stop()
                raise SimServerError(f"simulator for {self.target_ref} not healthy on {url} after {timeout:.0f} s"
                                     f"\n--- log tail ({self.log_file}) ---\n{self.log_tail()}")
            time.sleep(0.05)

    def _own_process_listening(self) -> bool:
        # /health alone could be answered by a stranger on a reused port: our child logs its own start first.
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return False
        mark = f"Started server process [{self.pid}]"
        return mark in text and "Application startup complete." in text[text.rindex(mark):]

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)
            except ProcessLookupError:
                pass
        if getattr(self, "_stderr", None):
            self._stderr.close()

    def __repr__(self) -> str:
        return f"SimServer(target={self.target_ref!r}, url={self.url!r}, pid={self.pid})"
