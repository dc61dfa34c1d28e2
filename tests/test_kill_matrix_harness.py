"""The kill-matrix harness judges a kill by the check's verdict code, raised from its declared place, and by the
failure message only (never the traceback) where a regex is given.

A regex that matched the traceback (which holds the check's source) would be satisfied by any failure after the
line holding its literal; a weakened check would still look killed; a code raised by a helper that fires on
anything would look like the property's verdict. These tests prove none of that can happen.
"""

from __future__ import annotations

import re
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
REAL_ASSERT = 'require(not empty, "preflight.nothing_deployable",'
#: A helper of the suite module raising the check's code: the right code from the wrong place.
ELSEWHERE = ('\n\ndef _elsewhere(empty):\n    require(not empty, "preflight.nothing_deployable", "no deployable document")\n')


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
    assert "does not name the defect" in str(judge_named(grammar, "n", kill, Expect(message=GRAMMAR)))
    # The old loose regex matched the function name in pytest's "where" explanation; the message is empty of it.
    synthetic = outcomes["test_doctored.py::test_no_synthetic_acceptance"]
    assert "synthetic" not in synthetic.message
    assert "does not name the defect" in str(judge_named(synthetic, "n", kill, Expect(message="synthetic")))


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
    path.write_text(source.replace(REAL_ASSERT, replacement) + ELSEWHERE)


@pytest.mark.parametrize(("replacement", "problem"), [
    pytest.param(None, None, id="intact"),
    pytest.param('require(not empty or True, "preflight.nothing_deployable",', "passed under " + KILL,
                 id="weakened"),
    pytest.param('require(False, "preflight.unparsable", "could not list the manifests")\n    ' + REAL_ASSERT,
                 "failed with code preflight.unparsable, not preflight.nothing_deployable",
                 id="fails-on-another-verdict"),
    pytest.param('_elsewhere(empty)\n    require(True, "preflight.nothing_deployable",',
                 "raised [preflight.nothing_deployable] from test_preflight._elsewhere, not from "
                 "*test_preflight.test_manifests_parse", id="right-code-from-the-wrong-place"),
    pytest.param('assert not empty, "[preflight.nothing_deployable] no deployable document"\n    '
                 'require(True, "preflight.nothing_deployable",', "no verdict raised it", id="code-only-in-the-text"),
    pytest.param('require(not empty, "preflight.nothing_deployabel",',
                 "failed with code none, not preflight.nothing_deployable", id="undeclared-code"),
])
def test_weakening_a_check_fails_its_kill(suites_copy: Path, tmp_path: Path, replacement: str | None,
                                          problem: str | None) -> None:
    """The real check satisfies its kill; weakened, failing on another verdict, raising its code from a helper of
    its module (or writing it into a plain assertion's text), or raising an undeclared code, it no longer does."""
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
    """``base:``: the base's kills and checks (its own base's first), the file's own replacing them by name, a kill
    set to null dropped; a base that is missing or makes a cycle is refused with the file's name."""
    from killmatrix_file import MatrixError

    (tmp_path / "a.yaml").write_text(
        "target: a\nprofiles: {offline: {sim: false}}\nprofile_of: {suites/test_x.py: offline}\n"
        "kills:\n  k1: {why: w, faults: [f1]}\n  k2: {why: w, faults: [f2]}\n"
        "checks:\n  suites/test_x.py::one: {killed_by: {k1: preflight.rule_error}}\n"
        "  suites/test_x.py::two: {killed_by: {k2: preflight.unparsable}}\n")
    (tmp_path / "b.yaml").write_text(
        "target: b\nbase: a\nkills: {k2: null}\nchecks:\n  suites/test_x.py::two: {pending: 'one worker'}\n"
        "profiles: {offline: {sim: false, nightly: 'too heavy for CI'}}\n")
    b = load_matrix("b", tmp_path)
    assert b.nightly == {"offline": "too heavy for CI"} and load_matrix("a", tmp_path).nightly == {}
    assert sorted(b.kills) == ["k1"] and b.kills["k1"].breaks == ("--ml4-fault", "f1")
    assert b.checks["suites/test_x.py::one"].killed_by["k1"].code == "preflight.rule_error"
    assert b.checks["suites/test_x.py::two"].pending == "one worker"
    (tmp_path / "c.yaml").write_text("target: c\nbase: b\nkills: {}\nchecks: {}\n")
    c = load_matrix("c", tmp_path)   # through b to a: b's changes, then a's entries
    assert sorted(c.kills) == ["k1"] and c.checks["suites/test_x.py::two"].pending == "one worker"
    (tmp_path / "a.yaml").write_text((tmp_path / "a.yaml").read_text().replace("target: a\n", "target: a\nbase: c\n"))
    with pytest.raises(MatrixError, match=r"a.yaml: line 2: base: 'c' makes a cycle \(c.yaml -> b.yaml -> a.yaml -> "
                                          r"c.yaml\)"):
        load_matrix("c", tmp_path)
    (tmp_path / "d.yaml").write_text("target: d\nbase: nowhere\nkills: {}\nchecks: {}\n")
    with pytest.raises(MatrixError, match="d.yaml: line 2: base: 'nowhere' has no matrix file nowhere.yaml"):
        load_matrix("d", tmp_path)


