"""The journald reader against a real ``journalctl`` reading a real journal file.

The tests write Journal Export Format, let Debian's ``systemd-journal-remote -o FILE.journal -`` turn it into a
journal file, and read it back with ``journalctl --file FILE.journal -o json -u UNIT`` through the reader, so the
JSON the reader parses is journalctl's own (byte-array MESSAGEs included). Needs scripts/install.d/20-journald.sh.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from checkout import FIXTURES_DIR

from pytest_ml4.logs import (
    CudaOom,
    JournaldLogReader,
    KvCacheSize,
    LogReadError,
    LogView,
)
from pytest_ml4.logs.journald import journal_export, journald_tool, write_journal

UNIT = "vllm-ml4.service"
BOOT_ID = "6f0c0d1e2a3b4c5d6e7f8091a2b3c4d5"
T0 = 1_793_556_482_000_000  # 2026-11-01 18:08:02 UTC in microseconds
INVOCATIONS = ["a1" * 16, "b2" * 16, "c3" * 16]


def _entries() -> list[dict[str, str | bytes]]:
    """The recorded crash loop as journald saw it: one invocation per boot, plus another unit's noise."""
    lines = (FIXTURES_DIR / "logs" / "rtxpro-oom-crashloop.log").read_text().splitlines()
    entries: list[dict[str, str | bytes]] = []
    boot = -1
    for i, line in enumerate(lines):
        if "vLLM server version" in line:
            boot += 1
        message: str | bytes = line
        if line.startswith("(APIServer"):
            # vLLM colours the prefix unless NO_COLOR is set; journalctl then prints MESSAGE as a byte array.
            prefix, rest = line.split(")", 1)
            message = f"\x1b[36m{prefix})\x1b[0m{rest}".encode()
        entries.append({"__REALTIME_TIMESTAMP": str(T0 + i * 1_000_000), "__MONOTONIC_TIMESTAMP": str(1000 + i),
                        "_BOOT_ID": BOOT_ID, "_SYSTEMD_UNIT": UNIT, "_SYSTEMD_INVOCATION_ID": INVOCATIONS[boot],
                        "_PID": str(2791 + 300 * boot), "PRIORITY": "6", "SYSLOG_IDENTIFIER": "vllm",
                        "MESSAGE": message})
        if i % 10 == 0:
            entries.append({"__REALTIME_TIMESTAMP": str(T0 + i * 1_000_000 + 1), "__MONOTONIC_TIMESTAMP": str(1000 + i),
                            "_BOOT_ID": BOOT_ID, "_SYSTEMD_UNIT": "litellm.service", "_PID": "99",
                            "MESSAGE": "litellm: GPU KV cache size: 1 tokens (another unit)"})
    return entries


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_journal(_entries(), tmp_path_factory.mktemp("journal") / "vllm.journal")


def test_export_format_framing() -> None:
    data = journal_export([{"A": "x", "MESSAGE": "two\nlines"}, {"B": b"\x1b[0m"}])
    assert data == b"A=x\nMESSAGE\n" + (9).to_bytes(8, "little") + b"two\nlines\n\nB\n" + (4).to_bytes(8, "little") \
        + b"\x1b[0m\n\n"


def test_journalctl_output_really_has_byte_array_messages(journal: Path) -> None:
    # Guards the premise of the byte-array handling: this is journalctl's own JSON, not an imitation.
    out = subprocess.run([str(journald_tool("journalctl")), "--file", str(journal), "-o", "json", "-u", UNIT],
                         capture_output=True, text=True, check=True).stdout
    assert '"MESSAGE":[27,91,51,54,109' in out.replace(" ", "")


def test_reads_the_unit_only_in_order_with_colour_stripped(journal: Path) -> None:
    records = JournaldLogReader(UNIT, journal_file=journal).read()
    expected = (FIXTURES_DIR / "logs" / "rtxpro-oom-crashloop.log").read_text().splitlines()
    assert [r.text for r in records] == expected
    assert all("another unit" not in r.text for r in records)
    assert records[0].time == T0 / 1e6 and records[0].boot_id == INVOCATIONS[0]
    assert records[0].extra["unit"] == UNIT


def test_since_last_boot_is_the_last_invocation(journal: Path) -> None:
    current = JournaldLogReader(UNIT, journal_file=journal).since_last_boot()
    assert {r.boot_id for r in current} == {INVOCATIONS[2]}
    view = LogView(current)
    assert [k.tokens for k in view.all(KvCacheSize)] == [274_934]
    (oom,) = view.all(CudaOom)
    stamped = [r for r in view.records[:oom.position] if "ERROR 11-01" in r.text]
    assert oom.fused_moe and "19:07:15" in stamped[-1].text


