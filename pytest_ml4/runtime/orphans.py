"""Processes a killed process leaves behind in its process group, found and ended (Linux ``/proc``, no psutil).

Real ``dynamo.vllm`` spawns vLLM's EngineCore, which spawns the CPU Worker; after SIGKILL of the main process both
stay alive (about 2.9 GB, 75 s and more; shared/reference/real-dynamo-vllm.md "Worker loss"), and the EngineCore
needs SIGKILL. The embedded deployment starts every process in its own session (``start_new_session=True``), so
its process group id is the main process's pid and every descendant that did not leave the group is found by
``pgid`` alone, even once re-parented to init.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
#: How long ending the leftovers may take before they are reported as surviving.
END_TIMEOUT_S = 10.0
POLL_S = 0.05


@dataclass(frozen=True)
class Leftover:
    """One process still alive in a group whose leader was killed."""

    pid: int
    name: str       # the process's own name (vLLM renames its children: ``VLLM::EngineCore``, ``VLLM::Worker``)
    rss_mib: float

    def line(self) -> str:
        return f"pid {self.pid} {self.name} ({self.rss_mib:.0f} MiB RSS)"


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the ``(comm)`` field (comm may hold spaces and parentheses), or None if gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def _name(pid: int) -> str:
    """The process's title: argv[0] as it set it (vLLM's ``VLLM::EngineCore``; ``comm`` cuts at 15 characters),
    else ``comm``."""
    try:
        argv0 = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace").strip()
        if argv0:
            return os.path.basename(argv0.split()[0])
        return (PROC / str(pid) / "comm").read_text().strip()
    except (OSError, IndexError):
        return "?"


def _rss_mib(pid: int) -> float:
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def group_members(pgid: int) -> list[Leftover]:
    """The live (not zombie) processes whose process group is ``pgid``."""
    out = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # fields[0] is the state, fields[2] the process group (proc(5): state ppid pgrp ...)
        if fields is None or len(fields) < 3 or fields[0] == "Z" or int(fields[2]) != pgid:
            continue
        pid = int(entry.name)
        out.append(Leftover(pid, _name(pid), _rss_mib(pid)))
    return sorted(out, key=lambda p: p.pid)


def end_group(pgid: int, timeout: float = END_TIMEOUT_S) -> tuple[list[Leftover], list[Leftover]]:
    """SIGKILL whatever is left of process group ``pgid``; returns (what was found, what still lives after
    ``timeout``). The leader itself must already be dead and reaped or it is counted too."""
    found = group_members(pgid)
    if not found:
        return [], []
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return found, []
    deadline = time.monotonic() + timeout
    left = group_members(pgid)
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = group_members(pgid)
    return found, left
