"""Restart controller for a systemd unit (``systemctl restart``), on this host or over ssh.

Readiness: a new invocation of the unit (``InvocationID`` changed, so an old process answering cannot pass),
the unit ``active``, the engine's ``/health`` 200 and the model in ``/v1/models``.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from typing import Any

from pytest_ml4.control.base import (
    Check,
    Controller,
    Progress,
    RestartError,
    health_check,
    model_listed_check,
)
from pytest_ml4.runtime import processes

#: ssh never prompts: a missing key must fail the restart, not hang the session.
SSH_COMMAND = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
#: How long one systemctl call may take (``restart`` returns once the unit's process is started).
COMMAND_TIMEOUT_S = 120.0


class SystemdController(Controller):
    """``systemctl restart UNIT`` locally or on ``ssh_host``; waits until the engine serves again."""

    kind = "systemd"

    def __init__(self, unit: str, *, root_url: str, base_url: str, model: str, ssh_host: str | None = None,
                 api_key: str | None = None, timeout_s: float = 1200.0,
                 systemctl: Sequence[str] = ("systemctl",), ssh: Sequence[str] = SSH_COMMAND) -> None:
        super().__init__(timeout_s)
        self.unit = unit
        self.ssh_host = ssh_host
        self.root_url = root_url
        self.base_url = base_url
        self.model = model
        self._api_key = api_key
        self._systemctl = tuple(systemctl)
        self._ssh = tuple(ssh)
        self._old_invocation: str | None = None

    def describe(self) -> str:
        return f"systemd unit {self.unit}" + (f" on {self.ssh_host}" if self.ssh_host else "")

    def command(self, *args: str) -> list[str]:
        """The argv for one systemctl call (wrapped in ssh when the unit is remote)."""
        local = [*self._systemctl, *args]
        if self.ssh_host:
            return [*self._ssh, self.ssh_host, shlex.join(local)]
        return local

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = self.command(*args)
        try:
            return processes.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise RestartError(f"{shlex.join(argv)} failed: {err}") from None

    def invocation_id(self) -> str:
        return self._run("show", "-p", "InvocationID", "--value", self.unit).stdout.strip()

    incarnation_source = "systemd's InvocationID of the unit, sampled before and after each request"

    def incarnation(self) -> str | None:
        # A new InvocationID per start of the unit (systemd.exec(5)); empty while the unit is stopped.
        try:
            return self.invocation_id() or None
        except Exception:  # noqa: BLE001 - unknown is a state here (ssh hiccup), never a verdict
            return None

    def trigger(self, progress: Progress | None = None) -> dict[str, Any]:
        self._old_invocation = self.invocation_id()
        done = self._run("restart", self.unit)
        if done.returncode != 0:
            raise RestartError(f"{shlex.join(self.command('restart', self.unit))} exited {done.returncode}: "
                               f"{(done.stderr or done.stdout).strip()[:300]}")
        return {"unit": self.unit, "ssh_host": self.ssh_host, "old_invocation": self._old_invocation}

    def _new_invocation(self) -> str | None:
        now = self.invocation_id()
        if not now:
            return "no InvocationID (unit not running)"
        return None if now != self._old_invocation else f"InvocationID still {now}"

    def _active(self) -> str | None:
        state = self._run("is-active", self.unit).stdout.strip()
        return None if state == "active" else f"is-active: {state or 'unknown'}"

    def ready_checks(self) -> list[tuple[str, Check]]:
        return [(f"a new invocation of {self.unit}", self._new_invocation),
                (f"{self.unit} active", self._active),
                ("engine /health 200", health_check(self.root_url)),
                (f"{self.model} in /v1/models", model_listed_check(self.base_url, self.model, self._api_key))]