def test_since_is_passed_to_journalctl(journal: Path) -> None:
    reader = JournaldLogReader(UNIT, journal_file=journal)
    everything = reader.read()
    cut = everything[50].time
    later = reader.read(since=cut)
    assert [r.text for r in later] == [r.text for r in everything[50:]]
    assert "--since" in reader.command(since=cut)


def test_over_ssh_the_remote_command_is_one_quoted_string(journal: Path) -> None:
    seen: list[list[str]] = []

    def ssh_hop(argv: list[str]) -> subprocess.CompletedProcess[str]:
        # Stands in for the ssh hop only: the remote side runs the quoted command with the real journalctl.
        seen.append(argv)
        remote = shlex.split(argv[-1])
        remote[0] = str(journald_tool("journalctl"))
        return subprocess.run(remote, capture_output=True, text=True, check=False)

    reader = JournaldLogReader(UNIT, ssh_host="gpu node", journal_file=journal, runner=ssh_hop)
    assert len(reader.read()) == len(JournaldLogReader(UNIT, journal_file=journal).read())
    assert seen[0][:6] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "gpu node"]
    assert shlex.split(seen[0][-1])[:3] == ["journalctl", "-u", UNIT]


def test_journalctl_failure_is_reported_with_its_stderr(tmp_path: Path) -> None:
    reader = JournaldLogReader(UNIT, journal_file=tmp_path / "missing.journal")
    with pytest.raises(LogReadError, match="missing.journal"):
        reader.read()


def test_write_journal_wants_the_journal_suffix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\*\.journal"):
        write_journal([], tmp_path / "x.log")


def test_live_unit_reads_only_its_current_invocation(journal: Path) -> None:
    calls: list[list[str]] = []

    def host(argv: list[str]) -> subprocess.CompletedProcess[str]:
        # Plays the machine running the unit: systemctl names the current invocation, journalctl is the real one.
        calls.append(argv)
        if argv[0] == "systemctl":
            return subprocess.CompletedProcess(argv, 0, INVOCATIONS[1] + "\n", "")
        return subprocess.run([str(journald_tool("journalctl")), *argv[1:]], capture_output=True, text=True,
                              check=False)

    reader = JournaldLogReader(UNIT, journal_file=journal, runner=host, invocation_lookup=True)
    current = reader.since_last_boot()
    assert calls[0] == ["systemctl", "show", "-p", "InvocationID", "--value", UNIT]
    assert f"_SYSTEMD_INVOCATION_ID={INVOCATIONS[1]}" in calls[1]
    assert {r.boot_id for r in current} == {INVOCATIONS[1]}
    assert "18:13:05" in current[0].text and "vLLM server version" in current[0].text


def test_unknown_invocation_falls_back_to_the_unit_history(journal: Path) -> None:
    def host(argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "systemctl":
            return subprocess.CompletedProcess(argv, 0, "\n", "")
        return subprocess.run([str(journald_tool("journalctl")), *argv[1:]], capture_output=True, text=True,
                              check=False)

    current = JournaldLogReader(UNIT, journal_file=journal, runner=host, invocation_lookup=True).since_last_boot()
    assert {r.boot_id for r in current} == {INVOCATIONS[2]}


def test_multiline_and_invalid_utf8_messages(tmp_path: Path) -> None:
    refusal = ("ValueError: Free memory on device cuda:0 (93.94/95.06 GiB) on startup is less than desired GPU memory "
               "utilization (0.99, 94.11 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
               "processes.")
    base = {"_BOOT_ID": BOOT_ID, "_SYSTEMD_UNIT": UNIT, "_PID": "7", "__MONOTONIC_TIMESTAMP": "5"}
    entries = [{**base, "__REALTIME_TIMESTAMP": str(T0), "MESSAGE": f"Traceback (most recent call last):\n{refusal}"},
               {**base, "__REALTIME_TIMESTAMP": str(T0 + 1), "MESSAGE": b"bad \xff\xfe bytes"}]
    journal = write_journal(entries, tmp_path / "odd.journal")
    records = JournaldLogReader(UNIT, journal_file=journal).read()
    assert [r.text for r in records] == ["Traceback (most recent call last):", refusal, "bad \ufffd\ufffd bytes"]
    assert [e.signature for e in LogView(records).failures()] == ["startup_refused"]