def test_a_key_given_twice_is_refused_with_file_and_line(tmp_path: Path) -> None:
    """Plain YAML keeps the last of two ``collateral:`` keys silently, dropping the first's reasons; the matrix
    loader refuses the file instead, naming it and the line."""
    from killmatrix_file import MatrixError

    (tmp_path / "a.yaml").write_text(
        "target: a\nprofiles: {offline: {sim: false}}\nprofile_of: {suites/test_x.py: offline}\n"
        "kills:\n  k1:\n    why: w\n    faults: [f1]\n    collateral: {suites/test_x.py::two: r1}\n"
        "    collateral: {suites/test_x.py::two: r2}\n"
        "checks:\n  suites/test_x.py::one: {killed_by: {k1: preflight.rule_error}}\n")
    with pytest.raises(MatrixError, match=r"a\.yaml: line 9, column 5: duplicate key 'collateral' \(first at line 8\)"):
        load_matrix("a", tmp_path)


def test_a_nightly_profile_is_read_with_its_reason(tmp_path: Path) -> None:
    """``nightly: <why>`` on a profile (the disagg matrices' real profile, for CI time) keeps its runs out of
    CI, each with its reason; a matrix without it (rtxpro6000-tp8) keeps every profile in."""
    for target in ("gb300-disagg", "gb300-agg", "rtxpro6000-tp8", "common"):
        shutil.copy(REPO / "fixtures" / "killmatrix" / f"{target}.yaml", tmp_path / f"{target}.yaml")
    m = load_matrix("gb300-disagg", tmp_path)
    assert set(m.nightly) == {"real"} and all(m.nightly.values()), m.nightly
    assert load_matrix("rtxpro6000-tp8", tmp_path).nightly == {}
    assert load_matrix("gb300-agg", tmp_path).nightly == {}, "the base's own profiles stay its own"


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


_ONE_CHECK = ("target: a\nprofiles: {offline: {sim: false}}\nprofile_of: {suites/test_preflight.py: offline}\n"
              "kills:\n  k1: {why: w, faults: [f1]}\n"
              "checks:\n  suites/test_preflight.py::test_manifests_parse: {killed_by: {k1: %s}}\n")


@pytest.mark.parametrize(("entry", "refusal"), [
    pytest.param("preflight.nothing_deployabel", "a.yaml: line 7: suites/test_preflight.py::test_manifests_parse: "
                 "killed_by.k1: verdict code 'preflight.nothing_deployabel' is not declared", id="undeclared"),
    pytest.param("{code: preflight.typo, message: x}", "killed_by.k1: verdict code 'preflight.typo' is not declared",
                 id="undeclared-with-message"),
    pytest.param("'no vLLM launch'", "a.yaml: line 7: suites/test_preflight.py::test_manifests_parse: killed_by.k1: "
                 "a message regex without a verdict code", id="regex-only"),
    pytest.param("{message: 'no vLLM launch'}", "killed_by.k1: a message regex without a verdict code",
                 id="regex-only-mapping"),
    pytest.param("{code: preflight.nothing_deployable, regex: x}", "killed_by.k1: unknown keys ['regex']",
                 id="unknown-key"),
])
def test_a_matrix_entry_without_a_declared_code_is_refused_at_load(tmp_path: Path, entry: str, refusal: str) -> None:
    """A kill names a declared code (``@fails_with``); a typo, or a regex standing alone, is one line naming the file,
    the line, the check and the kill."""
    from killmatrix_file import MatrixError

    (tmp_path / "a.yaml").write_text(_ONE_CHECK % entry)
    with pytest.raises(MatrixError, match=re.escape(refusal)) as info:
        load_matrix("a", tmp_path)
    assert "\n" not in str(info.value)


