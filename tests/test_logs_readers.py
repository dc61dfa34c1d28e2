"""Log records and the file reader: time stamps, --since, the current boot, colour codes, reader selection."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import pytest
from checkout import FIXTURES_DIR

from pytest_ml4.logs import (
    FileLogReader,
    JournaldLogReader,
    LogReader,
    LogReadError,
    LogView,
    ServerStart,
    reader_for_target,
    records_from_text,
    start_failure_summary,
)
from pytest_ml4.logs.records import LogRecord, line_time
from pytest_ml4.target.model import load_target

LOGS = FIXTURES_DIR / "logs"


def test_missing_file_reads_as_no_lines(tmp_path: Path) -> None:
    assert FileLogReader(tmp_path / "absent.log").read() == []
    assert FileLogReader(tmp_path / "absent.log").since_last_boot() == []


def test_since_last_boot_cuts_at_the_last_server_start() -> None:
    reader = FileLogReader(LOGS / "rtxpro-oom-crashloop.log")
    everything, current = reader.read(), reader.since_last_boot()
    assert len(everything) > len(current) > 0
    assert "vLLM server version" in current[0].text and "19:02:11" in current[0].text
    assert [r.text for r in current] == [r.text for r in everything[-len(current):]]


def test_engine_start_is_the_fallback_boot_marker() -> None:
    text = ("(EngineCore_DP0 pid=1) INFO 11-01 10:00:00 [core.py:93] Initializing a V1 LLM engine (v0.33.0) with config: x\n"
            "old line\n"
            "(EngineCore_DP0 pid=2) INFO 11-01 11:00:00 [core.py:93] Initializing a V1 LLM engine (v0.33.0) with config: y\n"
            "new line\n")

    class Mem(LogReader):
        def read(self, since=None):
            return records_from_text(text)

        def describe(self) -> str:
            return "memory"

    assert [r.text for r in Mem().since_last_boot()][-1] == "new line"
    assert len(Mem().since_last_boot()) == 2


def test_no_boot_marker_keeps_everything() -> None:
    reader = FileLogReader(LOGS / "dynamo-health-canary.log")
    assert reader.since_last_boot() == reader.read()


def test_lines_without_a_stamp_take_the_previous_lines_time() -> None:
    recs = FileLogReader(LOGS / "rtxpro-oom-crashloop.log").read()
    oom = next(r for r in recs if r.text.startswith("MemoryError"))
    before = next(r for r in reversed(recs[:oom.index]) if r.pid is not None)
    assert oom.time == before.time is not None
    assert oom.pid is None and before.pid == 2851


def test_since_drops_older_records() -> None:
    reader = FileLogReader(LOGS / "rtxpro-oom-crashloop.log")
    cut = line_time("(APIServer pid=4410) INFO 11-01 19:02:11 [api_server.py:1975] x")
    assert cut is not None
    recent = reader.read(since=cut)
    assert recent[0].text.startswith("(APIServer pid=4410)")
    assert reader.read(since=dt.datetime.fromtimestamp(cut)) == recent


def test_vllm_and_iso_stamps() -> None:
    t = line_time("(APIServer pid=1) INFO 11-01 18:12:34 [x.py:1] m", year=2026)
    assert dt.datetime.fromtimestamp(t) == dt.datetime(2026, 11, 1, 18, 12, 34)
    iso = line_time("2026-11-20T09:22:13.004519Z  WARN nixl: m")
    assert iso == pytest.approx(dt.datetime(2026, 11, 20, 9, 22, 13, 4519, tzinfo=dt.UTC).timestamp())
    assert line_time("Traceback (most recent call last):") is None


def test_colour_codes_are_stripped() -> None:
    (rec,) = records_from_text("\x1b[36m(APIServer pid=7)\x1b[0m INFO 11-01 18:00:00 [x.py:1] GPU KV cache size: "
                               "1,000 tokens, Maximum concurrency for 1,000 tokens per request: 1.00x")
    assert rec.text.startswith("(APIServer pid=7) INFO") and rec.pid == 7
    assert LogView([rec]).events[0].signature == "kv_cache_size"


def test_boot_groups_follow_restart_ids() -> None:
    recs = [LogRecord("a", boot_id=None), LogRecord("b", boot_id="1"), LogRecord("c", boot_id="1"),
            LogRecord("d", boot_id="2"), LogRecord("e", boot_id=None)]
    groups = FileLogReader("unused").boot_groups(recs)
    assert [[r.text for r in g] for g in groups] == [["a", "b", "c"], ["d", "e"]]


def test_reader_for_the_simulator_is_its_log_file(tmp_path: Path) -> None:
    sim = SimpleNamespace(log_file=tmp_path / "engine.log")
    reader = reader_for_target(load_target("rtxpro6000-tp8"), sim=sim)
    assert isinstance(reader, FileLogReader) and reader.path == tmp_path / "engine.log"


def test_reader_for_a_journald_target_goes_over_ssh_when_the_host_is_set() -> None:
    t = load_target("rtxpro6000-tp8")
    remote = reader_for_target(t, env={"ML4_RTXPRO_SSH": "gpu-node-1"})
    assert isinstance(remote, JournaldLogReader)
    argv = remote.command(since=1_700_000_000.5)
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"] and argv[5] == "gpu-node-1"
    assert argv[6] == "journalctl -u vllm-ml4.service -o json --all --no-pager --since @1700000000"
    local = reader_for_target(t, env={})
    assert isinstance(local, JournaldLogReader) and local.ssh_host is None
    assert local.command()[1:5] == ["-u", "vllm-ml4.service", "-o", "json"]


def test_reader_for_a_kubernetes_target_is_the_kubernetes_reader_or_says_why_not() -> None:
    t = load_target("gb300-agg")
    try:
        reader = reader_for_target(t, env={"ML4_NAMESPACE": "ml4"})
    except LogReadError as err:
        assert "Kubernetes" in str(err)
    else:
        assert isinstance(reader, LogReader) and type(reader).__name__ == "KubernetesLogReader"


def test_start_failure_summary_quotes_the_refusal() -> None:
    text = start_failure_summary(LOGS / "rtxpro-startup-refused.log")
    assert "[startup_refused] ValueError: Free memory on device cuda:0 (93.94/95.06 GiB)" in text
    assert "last 20 lines of" in text


def test_server_start_event_of_the_current_boot() -> None:
    view = LogView(FileLogReader(LOGS / "rtxpro-stable.log").since_last_boot())
    start = view.first(ServerStart)
    assert start is not None and start.signature == "server_start"


def test_a_file_window_holds_the_lines_appended_since_its_mark(tmp_path: Path) -> None:
    """uvicorn's access lines carry no stamp and take the one before them: a window by time alone was empty when no
    stamped line fell inside it. A file reader's mark counts lines; by time again once the file shrank."""
    from pytest_ml4.logs import FileLogReader

    log = tmp_path / "engine.log"
    log.write_text("(APIServer pid=1) INFO 01-01 00:00:01 [launcher.py:54] Route: /metrics, Methods: GET\n")
    reader = FileLogReader(log)
    mark = reader.mark()
    with log.open("a") as fh:
        fh.write('INFO:     127.0.0.1:42374 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
    assert [r.text for r in reader.read(since=mark.time)] == []
    assert [r.text[:9] for r in reader.read_from(mark)] == ["INFO:    "]
    log.write_text("")
    assert reader.read_from(mark) == []
