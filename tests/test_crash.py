"""A worker's crash under a stream (pytest_ml4/control/crash.py) and the processes a killed worker leaves behind
(pytest_ml4/runtime/orphans.py), without Dynamo: the verdicts are judged on real Dynamo 1.6.1 + ``dynamo.vllm``
streams (fixtures/transcripts/dynamo-vllm-1.6.1/kv/), the leftover processes on a parent that spawns a child and
is SIGKILLed, as ``dynamo.vllm``'s EngineCore outlives its main process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checkout import FIXTURES_DIR
from pytest_ml4_sim.deploy.dynamo import DynamoProcess

from pytest_ml4.checks.restart import assert_stream_survives_worker_crash
from pytest_ml4.checks.verdict import NotJudged
from pytest_ml4.client.stream_probe import parse_sse_lines
from pytest_ml4.control.crash import Crash, CrashRun
from pytest_ml4.control.scenario import load_requests
from pytest_ml4.runtime.orphans import end_group, group_members

KV = FIXTURES_DIR / "transcripts" / "dynamo-vllm-1.6.1" / "kv"
SPEC = load_requests().crash
#: The frontend's line for the recorded migration (real-dynamo-vllm-1.6.1-transcripts/kv/frontend-kv-migration.log).
MIGRATION_LINE = ('request_span: migration retry scheduled migration.is_retry=true migration.reason="disconnected" '
                  'migration.from_worker_id=15878461393600149020 migration.tokens_completed=199')
#: A parent that starts a child in its own process group and then waits, as dynamo.vllm starts its EngineCore.
PARENT = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
          "print(c.pid, flush=True); time.sleep(120)")


def recorded_run(name: str, migration_limit: int, migration_log: str | None = MIGRATION_LINE) -> CrashRun:
    """A CrashRun over a recorded stream (the seconds prefix of each line dropped)."""
    lines: list[str] = []
    for line in (KV / name).read_text().splitlines():
        if " data: " in line:
            lines += [line[line.index("data: "):], ""]   # one SSE event per recorded line
    request = {"max_tokens": 300, "min_tokens": 300, "stream": True}
    stream = parse_sse_lines(lines, request=request)
    crash = Crash("dynamo.vllm worker #1", 15878461393600149020, 20566, ["pid 20787 VLLM::EngineCore (770 MiB RSS)"])
    return CrashRun(migration_limit, stream, crash, 20, [(0.0, "stream sent")], 0.24, migration_log,
                    expected_error=dict(SPEC.unmigrated_error))


def test_real_migrated_stream_passes_and_names_the_migration() -> None:
    verdict = assert_stream_survives_worker_crash(recorded_run("migration-sigkill-stream.txt", 3))
    assert verdict.startswith("stream migrated after its worker's SIGKILL: 300/300 tokens")


def test_real_unmigrated_stream_passes_with_dynamos_error_event() -> None:
    verdict = assert_stream_survives_worker_crash(recorded_run("nomigration-sigkill-stream.txt", 0))
    assert "Service temporarily unavailable" in verdict and "[DONE]" in verdict


def test_an_error_event_under_migration_fails() -> None:
    with pytest.raises(AssertionError, match=r"did not continue on another worker although the frontend runs "
                                             r"--migration-limit 3"):
        assert_stream_survives_worker_crash(recorded_run("nomigration-sigkill-stream.txt", 3))


def test_a_completed_stream_without_migration_fails() -> None:
    with pytest.raises(AssertionError, match=r"without migration a stream whose worker was SIGKILLed must end with "
                                             r"an in-band error event"):
        assert_stream_survives_worker_crash(recorded_run("migration-sigkill-stream.txt", 0))


def test_a_completed_stream_the_frontend_did_not_migrate_fails() -> None:
    with pytest.raises(AssertionError, match=r"the frontend log names no migration off the killed worker "
                                             r"15878461393600149020"):
        assert_stream_survives_worker_crash(recorded_run("migration-sigkill-stream.txt", 3, migration_log=None))


def test_another_error_body_than_real_dynamos_fails() -> None:
    run = recorded_run("nomigration-sigkill-stream.txt", 0)
    run.expected_error = {"message": "No instances available", "type": "service_unavailable", "code": 503}
    with pytest.raises(AssertionError, match=r"real Dynamo 1.6.1 sends \{'error': \{'message': 'No instances"):
        assert_stream_survives_worker_crash(run)


def test_a_stream_that_ended_before_the_kill_is_not_judged() -> None:
    run = recorded_run("migration-sigkill-stream.txt", 3)
    run.crash = None
    with pytest.raises(NotJudged, match=r"nothing was crashed"):
        assert_stream_survives_worker_crash(run)


def test_a_stream_refused_before_any_crash_fails_and_is_not_merely_not_judged() -> None:
    """A hidden model (every prefill pod crash-looping) refuses the stream with 404 before its worker could be
    killed: the deployment failed to serve, which is a failure, never "nothing was crashed"."""
    run = recorded_run("migration-sigkill-stream.txt", 3)
    run.crash = None
    run.stream.status_code = 404
    with pytest.raises(AssertionError, match=r"the stream was refused before the crash \(HTTP 404\)") as err:
        assert_stream_survives_worker_crash(run)
    assert not isinstance(err.value, NotJudged)


def _spawn_parent() -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_end_group_finds_and_ends_the_child_that_outlived_its_parent() -> None:
    proc, child = _spawn_parent()
    try:
        proc.kill()
        proc.wait(5)
        assert [p.pid for p in group_members(proc.pid)] == [child]   # the child survived its parent's SIGKILL
        found, surviving = end_group(proc.pid)
        assert [p.pid for p in found] == [child] and found[0].rss_mib > 0 and surviving == []
        assert found[0].name.startswith("python")   # argv[0]'s name, as vLLM's titles (VLLM::EngineCore) show
        assert group_members(proc.pid) == []
    finally:
        _kill_quietly(child)


class _Parent(DynamoProcess):
    name = "test parent"

    def argv(self) -> list[str]:
        return [sys.executable, "-c", PARENT]

    @property
    def health_url(self) -> str:
        return "http://127.0.0.1:9/unused"


def test_a_killed_process_records_and_ends_its_leftovers(tmp_path: Path) -> None:
    proc = _Parent(tmp_path / "parent.log", os.environ, tmp_path)
    proc.spawn()
    pid = proc.pid
    assert pid is not None
    _wait_for_member(pid, lambda members: len(members) == 2)
    record = proc.kill()
    assert record is not None and record.how == "SIGKILL" and len(record.leftovers) == 1
    assert record.leftovers[0].pid != pid and proc.kills == [record]
    assert "processes left in its group: pid" in record.line() and group_members(pid) == []


def test_a_stopped_process_that_leaves_nothing_records_nothing(tmp_path: Path) -> None:
    proc = _Parent(tmp_path / "parent.log", os.environ, tmp_path)
    proc.spawn()
    assert proc.pid is not None
    pgid = proc.pid
    _wait_for_member(pgid, lambda members: len(members) == 2)
    os.killpg(pgid, signal.SIGTERM)   # the whole group ends on its own: nothing left behind
    # ... once its members have finished exiting: a child still tearing down when stop() looks is a leftover.
    _wait_for_member(pgid, lambda members: not members)
    proc.stop()
    assert proc.kills == [] and group_members(pgid) == []


def _wait_for_member(pgid: int, ok: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok(group_members(pgid)):  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"group {pgid}: {group_members(pgid)}")


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.nightly
def test_restart_suite_on_real_workers_migrates_the_killed_workers_stream(tmp_path: Path) -> None:
    """``-m restart`` on gb300-agg with two real dynamo.vllm workers: the pod restarts, then a real worker
    SIGKILLed under a stream whose tokens continue on the other (the timeline names the kill, the EngineCore and
    Worker it left behind, and the frontend's migration line). Nightly: two real workers restart five times, about
    15 minutes here (docs/notes/restart-real-workers-2026-12-04.md)."""
    import json
    import sys

    from pytest_ml4.runtime.installed import ToolMissing, dynamo_vllm_python

    try:
        dynamo_vllm_python()
    except ToolMissing as err:
        pytest.skip(str(err))
    repo = Path(__file__).resolve().parents[1]
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "pytest", "suites", "--target", "gb300-agg", "--sim", "--sim-engine", "vllm",
           "-m", "restart", "-p", "no:cacheprovider", "-q", "-s", "--ml4-allow-not-judged", "--ml4-run-dir",
           str(run_dir)]
    # The run's documented bound (README "Restart deadlines"): the workers' start (900 s at most), two scenarios of
    # 2 x 420 s + 91 s each, the crash's recovery (420 s + 91 s) and the teardown: under an hour.
    proc = subprocess.run(cmd, check=False, cwd=repo, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "stream migrated after its worker's SIGKILL" in proc.stdout, proc.stdout[-4000:]
    assert "VLLM::EngineCore" in proc.stdout and "migration.from_worker_id=" in proc.stdout, proc.stdout[-4000:]
    checks = json.loads((run_dir / "summary.json").read_text())["checks"]
    crash = [c for c in checks if c["nodeid"].endswith("test_worker_crash_under_a_stream")]
    assert [c["outcome"] for c in crash] == ["passed"], crash