_MATRIX = """target: a
profiles:
  offline: {sim: false}
profile_of: {suites/test_x.py: offline}
kills:
  k1:
    why: w
    faults: [f1]
    collateral:
      suites/test_x.py::two: {why: r, outcome: failed}
checks:
  suites/test_x.py::one:
    killed_by:
      k1:
        - {code: preflight.rule_error, only: [a]}
        - {code: preflight.unparsable, only: [b]}
  suites/test_x.py::two: {measurement: m}
"""


@pytest.mark.parametrize(("old", "new", "refusal"), [
    pytest.param("outcome: failed", "outcome: maybe", "a.yaml: line 10: kills.k1.collateral.suites/test_x.py::two."
                 "outcome: Input should be 'failed', 'skipped' or 'not_judged'", id="collateral-outcome"),
    pytest.param("{sim: false}", "{sim: sometimes}", "a.yaml: line 3: profiles.offline.sim: Input should be a valid "
                 "boolean", id="profile-sim"),
    pytest.param("preflight.unparsable", "preflight.unparseable", "a.yaml: line 16: suites/test_x.py::one: "
                 "killed_by.k1.1: verdict code 'preflight.unparseable' is not declared", id="second-part-code"),
    pytest.param("{measurement: m}", "{measurement: m, pending: p}", "a.yaml: line 17: suites/test_x.py::two: give "
                 "exactly one of killed_by, measurement, skipped, pending (got ['measurement', 'pending'])",
                 id="two-verdicts"),
    pytest.param("    why: w\n", "", "a.yaml: line 7: kills.k1: no why (which real failure it stands for)",
                 id="kill-without-why"),
    pytest.param("    faults: [f1]", "    faults: [f1]\n    retries: 2", "a.yaml: line 7: kills.k1: unknown keys "
                 "['retries'] (allowed: args, breaks, collateral, faults, group, nightly, why)", id="kill-unknown-key"),
    pytest.param("{suites/test_x.py: offline}", "{suites/test_x.py: ofline}", "a.yaml: line 4: "
                 "profile_of.suites/test_x.py: 'ofline' is not a profile (offline)", id="unknown-profile"),
    pytest.param("      k1:\n        -", "      k2:\n        -", "a.yaml: line 14: suites/test_x.py::one: killed_by: "
                 "names kills a's matrix does not define: ['k2']", id="undefined-kill"),
    pytest.param("suites/test_x.py::two: {why", "suites/test_x.py::three: {why", "a.yaml: line 10: "
                 "kills.k1.collateral: names checks a's matrix lacks: ['suites/test_x.py::three']",
                 id="collateral-of-no-check"),
    pytest.param("suites/test_x.py::two: {why", "suites/test_y.py::*: {why", "a.yaml: line 10: "
                 "kills.k1.collateral: names checks a's matrix lacks: ['suites/test_y.py::*']",
                 id="collateral-pattern-of-no-check"),
])
def test_a_bad_field_is_one_line_with_file_line_and_field(tmp_path: Path, old: str, new: str, refusal: str) -> None:
    """Every field of the file is typed: a bad one is refused at load with the file, the line that holds it and its
    path in the file (a check by its key, a kill as ``kills.<name>``)."""
    from killmatrix_file import MatrixError

    assert load_matrix("a", _write(tmp_path, "a", _MATRIX)).checks["suites/test_x.py::two"].measurement == "m"
    _write(tmp_path, "a", _MATRIX.replace(old, new, 1))
    with pytest.raises(MatrixError, match=re.escape(refusal)) as info:
        load_matrix("a", tmp_path)
    assert str(info.value).startswith("a.yaml: ") and "\n" not in str(info.value)


