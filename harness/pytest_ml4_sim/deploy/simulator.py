"""``SimServer``: start/stop the simulator as a subprocess on a free loopback port (Python API).

A :class:`~pytest_ml4_sim.deploy.launcher.ProcessLauncher` of ``python -m pytest_ml4_sim.deploy.sim_cli``: ready once its own
log says it started and ``/health`` answers 200; its stderr goes to a file beside the log (quoted in start errors);
the engine gets SIGTERM alone (it drains). The API key travels in the child's environment, never in argv. What
only the simulator has: the restart into a standby prepared while the old engine serves.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from pytest_ml4.report.redact import mask_secret_args
from pytest_ml4.target.model import Target
from pytest_ml4_sim.deploy.launcher import LaunchError, ProcessLauncher, file_sizes
from pytest_ml4_sim.sim.faults import FaultSpec, parse_fault


class SimServerError(LaunchError):
    """The simulator did not come up (the message carries the reason and the log tail)."""


def _flatten(prefix: str, value: Any) -> list[str]:
    if isinstance(value, Mapping):
        out: list[str] = []
        for k, v in value.items():
            out += _flatten(f"{prefix}.{k}" if prefix else str(k), v)
        return out
    import json

    # JSON is valid YAML, so parse_override on the other side restores the exact value.
    return [f"{prefix}={json.dumps(value)}"]


class SimServer(ProcessLauncher):
    """A simulator subprocess for one target."""

    error = SimServerError
    stop_leader_only = True   # the engine drains; its group goes after it
    poll_s = 0.05

    def __init__(self, target: Target | str, *, port: int = 0, faults: Iterable[str | FaultSpec] = (),
                 overrides: Mapping[str, Any] | Iterable[str] | None = None, log_file: str | os.PathLike[str] | None
                 = None, env: Mapping[str, str] | None = None, host: str = "127.0.0.1",
                 extra_args: Iterable[str] = ()) -> None:
        super().__init__(Path(log_file) if log_file else Path(tempfile.mkstemp(prefix="ml4-sim-", suffix=".log")[1]),
                         host=host, port=port)
        self.target = target if isinstance(target, Target) else None
        #: Restarts completed: the standby started next is boot generation ``restarts + 1`` (``--generation``).
        self.restarts = 0
        self.faults = tuple(parse_fault(f) for f in faults)
        self.overrides = self._override_args(overrides)
        # A Target object may carry in-memory overrides: hand the child exactly that object, as a YAML file
        # written next to the log (a run artifact, and no stray temp files).
        self.target_ref = (self._materialise(target, self.log_file.with_name(self.log_file.name + ".target.yaml"))
                           if isinstance(target, Target) else str(target))
        self.name = f"simulator for {self.target_ref}"
        self.env = dict(env) if env is not None else None
        # Extra CLI arguments for other roles (e.g. a Dynamo frontend mode added later).
        self.extra_args = list(extra_args)
        #: Where the serving engine's stderr goes (quoted in start errors), and the standby's.
        self._stderr = self._standby_stderr = self.log_file.with_suffix(self.log_file.suffix + ".stderr")
        #: The next engine process waiting in standby, with its hold file (``prepare_restart``). It stays here,
        #: where ``stop()`` finds it, until ``restart()`` makes it the serving process.
        self._standby: tuple[subprocess.Popen[bytes], Path] | None = None
        #: Guards the hand-over of ``_standby`` between ``restart()`` and a ``stop()`` from another thread.
        self._standby_lock = threading.Lock()

    @staticmethod
    def _materialise(target: Target, path: Path) -> str:
        import yaml

        path.parent.mkdir(parents=True, exist_ok=True)
        data = target.model_dump(mode="json", exclude={"path"})
        # A run artifact: a key in the engine's flags is masked (the simulator takes its key from the environment).
        data["engine"]["extra_args"] = mask_secret_args(data["engine"].get("extra_args") or [])
        with open(path, "w") as fh:
            yaml.safe_dump(data, fh, sort_keys=False)
        return str(path)

    @staticmethod
    def _override_args(overrides: Mapping[str, Any] | Iterable[str] | None) -> list[str]:
        if overrides is None:
            return []
        if isinstance(overrides, Mapping):
            # The child's command line is visible to every user of the machine: no key in engine.extra_args.
            engine = overrides.get("engine")
            if isinstance(engine, Mapping) and isinstance(engine.get("extra_args"), list):
                overrides = {**overrides, "engine": {**engine, "extra_args": mask_secret_args(engine["extra_args"])}}
            return _flatten("", overrides)
        return [str(o) for o in overrides]

    # ------------------------------------------------------------------ properties
    def argv(self) -> list[str]:
        args = [sys.executable, "-m", "pytest_ml4_sim.deploy.sim_cli", "--target", str(self.target_ref), "--host", self.host,
                "--port", str(self.port), "--log-file", str(self.log_file)]
        for f in self.faults:
            args += ["--fault", str(f)]
        for o in self.overrides:
            args += ["--set", o]
        return args + self.extra_args

    # ------------------------------------------------------------------ lifecycle
    def child_env(self) -> dict[str, str]:
        return dict(os.environ if self.env is None else {**os.environ, **self.env})

    def open_output(self) -> IO[bytes]:
        """The stderr file, truncated: its text decides whether a failed start retries on another port."""
        self._stderr = self._stderr_file(standby=False)
        return open(self._stderr, "wb")

    def _stderr_file(self, standby: bool) -> Path:
        # A standby must not truncate the stderr file of the process it replaces: the two names alternate.
        suffix = ".standby.stderr" if standby and not self._stderr.name.endswith(".standby.stderr") else ".stderr"
        return self.log_file.with_suffix(self.log_file.suffix + suffix)

    def _stderr_tail(self) -> str:
        try:
            return self._stderr.read_text(errors="replace").strip()[-2000:]
        except OSError:
            return ""

    def details(self) -> str:
        err = self._stderr_tail()
        return super().details() + (f"\n--- stderr ---\n{err}" if err else "")

    def progress(self) -> Hashable:
        return file_sizes(self.log_file, self._stderr)

    def port_taken(self) -> bool:
        return not self._requested_port and "address already in use" in self._stderr_tail().lower()

    def ready(self) -> bool:
        return self._own_process_listening() and super().ready()

    def _own_process_listening(self) -> bool:
        # /health alone could be answered by a stranger on a reused port: our child logs its own start first.
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return False
        mark = f"Started server process [{self.pid}]"
        return mark in text and "Application startup complete." in text[text.rindex(mark):]

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM the engine (it drains), SIGKILL after ``timeout``; a prepared standby is ended too."""
        super().stop(timeout)
        with self._standby_lock:
            standby, self._standby = self._standby, None
        if standby is not None:
            self.proc, self._stderr = standby[0], self._standby_stderr
            super().stop(timeout)
            self._remove_hold(standby[1])

    def prepare_restart(self, timeout: float = 60.0) -> None:
        """Start the next engine process in standby (imports, tokenizer) while this one serves; idempotent.

        ``restart()`` does it itself when nobody did; the restart scenario calls it before its streams start
        (``Controller.prepare``), so the restart then stops the engine at once, with the streams in flight.
        """
        if self._standby is not None and self._standby[0].poll() is None:
            return
        hold = self.log_file.with_name(f"{self.log_file.name}.hold-{time.time_ns()}")
        self._requested_port = self.port or self._requested_port
        self._standby_stderr = self._stderr_file(standby=True)
        standby = self._popen([*self.argv(), "--hold-file", str(hold), "--generation", str(self.restarts + 1)],
                              open(self._standby_stderr, "wb"))  # noqa: SIM115 - _popen closes it
        self._standby = (standby, hold)
        try:
            self._wait_file(Path(str(hold) + ".ready"), standby, time.monotonic() + timeout, "standby start")
        except BaseException:
            self.stop()
            raise

    def restart(self, timeout: float | None = None) -> SimServer:
        """Stop and start again on the same port (clients keep their base URL), with the target's modelled outage.

        The next process is prepared in standby (:meth:`prepare_restart`) while the old one still serves; after
        ``delayed_stop`` (fault) the old one gets SIGTERM and drains; once it has exited the standby is released
        to bind at ``stop + sim.restart_outage_s``. So the port is closed for the modelled figure (plus the
        drain), not for however long this machine takes to start Python (that once made a 6.3 s outage on a busy box).
        """
        timeout = self.default_timeout if timeout is None else timeout
        outage_s, delay_s = self.restart_profile()
        self.prepare_restart(timeout)
        if self._standby is None:
            raise SimServerError(f"simulator for {self.target_ref}: no standby engine to restart into")
        # Read now, left in place: a stop() meanwhile (another thread) must find the standby and end it too.
        prepared = self._standby
        standby, hold = prepared
        self._stop_delay(delay_s)
        stopped_at = time.time()
        super().stop()
        with self._standby_lock:
            if self._standby is not prepared:  # stop() ended it during the delay or the drain
                raise SimServerError(f"simulator for {self.target_ref}: stopped during the restart")
            self._standby = None
            self.proc, self._stderr = standby, self._standby_stderr
        try:
            tmp = hold.with_name(hold.name + ".tmp")
            tmp.write_text(f"{stopped_at + outage_s:.6f}")
            tmp.replace(hold)  # atomic: the standby never reads half a number
            self.wait_ready(timeout, time.monotonic() + timeout)
            self.restarts += 1
        except BaseException:
            self.stop()
            raise
        finally:
            self._remove_hold(hold)
        return self

    def _stop_delay(self, seconds: float) -> None:
        """The old engine keeps serving, as under systemd's stop delay (a hook: tests act inside the window)."""
        time.sleep(seconds)

    @staticmethod
    def _remove_hold(hold: Path) -> None:
        for f in (hold, Path(str(hold) + ".ready"), hold.with_name(hold.name + ".tmp")):
            f.unlink(missing_ok=True)

    def restart_profile(self) -> tuple[float, float]:
        """(modelled outage ``sim.restart_outage_s``, ``delayed_stop`` fault seconds) for this simulator."""
        from pytest_ml4_sim.deploy.sim_cli import load_with_overrides, target_faults
        from pytest_ml4_sim.sim.faults import ActiveFaults

        target = self.target if self.target is not None else load_with_overrides(str(self.target_ref),
                                                                                   self.overrides)
        faults = ActiveFaults([*target_faults(target), *self.faults])
        return target.sim.restart_outage_s, faults.value("delayed_stop", 0.0)

    def _wait_file(self, path: Path, proc: subprocess.Popen[bytes], deadline: float, what: str) -> None:
        while not path.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                err = self._standby_stderr.read_text(errors="replace").strip()[-2000:]
                raise SimServerError(f"simulator for {self.target_ref}: {what} "
                                     + (f"exited with code {proc.returncode}" if proc.returncode is not None
                                        else "timed out") + (f"\n--- stderr ---\n{err}" if err else ""))
            time.sleep(0.02)

    def __repr__(self) -> str:
        return f"SimServer(target={self.target_ref!r}, url={self.url!r}, pid={self.pid})"
