"""Log reader over journald: ``journalctl -u UNIT -o json --since ...``, on this host or over ssh.

Each JSON record's ``MESSAGE`` is a string, or an array of byte values when the message is not valid UTF-8 or
holds control characters (vLLM's coloured prefix does), or null; all three are handled. A restart of the unit
starts a new ``_SYSTEMD_INVOCATION_ID``, which is how ``since_last_boot`` tells engines apart before it looks for
the server-start line.

Also here: :func:`journal_export` writes records in the Journal Export Format that ``systemd-journal-remote``
turns into a real journal file (the reader's own tests go through it), and the locators of the two binaries
installed by ``scripts/install.d/20-journald.sh``.
"""

from __future__ import annotations

import json
import shlex
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_ml4.logs.reader import LogReader
from pytest_ml4.logs.records import (
    LogRecord,
    Since,
    filter_since,
    line_time,
    since_epoch,
    strip_ansi,
)
from pytest_ml4.runtime import processes
from pytest_ml4.runtime.installed import ToolMissing, tools_dir

#: ssh never prompts: a missing key must fail the read, not hang the session.
SSH_COMMAND: tuple[str, ...] = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
_SYSTEM_DIRS = ("/usr/bin", "/bin", "/lib/systemd", "/usr/lib/systemd")

Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


class LogReadError(RuntimeError):
    """journalctl (or ssh) failed; the message has the command and its stderr."""


def journald_tool(name: str) -> Path:
    """``journalctl`` or ``systemd-journal-remote``: the install step's link, else the system's copy."""
    for d in sorted(tools_dir().glob("journald-*/bin"), reverse=True):
        if (d / name).exists():
            return d / name
    found = shutil.which(name)
    if found:
        return Path(found)
    for d in _SYSTEM_DIRS:
        if Path(d, name).is_file():
            return Path(d, name)
    raise ToolMissing(f"{name} not found; run scripts/install.d/20-journald.sh (Debian packages systemd and "
                      "systemd-journal-remote)")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return processes.run(argv, capture_output=True, text=True, timeout=120, check=False)


def message_text(value: Any) -> str:
    """A journal MESSAGE as text: str as is, a byte array decoded (invalid UTF-8 replaced), null as ''."""
    if value is None:
        return ""
    if isinstance(value, list):
        return bytes(int(b) & 0xFF for b in value).decode("utf-8", errors="replace")
    return str(value)


def records_from_json(lines: Iterable[str], source: str = "") -> list[LogRecord]:
    """Records from ``journalctl -o json`` output, one per line of each MESSAGE."""
    out: list[LogRecord] = []
    for raw in lines:
        raw = raw.strip()
        if not raw or not raw.startswith("{"):
            continue
        entry = json.loads(raw)
        usec = entry.get("__REALTIME_TIMESTAMP")
        when = int(usec) / 1e6 if usec else None
        pid = entry.get("_PID")
        invocation = entry.get("_SYSTEMD_INVOCATION_ID") or None
        unit = entry.get("_SYSTEMD_UNIT") or entry.get("UNIT") or ""
        for text in message_text(entry.get("MESSAGE")).splitlines() or [""]:
            text = strip_ansi(text)
            # Journald's own time is when the line arrived; the engine's stamp (when present) is kept in extra.
            stamp = line_time(text)
            out.append(LogRecord(text=text, time=when, source=source, index=len(out),
                                 pid=int(pid) if pid and str(pid).isdigit() else None, boot_id=invocation,
                                 extra={"unit": unit, "engine_time": "" if stamp is None else f"{stamp:.0f}"}))
    return out