def _write(directory: Path, name: str, text: str) -> Path:
    (directory / f"{name}.yaml").write_text(text)
    return directory


def test_a_bad_entry_is_placed_in_the_file_that_gives_it(tmp_path: Path) -> None:
    """A target's matrix is put together from its file and its bases: a bad entry of common.yaml is named there,
    at its line, whichever target's matrix reached it (vr200-disagg through gb300-agg)."""
    from killmatrix_file import MatrixError

    shutil.copytree(REPO / "fixtures" / "killmatrix", tmp_path, dirs_exist_ok=True)
    common = tmp_path / "common.yaml"
    lines = common.read_text().splitlines(keepends=True)
    [at] = [n for n, line in enumerate(lines, 1) if "{prefix_cache_off: perf.prefix_reuse}" in line]
    common.write_text("".join(lines).replace("perf.prefix_reuse}", "perf.prefix_reuze}"))
    with pytest.raises(MatrixError, match=re.escape(
            f"common.yaml: line {at}: suites/test_perf.py::test_sessions_reuse_the_shared_prefix: "
            "killed_by.prefix_cache_off: verdict code 'perf.prefix_reuze' is not declared")):
        load_matrix("vr200-disagg", tmp_path)
    _write(tmp_path, "common", "".join(lines))
    (tmp_path / "vr200-disagg.yaml").write_text((tmp_path / "vr200-disagg.yaml").read_text()
                                                .replace("  affinity_off: null\n", "  affinity_off: null\n  prefix_cache_off: null\n"))
    with pytest.raises(MatrixError, match=re.escape(
            f"common.yaml: line {at}: suites/test_perf.py::test_sessions_reuse_the_shared_prefix: killed_by: "
            "names kills vr200-disagg's matrix does not define: ['prefix_cache_off']")):
        load_matrix("vr200-disagg", tmp_path)


