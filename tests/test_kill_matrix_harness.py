"""The kill-matrix harness judges a kill by the check's failure message only.

A regex that matched the traceback (which holds the check's source) would be satisfied by any failure after the
line holding its literal; a weakened check would still look killed. These tests prove neither can happen.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from killmatrix import (
    REPO,
    Expect,
    Kill,
    Outcome,
    _expect,
    env,
    judge_named,
    load_matrix,
    plan_kill_run,
    read_junit,
    run_bounded,
    run_suites,
)

GRAMMAR = "requests were killed by the reasoning grammar"
CHECK = "suites/test_preflight.py::test_manifests_parse"
KILL = "manifest_not_a_deployment"
REAL_ASSERT = 'assert not empty, f"no vLLM launch'


def _junit_of(tmp_path: Path, source: str) -> Path:
    (tmp_path / "test_doctored.py").write_text(source)
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "test_doctored.py", f"--junitxml={junit}", "-q",
                    "-p", "no:cacheprovider", "-p", "no:randomly"], cwd=tmp_path, env=env(), capture_output=True,
                   timeout=120, check=False)
    return junit


def test_a_literal_in_the_source_does_not_satisfy_a_kill(tmp_path: Path) -> None:
    """The check's source holds the kill's literal, but it fails on another assertion: the kill is not satisfied."""
    junit = _junit_of(tmp_path, f'''
def test_no_request_killed_by_the_grammar():
    marker = "{GRAMMAR}"
    assert 1 + 1 == 3, "the engine log could not be read"
    assert marker not in "", marker


def test_no_synthetic_acceptance():
    def synthetic_acceptance_off():
        return False
    assert synthetic_acceptance_off()
''')
    text = junit.read_text()
    assert GRAMMAR in text and "synthetic_acceptance_off" in text, "the doctored checks' traceback is not in the XML"
    outcomes = read_junit(junit)
    kill = Kill("grammar_kill", "why", ("--ml4-fault", "grammar_kill"), (), "g")
    grammar = outcomes["test_doctored.py::test_no_request_killed_by_the_grammar"]
    assert grammar.message.endswith("the engine log could not be read") and GRAMMAR not in grammar.message
    assert "does not name the defect" in str(judge_named(grammar, "n", kill, Expect(GRAMMAR)))
    # The old loose regex matched the function name in pytest's "where" explanation; the message is empty of it.
    synthetic = outcomes["test_doctored.py::test_no_synthetic_acceptance"]
    assert "synthetic" not in synthetic.message
    assert "does not name the defect" in str(judge_named(synthetic, "n", kill, Expect("synthetic")))


@pytest.fixture(scope="module")
def suites_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    shutil.copytree(REPO / "suites", root / "suites")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")     # the suites' ini (markers, addopts)
    return root


def _run_kill(root: Path, tmp: Path) -> list[str]:
    """Runs the rtxpro6000-tp8 kill of ``CHECK`` on the suites under ``root``; the harness's problems."""
    m = load_matrix("rtxpro6000-tp8")
    kill = m.kills[KILL]
    plan = plan_kill_run(m, [kill], "offline", root)
    assert [c.key for c, *_ in plan.named] == [CHECK]
    outcomes = run_suites(m, plan.nodes, "offline", kill.breaks + kill.args, tmp, root)
    return [p for _, _, e, n in plan.named if (p := judge_named(outcomes[n], n, kill, e))]


def _doctor(root: Path, replacement: str) -> None:
    path = root / "suites" / "test_preflight.py"
    source = path.read_text()
    assert source.count(REAL_ASSERT) == 1, f"{path}: the assertion this test weakens moved: {REAL_ASSERT}"
    path.write_text(source.replace(REAL_ASSERT, replacement))


@pytest.mark.parametrize(("replacement", "problem"), [
    pytest.param(None, None, id="intact"),
    pytest.param('assert not empty or True, f"no vLLM launch', "passed under " + KILL, id="weakened"),
    pytest.param('assert not "unrelated: could not list the manifests"\n    ' + REAL_ASSERT,
                 "does not name the defect", id="fails-on-another-assertion"),
])
def test_weakening_a_check_fails_its_kill(suites_copy: Path, tmp_path: Path, replacement: str | None,
                                          problem: str | None) -> None:
    """The real check satisfies its kill; weakened, or failing on another assertion, it no longer does."""
    root = tmp_path / "root"
    shutil.copytree(suites_copy, root)
    if replacement is not None:
        _doctor(root, replacement)
    problems = _run_kill(root, tmp_path)
    if problem is None:
        assert not problems, problems
    else:
        assert len(problems) == 1 and problem in problems[0], problems