class JournaldLogReader(LogReader):
    """Lines of a systemd unit from journald, locally, from a journal file, or over ``ssh HOST``."""

    def __init__(self, unit: str, *, ssh_host: str | None = None, journal_file: str | Path | None = None,
                 journalctl: str | None = None, runner: Runner | None = None,
                 ssh: Sequence[str] = SSH_COMMAND, invocation_lookup: bool | None = None) -> None:
        self.unit = unit
        self.ssh_host = ssh_host
        self.journal_file = Path(journal_file) if journal_file else None
        self._journalctl = journalctl
        self._runner = runner or _run
        self._ssh = tuple(ssh)
        # A live unit knows its current invocation; a journal file has no systemd to ask.
        self.invocation_lookup = self.journal_file is None if invocation_lookup is None else invocation_lookup

    def describe(self) -> str:
        where = f" on {self.ssh_host}" if self.ssh_host else ""
        file = f" (journal file {self.journal_file})" if self.journal_file else ""
        return f"journald unit {self.unit}{where}{file}"

    def _wrap(self, local: list[str]) -> list[str]:
        return [*self._ssh, self.ssh_host, shlex.join(local)] if self.ssh_host else local

    def command(self, since: Since = None, invocation: str | None = None) -> list[str]:
        """The argv that reads the unit, or one invocation of it (wrapped in ssh for a remote host)."""
        exe = self._journalctl or ("journalctl" if self.ssh_host else str(journald_tool("journalctl")))
        match = [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-u", self.unit]
        # --all: journalctl otherwise prints fields over 4096 bytes (long tracebacks) as null.
        local = [exe, *match, "-o", "json", "--all", "--no-pager"]
        if self.journal_file:
            local += ["--file", str(self.journal_file)]
        t = since_epoch(since)
        if t is not None:
            local += ["--since", f"@{int(t)}"]
        return self._wrap(local)

    def _call(self, argv: list[str]) -> str:
        try:
            proc = self._runner(argv)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise LogReadError(f"{shlex.join(argv)} failed: {err}") from None
        if proc.returncode != 0:
            raise LogReadError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        return proc.stdout

    def read(self, since: Since = None) -> list[LogRecord]:
        out = self._call(self.command(since))
        return filter_since(records_from_json(out.splitlines(), self.describe()), since)

    def current_invocation(self) -> str | None:
        """The unit's current ``InvocationID`` from systemctl (None when systemd does not know one)."""
        out = self._call(self._wrap(["systemctl", "show", "-p", "InvocationID", "--value", self.unit])).strip()
        return out if out and all(c in "0123456789abcdef" for c in out) else None

    def since_last_boot(self, since: Since = None) -> list[LogRecord]:
        """The current invocation's lines only (no need to read the unit's whole history), cut at its boot line."""
        from pytest_ml4.logs.signatures import last_boot_start

        invocation = self.current_invocation() if self.invocation_lookup else None
        if invocation is None:
            return super().since_last_boot(since)
        out = self._call(self.command(since, invocation=invocation))
        records = filter_since(records_from_json(out.splitlines(), self.describe()), since)
        return records[last_boot_start(records):]


# ---------------------------------------------------------------------------------------------- export format
def journal_export(entries: Iterable[Mapping[str, str | bytes]]) -> bytes:
    """Entries in the Journal Export Format (systemd's JOURNAL_EXPORT_FORMATS): ``KEY=value`` lines, or for values
    with newlines or binary data ``KEY\\n`` + little-endian 64-bit length + raw bytes + ``\\n``; a blank line ends
    each entry. Feed it to ``systemd-journal-remote -o FILE.journal -``."""
    out = bytearray()
    for entry in entries:
        for key, value in entry.items():
            data = value if isinstance(value, bytes) else str(value).encode()
            if b"\n" in data or any(b < 0x20 and b != 0x09 for b in data):
                out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
            else:
                out += key.encode() + b"=" + data + b"\n"
        out += b"\n"
    return bytes(out)


def write_journal(entries: Iterable[Mapping[str, str | bytes]], journal_file: str | Path) -> Path:
    """Write a real journal file from ``entries`` through ``systemd-journal-remote``; returns its path."""
    path = Path(journal_file)
    if not path.name.endswith(".journal"):
        raise ValueError(f"systemd-journal-remote only writes files named *.journal, not {path.name}")
    argv = [str(journald_tool("systemd-journal-remote")), "-o", str(path), "-"]
    proc = processes.run(argv, input=journal_export(entries), capture_output=True, timeout=60, check=False)
    if proc.returncode != 0 or not path.is_file():
        raise LogReadError(f"{shlex.join(argv)} exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace').strip()[-2000:]}")
    return path