def test_a_code_entry_reads_as_code_message_and_instances(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(_ONE_CHECK % "{code: preflight.rule_error, message: 'x<param>', except: [b]}")
    [expect] = load_matrix("a", tmp_path).checks["suites/test_preflight.py::test_manifests_parse"].killed_by.values()
    assert (expect.code, expect.message, expect.exclude) == ("preflight.rule_error", "x<param>", ("b",))
    (tmp_path / "a.yaml").write_text(_ONE_CHECK % "preflight.nothing_deployable")
    [expect] = load_matrix("a", tmp_path).checks["suites/test_preflight.py::test_manifests_parse"].killed_by.values()
    assert (expect.code, expect.message) == ("preflight.nothing_deployable", None)


def test_every_code_a_matrix_names_is_declared_where_it_is_raised() -> None:
    """Every code a kill names is declared with ``@fails_with`` on a function: the place its check must raise it
    from, which the kill's judgement holds the check to."""
    from killmatrix import TARGETS

    from pytest_ml4.checks.codes import declared_origins, known_codes

    named = {(t, p.code) for t in TARGETS for c in load_matrix(t).checks.values()
             for e in c.killed_by.values() for p in (e.parts or (e,)) if p.code}
    assert named, "the kill matrices name no verdict code"
    undeclared = sorted(f"{t}: {code}" for t, code in named if code not in known_codes() or not declared_origins(code))
    assert not undeclared, f"codes named by kill matrices that no @fails_with declares: {undeclared}"


# ------------------------------------------------------------------------------------ outcomes the harness sees
OUTCOMES = '''
import pytest

@pytest.fixture
def broken_fixture():
    raise RuntimeError("the deployment fixture could not start")

def test_passes():
    pass

def test_does_not_apply():
    pytest.skip("does not apply: target t is not served by Dynamo")

def test_not_judged():
    pytest.skip("not judged: no worker metrics URL")

def test_setup_error(broken_fixture):
    assert False, "never reached"
'''


def test_a_healthy_skip_is_judged_by_its_reason_and_a_setup_error_is_the_harnesss(tmp_path: Path) -> None:
    """A ``skipped`` check must skip with the matrix's reason: another reason, or a not-judged skip, fails it; an
    error in fixture setup is a harness error, never a pass, a skip or a kill."""
    from killmatrix import Check, judge_harness, judge_healthy

    outcomes = read_junit(_junit_of(tmp_path, OUTCOMES))
    node = "test_doctored.py::test_"
    skip, nj, error = outcomes[node + "does_not_apply"], outcomes[node + "not_judged"], outcomes[node + "setup_error"]
    assert (skip.kind, nj.kind, error.status) == ("skipped", "not_judged", "error")
    assert judge_healthy(skip, "n", Check("k", skipped="is not served by Dynamo")) is None
    assert "not for the matrix's reason" in str(judge_healthy(skip, "n", Check("k", skipped="disagg targets only")))
    assert "not_judged (want skipped)" in str(judge_healthy(nj, "n", Check("k", skipped="no worker metrics URL")))
    assert judge_healthy(outcomes[node + "passes"], "n", Check("k", measurement="m")) is None
    assert "skipped (want passed)" in str(judge_healthy(skip, "n", Check("k", measurement="m")))
    for judged in (judge_harness(error, "n"), judge_healthy(error, "n", Check("k", measurement="m"))):
        assert "harness error" in str(judged) and "could not start" in str(judged), judged


def test_every_parametrized_instance_is_killed_or_says_why() -> None:
    from killmatrix import Check

    check = Check("k", killed_by={"kill": Expect("x", only=("a*",))}, pending_params={"b": "no fault yet"},
                  skipped_params={"c": "does not apply"})
    assert check.uncovered(["k[a1]", "k[a2]", "k[b]", "k[c]", "k[d]"]) == ["k[d]"]
    assert Check("k", measurement="m").uncovered(["k[d]"]) == []


def test_collateral_sees_skips_and_not_judged_in_every_file_of_the_run() -> None:
    """Every node the run reports, in any suite file, is judged against its healthy outcome: a check pushed into
    a skip or "not judged" is collateral unless the kill lists it (with the outcome, when stated)."""
    from killmatrix import (
        Check,
        Collateral,
        KillRun,
        Matrix,
        collateral_problems,
    )

    checks = {k: Check(k, measurement="m") for k in ("suites/test_a.py::one", "suites/test_b.py::two",
                                                     "suites/test_b.py::three", "suites/test_b.py::four")}
    checks["suites/test_a.py::named"] = Check("suites/test_a.py::named", killed_by={"k": Expect("x")})
    m = Matrix("t", (), {}, frozenset(), {}, {}, checks)
    plan = KillRun([(checks["suites/test_a.py::named"], "k", Expect("x"), "suites/test_a.py::named")], [],
                   {"suites/test_b.py::three": Collateral("every request fails", "failed"),
                    "suites/test_b.py::four": Collateral("no evidence under the kill")})
    outcomes = {"suites/test_a.py::named": Outcome("failed", "x"),
                "suites/test_a.py::one": Outcome("passed", ""),
                "suites/test_b.py::two": Outcome("skipped", "not judged: no metrics"),
                "suites/test_b.py::three": Outcome("skipped", "not judged: no figures"),
                "suites/test_b.py::four": Outcome("skipped", "not judged: no figures"),
                "suites/test_c.py::unknown": Outcome("passed", "")}
    problems = collateral_problems(m, plan, outcomes)
    assert len(problems) == 3, problems
    assert problems[0].startswith("collateral not_judged (not named by the kill") and "test_b.py::two" in problems[0]
    assert problems[1].startswith("collateral not_judged (listed for failed only)"), problems[1]
    assert "test_c.py::unknown: reported by the run, but the matrix has no entry" in problems[2]
    outcomes["suites/test_b.py::four"] = Outcome("error", "failed on setup with RuntimeError")
    assert any("test_b.py::four: harness error" in p for p in collateral_problems(m, plan, outcomes))


def test_collateral_by_pattern_covers_every_check_it_matches_and_no_other() -> None:
    """A kill that breaks every check of a file (or every request) lists its collateral once, as a pattern: it
    covers the checks it matches, with its outcome when stated; a check's own key wins over a pattern; a check of
    another file is still collateral."""
    from killmatrix import Check, Collateral, KillRun, Matrix, collateral_problems

    keys = ("suites/test_a.py::one", "suites/test_a.py::two", "suites/test_b.py::three")
    checks = {k: Check(k, measurement="m") for k in keys}
    m = Matrix("t", (), {}, frozenset(), {}, {}, checks)
    plan = KillRun([], [], {"suites/test_a.py::*": Collateral("no reasoning field", "failed"),
                            "suites/test_a.py::two": Collateral("its own reason", "not_judged")})
    outcomes = {"suites/test_a.py::one": Outcome("failed", "x"),
                "suites/test_a.py::two": Outcome("failed", "x"),
                "suites/test_b.py::three": Outcome("failed", "x")}
    problems = collateral_problems(m, plan, outcomes)
    assert len(problems) == 2, problems
    assert problems[0].startswith("collateral failed (listed for not_judged only)") and "test_a.py::two" in problems[0]
    assert problems[1].startswith("collateral failed (not named by the kill") and "test_b.py::three" in problems[1]
    outcomes["suites/test_a.py::one"] = Outcome("skipped", "not judged: nothing came back")
    assert any("test_a.py::one" in p for p in collateral_problems(m, plan, outcomes))


# ---------------------------------------------------------------------------------------------- the tally gate
def _records(killed: int, gating: int, control_ok: bool = True, collateral: int = 0) -> list[dict]:
    checks = {f"c{i}": "killed_by" for i in range(gating)}
    return [{"target": "t", "checks": checks, "kills": {"k": {"checks": sorted(checks), "control": "control --x"}}},
            *({"target": "t", "check": f"c{i}", "healthy": True} for i in range(gating)),
            *({"target": "t", "check": f"c{i}", "kill": "k", "ok": True} for i in range(killed)),
            {"target": "t", "kill": "k", "control_ok": control_ok},
            {"target": "t", "group": "g", "collateral_failures": collateral}]


def test_the_gate_names_each_target_whose_tally_does_not_hold() -> None:
    from conftest import gate_scope, kill_gate

    assert kill_gate(_records(2, 2), None) == [] and kill_gate([], None) == []
    assert kill_gate(_records(1, 2), None) == ["t: 1 of 2 checks not proven killed here"]
    assert kill_gate(_records(2, 2, control_ok=False), None) == [
        "t: 2 of 2 checks not proven killed here, 1 kill control(s) failed"]
    assert kill_gate(_records(2, 2, collateral=1), None) == ["t: 1 collateral failure(s)"]
    assert kill_gate(_records(1, 2), frozenset()) == [] and kill_gate(_records(1, 2), frozenset({"u"})) == []
    assert gate_scope("off") == frozenset() and gate_scope(None) is None
    assert gate_scope("rtxpro6000-tp8, gb300-agg") == {"rtxpro6000-tp8", "gb300-agg"}
    with pytest.raises(pytest.UsageError, match="ML4_KILL_MATRIX_GATE='nowhere': give all, ran, off or target names"):
        gate_scope("nowhere")


def test_the_ran_scope_requires_every_check_of_the_profiles_run_and_only_those() -> None:
    """CI's scope (``ran``): a check whose profile the session left out (no healthy run here) is not required; a
    check whose profile ran but whose kill did not (a kill moved to nightly) still fails the gate."""
    from conftest import gate_scope, kill_gate

    profile_left_out = [r for r in _records(1, 2) if r.get("check") != "c1" or "healthy" not in r]
    profile_left_out[0]["profiles"] = {"c0": "fast", "c1": "real"}
    assert kill_gate(profile_left_out, None, ran_only=True) == []
    assert kill_gate(profile_left_out, None) == ["t: 1 of 2 checks not proven killed here"]
    kill_left_out = _records(1, 2)
    kill_left_out[0]["profiles"] = {"c0": "fast", "c1": "fast"}
    want = "t: 1 of 2 checks of the profiles run here not proven killed here"
    assert kill_gate(kill_left_out, None, ran_only=True) == [want]
    assert gate_scope("ran") is None


def _doctored_matrices(directory: Path, nightly_kill: bool) -> Path:
    """rtxpro6000-tp8's matrix (one file, its base merged in) with its preflight checks and offline kills as they
    are and every other check a measurement in a nightly profile; ``nightly_kill``: one of those checks gets a kill,
    which CI never runs."""
    import yaml
    from killmatrix import flattened

    shutil.copytree(REPO / "fixtures" / "killmatrix", directory)   # its manifests, logs and configs
    for other in directory.glob("*.yaml"):
        other.unlink()
    m = flattened("rtxpro6000-tp8", REPO / "fixtures" / "killmatrix")   # common.yaml's entries merged in
    m["profiles"] = {"offline": {"sim": False}, "later": {"sim": False, "nightly": "doctored: not run here"}}
    m["profile_of"] = {f: "offline" if f == "suites/test_preflight.py" else "later" for f in m["profile_of"]}
    m["checks"] = {k: c if k.startswith("suites/test_preflight.py::") else {"measurement": "doctored"}
                   for k, c in m["checks"].items()}
    if nightly_kill:
        m["checks"]["suites/test_smoke.py::test_health"] = {"killed_by": {"health_down": "health.http_status"}}
        m["kills"]["health_down"] = {"why": "doctored", "faults": ["health_503"]}
    used = {k for c in m["checks"].values() for k in (c.get("killed_by") or {})}
    m["kills"] = {k: v for k, v in m["kills"].items() if k in used}
    (directory / "rtxpro6000-tp8.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    return directory


@pytest.mark.parametrize(("nightly_kill", "gate", "rc", "gate_line"), [
    pytest.param(False, "all", 0, None, id="n-equals-m-passes"),
    pytest.param(True, "all", 1, "rtxpro6000-tp8: 1 of 3 checks not proven killed here", id="nightly-kill-fails"),
])
def test_the_gate_fails_a_session_whose_tally_does_not_hold(tmp_path: Path, nightly_kill: bool, gate: str,
                                                            rc: int, gate_line: str | None) -> None:
    """The kill matrix run in a subprocess on doctored matrices (offline profile only, as CI deselects nightly):
    N = M passes; a kill left to nightly leaves N < M and fails the session, naming the target (every test of
    the session passed: the gate alone fails it)."""
    matrices = _doctored_matrices(tmp_path / "killmatrix", nightly_kill)
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_kill_matrix.py", "-k", "rtxpro6000-tp8",
                           "-m", "not nightly", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
                          env={**env(), "ML4_KILL_MATRIX_DIR": str(matrices), "ML4_KILL_MATRIX_PROFILES": "offline",
                               "ML4_KILL_MATRIX_GATE": gate})
    out = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == rc, out
    assert " passed" in proc.stdout and " failed" not in proc.stdout, out   # every test passed: the gate decides
    m = 3 if nightly_kill else 2
    assert f"rtxpro6000-tp8: suite checks killed by a fault: 2/{m}" in proc.stdout, out
    assert ("kill-matrix gate" in proc.stdout) == (gate_line is not None), out
    if gate_line is not None:
        assert f"kill-matrix gate (ML4_KILL_MATRIX_GATE={gate}) FAILS the session: {gate_line}" in proc.stdout, out


def test_an_entry_the_same_on_every_target_lives_in_common_yaml(tmp_path: Path) -> None:
    """The shipped matrices give each entry shared by all targets once, in common.yaml; a copy in every target's own
    file (here: a check entry moved out of common.yaml into both files that take it as base) is named."""
    from killmatrix import MATRIX_DIR, TARGETS
    from killmatrix_file import shared_outside_common

    assert shared_outside_common(TARGETS, MATRIX_DIR) == []
    doctored = tmp_path / "killmatrix"
    shutil.copytree(MATRIX_DIR, doctored)
    key = "suites/test_reasoning.py::test_higher_effort_thinks_longer"
    entry = f"  {key}:\n    killed_by: {{reasoning_effort_ignored: reasoning.effort_has_no_effect}}\n"
    common = (doctored / "common.yaml").read_text()
    assert entry in common
    (doctored / "common.yaml").write_text(common.replace(entry, ""))
    for own in ("rtxpro6000-tp8.yaml", "gb300-agg.yaml"):
        text = (doctored / own).read_text()
        (doctored / own).write_text(text.replace("\nchecks:\n", "\nchecks:\n" + entry, 1))
    assert shared_outside_common(TARGETS, doctored) == [
        f"checks.{key}: the same on every target, given by gb300-agg.yaml, rtxpro6000-tp8.yaml: belongs in common.yaml"]