def test_the_tally_needs_kill_healthy_and_control_for_a_check_to_count() -> None:
    """A check counts as killed only when its kill failed it, it passed healthy, and the kill's control passed."""
    from conftest import kill_tally

    matrix = {"target": "t", "checks": {"a": "killed_by", "b": "killed_by", "c": "killed_by", "m": "measurement"},
              "kills": {"k1": {"checks": ["a"], "control": "healthy"},
                        "k2": {"checks": ["b"], "control": "control --x"},
                        "k3": {"checks": ["c"], "control": "control --y"}}}
    records = [matrix, {"target": "u", "no_matrix": True},
               *({"target": "t", "check": c, "healthy": True} for c in "abc"),
               *({"target": "t", "check": c, "kill": k, "ok": True} for c, k in (("a", "k1"), ("b", "k2"), ("c", "k3"))),
               {"target": "t", "kill": "k2", "control_ok": True}, {"target": "t", "kill": "k3", "control_ok": False},
               {"target": "t", "group": "g", "collateral_failures": 2}]
    assert kill_tally(records) == [
        ("t: suite checks killed by a fault: 2/3 (pending 0, measurements 1), kill controls passed: 2/3,"
         " collateral failures: 2"),
        "u: no kill matrix (fixtures/killmatrix/u.yaml): none of its checks is proven"]


def test_the_tally_names_checks_whose_profile_did_not_run() -> None:
    """CI runs the offline and fast profiles: a kill naming a fast and a real check is controlled by the healthy
    run of what ran, and the real check stays in M, outside N, named as not run here (never passed)."""
    from conftest import kill_tally

    matrix = {"target": "t", "checks": {"smoke": "killed_by", "perf": "killed_by"},
              "profiles": {"smoke": "fast", "perf": "real"},
              "kills": {"errors": {"checks": ["perf", "smoke"], "control": "healthy"}}}
    records = [matrix, {"target": "t", "check": "smoke", "healthy": True},
               {"target": "t", "check": "smoke", "kill": "errors", "ok": True}]
    assert kill_tally(records) == [
        ("t: suite checks killed by a fault: 1/2 (pending 0, measurements 0, not run here: 1 (profile real)),"
         " kill controls passed: 1/1, collateral failures: 0")]
    unhealthy = [matrix, {"target": "t", "check": "smoke", "healthy": False}, records[2]]
    assert "kill controls passed: 0/1" in kill_tally(unhealthy)[0]


def test_a_matrix_takes_its_base_and_changes_only_what_it_lists(tmp_path: Path) -> None:
    """``base:``: the base's kills and checks, the file's own replacing them by name, a kill set to null dropped;
    a base that is missing or has a base itself is refused with the file's name."""
    from killmatrix import MatrixError

    (tmp_path / "a.yaml").write_text(
        "target: a\nprofiles: {offline: {sim: false}}\nprofile_of: {suites/test_x.py: offline}\n"
        "kills:\n  k1: {why: w, faults: [f1]}\n  k2: {why: w, faults: [f2]}\n"
        "checks:\n  suites/test_x.py::one: {killed_by: {k1: m1}}\n  suites/test_x.py::two: {killed_by: {k2: m2}}\n")
    (tmp_path / "b.yaml").write_text(
        "target: b\nbase: a\nkills: {k2: null}\nchecks:\n  suites/test_x.py::two: {pending: 'one worker'}\n"
        "profiles: {offline: {sim: false, nightly: 'too heavy for CI'}}\n")
    b = load_matrix("b", tmp_path)
    assert b.nightly == {"offline": "too heavy for CI"} and load_matrix("a", tmp_path).nightly == {}
    assert sorted(b.kills) == ["k1"] and b.kills["k1"].breaks == ("--ml4-fault", "f1")
    assert b.checks["suites/test_x.py::one"].killed_by["k1"].message == "m1"
    assert b.checks["suites/test_x.py::two"].pending == "one worker"
    (tmp_path / "c.yaml").write_text("target: c\nbase: b\nkills: {}\nchecks: {}\n")
    with pytest.raises(MatrixError, match="c.yaml: base: 'b' has a base itself"):
        load_matrix("c", tmp_path)
    (tmp_path / "d.yaml").write_text("target: d\nbase: nowhere\nkills: {}\nchecks: {}\n")
    with pytest.raises(MatrixError, match="d.yaml: base: 'nowhere' has no matrix file nowhere.yaml"):
        load_matrix("d", tmp_path)


