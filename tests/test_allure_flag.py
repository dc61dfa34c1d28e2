"""allure-pytest's own flags work with the plugin's Allure handling.

Run as the allure-pytest docs show (``pytest --alluredir=DIR``, ``--alluredir DIR``, ``--clean-alluredir``): the
exit code is the tests' alone (allure-pytest's cleanup used to raise ``AssertionError: one of name or plugin needs
to be specified`` after a green run, exit 1) and the results are complete and redacted.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

TESTS = textwrap.dedent('''
    import os
    import pytest

    @pytest.mark.smoke
    def test_one():
        """First check."""

    @pytest.mark.smoke
    @pytest.mark.parametrize("n", [1, 2])
    def test_two(n):
        print("key", os.environ["LLM_API_KEY"])
''')
KEY = "sk-allure-flag-7d1e9b3c5a2f4086"


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_checks=TESTS)
    return pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "-p", "no:randomly", "-p", "no:cacheprovider",
                                         "-s", *args)


def _assert_complete(alluredir: Path) -> None:
    results = [json.loads(p.read_text()) for p in alluredir.glob("*-result.json")]
    assert sorted(r["name"] for r in results) == ["First check", "Two [1]", "Two [2]"]
    assert all(r["status"] == "passed" for r in results)
    for meta in ("environment.properties", "executor.json", "categories.json"):
        assert (alluredir / meta).is_file(), f"{meta} missing from {alluredir}"
    assert KEY not in "".join(p.read_text() for p in alluredir.iterdir() if p.is_file()), "results are redacted"


@pytest.mark.parametrize("form", ["equals", "space"])
def test_alluredir_as_the_allure_docs_show_exits_with_the_tests_status(pytester: pytest.Pytester, form: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", KEY)
    args = ["--alluredir=allure-results"] if form == "equals" else ["--alluredir", "allure-results"]
    result = _run(pytester, *args)
    out = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in out and "one of name or plugin" not in out
    assert result.ret == 0, out[-2000:]
    result.assert_outcomes(passed=3)
    _assert_complete(pytester.path / "allure-results")


def test_clean_alluredir_empties_the_folder_once_and_keeps_this_runs_results(pytester: pytest.Pytester,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", KEY)
    alluredir = pytester.path / "allure-results"
    alluredir.mkdir()
    (alluredir / "stale-result.json").write_text("{}")
    result = _run(pytester, f"--alluredir={alluredir}", "--clean-alluredir")
    assert result.ret == 0, (result.stdout.str() + result.stderr.str())[-2000:]
    assert not (alluredir / "stale-result.json").exists(), "--clean-alluredir removes the previous results"
    _assert_complete(alluredir)


def test_without_clean_the_previous_results_stay(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", KEY)
    alluredir = pytester.path / "allure-results"
    alluredir.mkdir()
    (alluredir / "old-result.json").write_text("{}")
    result = _run(pytester, f"--alluredir={alluredir}")
    assert result.ret == 0
    assert (alluredir / "old-result.json").exists(), "allure-pytest keeps results unless told to clean"


def test_a_failing_test_still_exits_1_with_its_result_written(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", KEY)
    pytester.makepyfile(test_fail="def test_fails():\n    assert 1 == 2, 'expected failure'\n")
    result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--alluredir=out", "test_fail.py",
                                           "-p", "no:randomly")
    assert result.ret == 1
    assert "one of name or plugin" not in result.stdout.str() + result.stderr.str()
    (res,) = [json.loads(p.read_text()) for p in (pytester.path / "out").glob("*-result.json")]
    assert res["status"] == "failed"
