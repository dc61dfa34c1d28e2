"""The report plugin through pytester: default Allure folder in the run folder, labels, metadata files,
summary, redaction of every output, --clean-alluredir with -n refused, a crashed xdist worker shown as broken."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pytest_ml4.checks.verdict import EXIT_NOT_JUDGED
from pytest_ml4.report.categories import categorize, load_categories
from pytest_ml4.report.environment import read_environment
from pytest_ml4.report.redact import Redactor
from pytest_ml4.report.scan import scan_paths

KEY = "sk-ml4-plugin-test-3f9a2c7e5b1d4680"
GATE, PROTOCOL, UNREACHABLE, CRASH, DEFECT, NOT_JUDGED_CAT = (c.name for c in load_categories())

CHECKS = textwrap.dedent('''
    import logging, os
    import allure
    import pytest

    KEY = os.environ["LLM_API_KEY"]

    @pytest.mark.smoke
    def test_health_answers():
        """The engine reports healthy."""

    @pytest.mark.perf
    def test_ttft_gate():
        assert 3.0 <= 2.0, "gate TTFT p50 3.0 s exceeds 2.0 s at c16"

    @pytest.mark.tools
    def test_tool_arguments_are_json():
        raise KeyError("choices")

    @pytest.mark.tools
    @allure.feature("Hand-picked feature")
    @pytest.mark.parametrize("conc", [1, 2])
    def test_burst(conc):
        pass

    @pytest.fixture
    def healthy_endpoint():
        assert False, "health gate: /health answered 503"

    @pytest.mark.smoke
    def test_needs_healthy(healthy_endpoint):
        pass

    @pytest.mark.reasoning
    def test_skip_with_key():
        pytest.skip(f"endpoint refused key {KEY}")

    @pytest.mark.reasoning
    def test_leaky(record_property):
        logging.getLogger("ml4.test").warning("sending Authorization: Bearer %s", KEY)
        print("headers:", {"Authorization": "Bearer " + KEY})
        record_property("api_key", KEY)
        allure.attach('{"api_key": "%s", "note": "x"}' % KEY, "request", allure.attachment_type.JSON)
        allure.attach(b"raw " + KEY.encode(), "raw", allure.attachment_type.TEXT)
        assert KEY == "something else", f"server rejected key {KEY}"
''')


def _results(alluredir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in alluredir.glob("*-result.json")]


def _labels(result: dict, name: str) -> list[str]:
    return [lb["value"] for lb in result["labels"] if lb["name"] == name]


def _assert_no_leak(*paths: Path, text: str = "") -> None:
    red = Redactor([KEY])
    leaks = scan_paths(list(paths), red) + [str(lk) for lk in red.find_leaks(text)]
    assert not leaks, "\n".join(map(str, leaks))


def test_single_process_run_writes_a_complete_redacted_report(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", KEY)
    pytester.makepyfile(test_checks=CHECKS)
    reports = pytester.path / "reports"
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--ml4-reports", str(reports),
                                           f"--junitxml={junit}", "-rA", "--log-level=INFO", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=3, skipped=1, errors=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_checks.py:*: endpoint refused key [*][*][*]"])
    (run_dir,) = [p for p in reports.iterdir() if p.is_dir()]
    alluredir = run_dir / "allure-results"
    result.stdout.fnmatch_lines([f"ml4 report: Allure results in {alluredir}; HTML: ml4-report generate {run_dir}"])

    env = read_environment(alluredir / "environment.properties")
    assert env["Target"] == "rtxpro6000-tp8" and env["Endpoint"] == "live deployment"
    assert json.loads((alluredir / "executor.json").read_text())["name"] in ("local", "GitHub Actions",
                                                                           "GitLab CI", "Jenkins")
    assert json.loads((alluredir / "categories.json").read_text())[0]["name"] == GATE

    by_name = {r["name"]: r for r in _results(alluredir)}
    assert set(by_name) == {"The engine reports healthy", "Ttft gate", "Tool arguments are json",
                            "Burst [1]", "Burst [2]", "Leaky", "Skip with key", "Needs healthy"}
    health = by_name["The engine reports healthy"]
    assert _labels(health, "epic") == ["rtxpro6000-tp8"]
    assert _labels(health, "feature") == ["Smoke: the endpoint serves the model"]
    assert _labels(health, "story") == ["Health answers"]
    assert _labels(health, "severity") == ["blocker"]
    assert _labels(health, "parentSuite") == ["Smoke: the endpoint serves the model"]
    assert _labels(health, "suite") == ["test_checks"], "allure's default suite label is not added twice"
    assert _labels(by_name["Burst [1]"], "feature") == ["Hand-picked feature"], "a decorator's label is kept, once"
    assert by_name["Tool arguments are json"]["status"] == "broken"
    assert by_name["Ttft gate"]["status"] == "failed"
    assert by_name["Needs healthy"]["status"] == "failed", "an assertion in a fixture is a verdict too"

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["target"] == "rtxpro6000-tp8" and summary["exit_status"] == 1
    assert summary["tests"] == {"total": 8, "passed": 3, "failed": 3, "broken": 1, "skipped": 1, "not_judged": 0,
                                "does_not_apply": 0}
    checks = {c["nodeid"].split("::")[1]: c for c in summary["checks"]}
    assert checks["test_ttft_gate"]["categories"] == [GATE]
    assert checks["test_needs_healthy"]["categories"] == [GATE]
    assert checks["test_leaky"]["categories"] == [PROTOCOL]
    assert checks["test_tool_arguments_are_json"]["categories"] == [DEFECT]
    assert checks["test_burst[1]"]["suite"] == "tools"
    assert {g["name"]: g["passed"] for g in summary["gates"]} == {
        "suite: perf": False, "suite: reasoning": False, "suite: smoke": False, "suite: tools": False}

    # The key was in an assertion message, a log record, stdout, a user property and two attachments.
    assert any(p.suffix == ".json" and "api_key" in p.read_text() for p in alluredir.glob("*-attachment*"))
    _assert_no_leak(alluredir, junit, run_dir / "summary.json", text=result.stdout.str() + result.stderr.str())


def test_explicit_alluredir_is_redacted_and_clean_alluredir_with_xdist_is_refused(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", KEY)
    pytester.makepyfile(test_checks=CHECKS)
    mine = pytester.path / "mine"
    result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--ml4-reports", "reports",
                                           f"--alluredir={mine}", "-k", "leaky", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert len(_results(mine)) == 1 and (mine / "environment.properties").is_file()
    _assert_no_leak(mine, text=result.stdout.str())

    refused = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", f"--alluredir={mine}",
                                            "--clean-alluredir", "-n", "2", "-p", "no:cacheprovider")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--clean-alluredir cannot be combined with -n*"])
    assert len(_results(mine)) == 1, "nothing may be wiped before the refusal"


CRASHER = textwrap.dedent('''
    import os
    import pytest

    pytestmark = pytest.mark.preflight

    @pytest.mark.parametrize("i", range(4))
    def test_fine(i):
        pass

    def test_worker_dies():
        """The worker process dies mid-check."""
        os._exit(3)
''')


def test_crashed_xdist_worker_shows_as_broken(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_crash=CRASHER)
    reports = pytester.path / "reports"
    # -m preflight: the run needs no endpoint, so the controller does not probe one before starting workers.
    result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--ml4-reports", str(reports),
                                           "-n", "2", "-m", "preflight", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=1)
    (run_dir,) = [p for p in reports.iterdir() if p.is_dir()]
    results = _results(run_dir / "allure-results")
    broken = [r for r in results if r["status"] == "broken"]
    assert len(results) == 5 and len(broken) == 1
    crash = broken[0]
    assert crash["name"] == "The worker process dies mid-check"
    assert "worker-crash" in _labels(crash, "tag")
    assert _labels(crash, "epic") == ["rtxpro6000-tp8"]
    assert _labels(crash, "feature") == ["Preflight: deployment configuration"]
    assert _labels(crash, "suite") == ["test_crash"]
    assert "crashed while running" in crash["statusDetails"]["message"]
    summary = json.loads((run_dir / "summary.json").read_text())
    dead = next(c for c in summary["checks"] if c["nodeid"].endswith("test_worker_dies"))
    assert dead["outcome"] == "broken" and dead["categories"] == [CRASH]
    assert summary["tests"]["passed"] == 4


def test_allure_can_be_switched_off_and_the_summary_stays(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one="import pytest\n\n@pytest.mark.smoke\ndef test_one():\n    pass\n")
    for flags in (["--ml4-no-allure"], ["-p", "no:allure_pytest", "-W", "error::pytest.PytestUnknownMarkWarning"]):
        reports = pytester.path / ("r" + str(len(flags)))
        result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--ml4-reports", str(reports),
                                               "-p", "no:cacheprovider", *flags)
        result.assert_outcomes(passed=1)
        (run_dir,) = list(reports.iterdir())
        assert not (run_dir / "allure-results").exists(), flags
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["checks"][0]["suite"] == "smoke" and summary["tests"]["passed"] == 1


NOT_JUDGED_CHECKS = textwrap.dedent('''
    import pytest
    from pytest_ml4.checks.verdict import not_judged

    @pytest.mark.kv
    def test_peak_kv_usage():
        not_judged("no worker /metrics URL (endpoint.worker_metrics_url_env ML4_X unset)")

    @pytest.mark.kv
    def test_plain_skip():
        pytest.skip("needs a disaggregated target")
''')


def test_a_check_that_could_not_judge_is_recorded_as_not_judged_never_passed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_checks=NOT_JUDGED_CHECKS)
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--ml4-reports", str(reports), "-rs",
                                           "-p", "no:cacheprovider")
    assert result.ret == EXIT_NOT_JUDGED, "a run with a not-judged check is not signed: its own exit status"
    # The exit line counts it apart from skips, and the reason is listed with the check.
    assert result.parseoutcomes() == {"skipped": 1, "not_judged": 1}
    result.stdout.fnmatch_lines(["NOT JUDGED test_checks.py::test_peak_kv_usage: no worker /metrics URL*",
                                 "*= 1 skipped, 1 not_judged in *"])
    (run_dir,) = [p for p in reports.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_status"] == EXIT_NOT_JUDGED
    assert summary["tests"] == {"total": 2, "passed": 0, "failed": 0, "broken": 0, "skipped": 1, "not_judged": 1,
                                "does_not_apply": 0}
    checks = {c["nodeid"].split("::")[1]: c for c in summary["checks"]}
    assert checks["test_peak_kv_usage"]["outcome"] == "not_judged"
    assert checks["test_peak_kv_usage"]["message"].startswith("not judged: no worker /metrics URL")
    assert checks["test_plain_skip"]["outcome"] == "skipped"
    assert checks["test_plain_skip"]["message"] == "needs a disaggregated target", "every skip keeps its reason"
    # The suite's gate is not judged, not passed.
    assert [(g["passed"], g["outcome"]) for g in summary["gates"] if g["name"] == "suite: kv"] == [(None, "not_judged")]
    results = {r["name"]: r for r in _results(run_dir / "allure-results")}
    # Allure: never a skip (a skip leaves the overview's ring at 100 %), filed under its own category only.
    assert {n: r["status"] for n, r in results.items()} == {"Peak kv usage": "broken", "Plain skip": "skipped"}
    assert categorize("broken", results["Peak kv usage"]["statusDetails"]["message"]) == [NOT_JUDGED_CAT]
    assert categorize("skipped", results["Plain skip"]["statusDetails"]["message"]) == []


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--ml4-reports", "reports", "--ml4-no-allure",
                                         "-p", "no:cacheprovider", *args)


@pytest.mark.parametrize("how", [["--ml4-allow-not-judged"], ["-o", "ml4_allow_not_judged=true"]])
def test_an_exploratory_run_may_allow_not_judged(pytester: pytest.Pytester, how: list[str]) -> None:
    """--ml4-allow-not-judged (or its ini twin) gives exit 0 back, and says the run is no sign-off."""
    pytester.makepyfile(test_checks=NOT_JUDGED_CHECKS)
    result = _run(pytester, *how)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["ml4: 1 check(s) not judged, allowed by --ml4-allow-not-judged*not a sign-off",
                                 ("overall *NOT JUDGED *1 check(s) not judged: not a sign-off (allowed by "
                                  "--ml4-allow-not-judged) (exit 0)")])
    assert _run(pytester, "-k", "plain_skip").ret == 0, "a plain skip is no not-judged check"


FAILED_AND_NOT_JUDGED = NOT_JUDGED_CHECKS + textwrap.dedent('''
    @pytest.mark.smoke
    def test_health():
        assert False, "GET /health answered 503"
''')


def test_a_failure_wins_over_not_judged(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_checks=FAILED_AND_NOT_JUDGED)
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*= ml4 verdict =*",
                                 "smoke *FAIL *test_health: AssertionError: GET /health answered 503*",
                                 "kv *NOT JUDGED *test_peak_kv_usage: no worker /metrics URL*",
                                 "overall *FAIL *1 check(s) failed (exit 1)"])