def test_a_key_given_twice_is_refused_with_file_and_line(tmp_path: Path) -> None:
    """Plain YAML keeps the last of two ``collateral:`` keys silently, dropping the first's reasons; the matrix
    loader refuses the file instead, naming it and the line."""
    from killmatrix import MatrixError

    (tmp_path / "a.yaml").write_text(
        "target: a\nprofiles: {offline: {sim: false}}\nprofile_of: {suites/test_x.py: offline}\n"
        "kills:\n  k1:\n    why: w\n    faults: [f1]\n    collateral: {suites/test_x.py::two: r1}\n"
        "    collateral: {suites/test_x.py::two: r2}\n"
        "checks:\n  suites/test_x.py::one: {killed_by: {k1: m1}}\n")
    with pytest.raises(MatrixError, match=r"a\.yaml: line 9, column 5: duplicate key 'collateral' \(first at line 8\)"):
        load_matrix("a", tmp_path)


def test_a_nightly_profile_is_read_with_its_reason(tmp_path: Path) -> None:
    """``nightly: <why>`` on a profile (all of the disagg matrices' profiles, for CI time) keeps its runs out of
    CI, each with its reason; a matrix without it (rtxpro6000-tp8) keeps every profile in."""
    for target in ("gb300-disagg", "rtxpro6000-tp8"):
        shutil.copy(REPO / "fixtures" / "killmatrix" / f"{target}.yaml", tmp_path / f"{target}.yaml")
    m = load_matrix("gb300-disagg", tmp_path)
    assert set(m.nightly) == {"offline", "fast", "real"} and all(m.nightly.values()), m.nightly
    assert load_matrix("rtxpro6000-tp8", tmp_path).nightly == {}


CLEANS_UP_ON_SIGTERM = """
import signal, sys, time
def stop(*_):
    open(sys.argv[1], "w").write("cleaned up")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
time.sleep(60)
"""


def test_a_run_past_its_limit_is_stopped_with_sigterm_first(tmp_path: Path) -> None:
    """SIGKILL would skip the run's own clean-up and leave its deployment running: the run gets SIGTERM first,
    and the failure names the limit."""
    marker = tmp_path / "marker"
    with pytest.raises(AssertionError, match=r"^the run passed its 2 s limit and was stopped \(SIGTERM"):
        run_bounded([sys.executable, "-c", CLEANS_UP_ON_SIGTERM, str(marker)], tmp_path, 2, grace_s=20)
    assert marker.read_text() == "cleaned up"
    done = run_bounded([sys.executable, "-c", "print('ok')"], tmp_path, 30)
    assert (done.returncode, done.stdout) == (0, "ok\n")


@pytest.mark.parametrize(("entry", "message", "satisfied"), [
    pytest.param({"code": "kv.pool_short"}, "[kv.pool_short] KV pool 219,403 tokens < required 256,000", True,
                 id="code"),
    pytest.param({"code": "kv.pool_short"}, "[kv.no_pool_line] no 'GPU KV cache size' line", False, id="other-code"),
    pytest.param({"code": "kv.pool_short"}, "KV pool 219,403 tokens < required 256,000 (kv.pool_short)", False,
                 id="no-leading-code"),
    pytest.param({"code": "kv.pool_short", "message": "219,403"}, "[kv.pool_short] KV pool 219,403 tokens", True,
                 id="code-and-message"),
    pytest.param({"code": "kv.pool_short", "message": "263,923"}, "[kv.pool_short] KV pool 219,403 tokens", False,
                 id="code-not-message"),
])
def test_a_code_entry_needs_the_failure_s_code(entry: dict[str, str], message: str, satisfied: bool) -> None:
    """``{code: X}`` is satisfied by a failure raised with code X (its ``[X]``), ``message`` then also matching."""
    expect = _expect(Path("m.yaml"), "suites/test_kv_cache.py::t", "k", entry)
    kill = Kill("k", "why", ("--ml4-fault", "k"), (), "g")
    problem = judge_named(Outcome("failed", message), "n", kill, expect)
    assert (problem is None) is satisfied, problem
