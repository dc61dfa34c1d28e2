"""The xdist scheduling of ``.ci/run``: files stay whole on a worker, the kill matrix's runs spread over both."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import xdist_scopes
from xdist_scopes import scope_of


def test_a_file_stays_one_work_unit() -> None:
    # test_real_vllm.py starts real vLLM once for its module: its tests must share a worker.
    assert scope_of("tests/test_real_vllm.py::test_suites_pass_on_real_vllm") == "tests/test_real_vllm.py"
    assert scope_of("tests/test_real_vllm.py::test_shapes[a-b]") == "tests/test_real_vllm.py"


def test_each_kill_matrix_run_is_its_own_work_unit() -> None:
    a = "tests/test_kill_matrix.py::test_kill_fails_the_checks_it_names[gb300-agg-slow_decode-real]"
    b = "tests/test_kill_matrix.py::test_healthy_simulator_passes_every_check[gb300-agg-fast]"
    assert scope_of(a) == a
    assert scope_of(b) == b
    assert scope_of(a) != scope_of(b)


def test_two_workers_share_a_file_of_independent_tests(pytester: pytest.Pytester) -> None:
    """A real ``-n 2 --dist loadfile`` session with the project's hook: a file named in PER_TEST_FILES runs on
    both workers, any other file on one."""
    pytester.makepyfile(xdist_scopes=Path(xdist_scopes.__file__).read_text())
    pytester.makeconftest("""
        def pytest_xdist_make_scheduler(config, log):
            from xdist_scopes import make_scheduler
            return make_scheduler(config, log)
    """)
    tests = pytester.mkdir("tests")
    body = "import time\nimport pytest\n@pytest.mark.parametrize('i', range(6))\ndef test_x(i):\n    time.sleep(0.3)\n"
    # The per-test file's tests wait until a test of it has started on each worker: shared, they all end at once;
    # kept on one worker, the first one waits in vain and fails. No sleep decides it, so load cannot either.
    barrier = pytester.mkdir("started")
    shared = (f"import os, time\nimport pytest\nSTARTED = {str(barrier)!r}\n"
              "@pytest.mark.parametrize('i', range(6))\ndef test_x(i):\n"
              "    open(os.path.join(STARTED, os.environ['PYTEST_XDIST_WORKER']), 'w').close()\n"
              "    deadline = time.monotonic() + 120\n"
              "    while len(os.listdir(STARTED)) < 2:\n"
              "        assert time.monotonic() < deadline, 'no test of this file started on the other worker'\n"
              "        time.sleep(0.05)\n")
    (tests / "test_kill_matrix.py").write_text(shared)
    (tests / "test_other.py").write_text(body)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadfile", "-v", "-p", "no:randomly", "tests")
    result.assert_outcomes(passed=12)
    workers: dict[str, set[str]] = {}
    for line in result.outlines:
        hit = re.search(r"\[(gw\d)\].*PASSED (tests/\S+?)::", line)
        if hit:
            workers.setdefault(hit[2], set()).add(hit[1])
    assert workers["tests/test_kill_matrix.py"] == {"gw0", "gw1"}, workers
    assert len(workers["tests/test_other.py"]) == 1, workers
