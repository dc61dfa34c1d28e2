"""The endpoint lock: exclusive suites (OSL, perf, restart) own the endpoint under pytest-xdist.

Core lock between real processes first, then the plugin under ``-n 2``: no other test's run overlaps an exclusive
test's, and without the marker they do overlap (so the check can fail).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ml4_http_stub import Scripted, StubServer

from pytest_ml4.client.lock import EndpointLock

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pytest_ml4.client.lock import EndpointLock
    lock = EndpointLock(sys.argv[1])
    with (lock.exclusive() if sys.argv[2] == "ex" else lock.shared()):
        Path(sys.argv[3]).write_text("held")
        time.sleep(float(sys.argv[4]))
""")


def _holder(folder: Path, mode: str, seconds: float, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    flag = tmp_path / f"held-{mode}-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), mode, str(flag), str(seconds)])
    return proc, flag


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"lock holder exited early with {proc.returncode}"
        assert time.monotonic() < deadline, "lock holder never got the lock"
        time.sleep(0.02)


def test_exclusive_holder_keeps_others_out_until_it_ends(tmp_path: Path) -> None:
    proc, flag = _holder(tmp_path / "run", "ex", 30, tmp_path)
    try:
        _wait_for(flag, proc)
        with pytest.raises(TimeoutError, match=r"\.endpoint\.(lock|gate) shared within 0.3 s"):
            with EndpointLock(tmp_path / "run").shared(timeout=0.3):
                pass
    finally:
        proc.kill()                                  # the kernel drops a dead holder's flock
        proc.wait()
    with EndpointLock(tmp_path / "run").exclusive(timeout=5):
        pass


def test_shared_holders_coexist_and_a_waiting_exclusive_holder_goes_first(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    first = EndpointLock(folder)
    with first.shared(timeout=5):
        with EndpointLock(folder).shared(timeout=1):          # two shared holders at once
            pass
        waiter, flag = _holder(folder, "ex", 0.5, tmp_path)     # blocks: a shared holder is inside
        try:
            time.sleep(1.0)
            assert not flag.exists() and waiter.poll() is None
            # The turnstile: a newcomer queues behind the waiting exclusive holder instead of slipping in.
            with pytest.raises(TimeoutError):
                with EndpointLock(folder).shared(timeout=0.5):
                    pass
        except BaseException:
            waiter.kill()
            raise
    _wait_for(flag, waiter)
    assert waiter.wait(timeout=20) == 0


def test_nested_use_in_one_process_does_not_deadlock(tmp_path: Path) -> None:
    lock = EndpointLock(tmp_path)
    with lock.exclusive(timeout=2):
        with lock.shared(timeout=2), lock.exclusive(timeout=2):
            assert lock.held_exclusively
        assert lock.held_exclusively
    assert not lock.held_exclusively
    with EndpointLock(tmp_path).exclusive(timeout=2):         # released for everybody
        pass


MODULE = textwrap.dedent("""
    import json, os, time
    from pathlib import Path
    import pytest
    {mark}
    LOG = Path(os.environ["ML4_LOCK_TEST_LOG"])

    @pytest.mark.parametrize("i", range({n}))
    def test_interval(i):
        start = time.time()
        time.sleep({sleep})
        with LOG.open("a") as f:
            f.write(json.dumps({{"module": __name__, "start": start, "end": time.time()}}) + "\\n")
""")


def _intervals(pytester: pytest.Pytester, marked: bool, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, float]]:
    log = pytester.path / f"intervals-{marked}.jsonl"
    monkeypatch.setenv("ML4_LOCK_TEST_LOG", str(log))
    monkeypatch.setenv("LLM_API_KEY", "sk-lock-test")
    mark = "pytestmark = pytest.mark.exclusive" if marked else ""
    pytester.makepyfile(test_exclusive=MODULE.format(mark=mark, n=3, sleep=0.6),
                        test_other=MODULE.format(mark="", n=8, sleep=0.2))
    # Something must answer at the endpoint: under -n the controller checks it before the workers start.
    with StubServer({"/v1/models": Scripted(200, "application/json", [b'{"object": "list", "data": []}'])}) as stub:
        result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--endpoint", stub.base_url,
                                               "--ml4-reports", str(pytester.path / "r"), "-n", "2",
                                               "--dist", "loadfile", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 11
    return rows


def _overlaps(rows: list[dict[str, float]]) -> list[tuple[float, float]]:
    excl = [r for r in rows if r["module"] == "test_exclusive"]
    other = [r for r in rows if r["module"] == "test_other"]
    return [(e["start"], o["start"]) for e in excl for o in other if o["start"] < e["end"] and e["start"] < o["end"]]


def test_xdist_workers_never_overlap_an_exclusive_test(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert _overlaps(_intervals(pytester, True, monkeypatch)) == []


def test_without_the_marker_the_same_modules_overlap(pytester: pytest.Pytester,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert _overlaps(_intervals(pytester, False, monkeypatch)), (
        "two workers never ran at once: the check above would prove nothing")
