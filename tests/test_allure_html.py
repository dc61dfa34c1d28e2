"""The release report end to end: two runs, the Allure 2 single-file HTML generated offline with history, loaded
in headless Chromium, which must show the environment, categories, the trend and every test of the run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_ml4.report.categories import categorize, load_categories
from pytest_ml4.report.history import extract_history
from pytest_ml4.report.html import embedded_files

# pytester points HOME at a temporary folder; tests/conftest.py pins ML4_TOOLS first, so the installed tools
# (the Allure CLI, Java) stay found.
GATE, PROTOCOL, _, _, DEFECT, NOT_JUDGED_CAT = (c.name for c in load_categories())

CHECKS = textwrap.dedent('''
    import os
    import pytest

    @pytest.mark.smoke
    def test_health_answers():
        """The engine reports healthy."""

    @pytest.mark.perf
    def test_ttft_gate():
        assert os.environ.get("ML4_TEST_TTFT", "1.0") == "1.0", "gate TTFT p50 exceeds 2.0 s at c16"

    @pytest.mark.tools
    @pytest.mark.parametrize("conc", [1, 4])
    def test_parallel_tool_calls(conc):
        pass

    @pytest.mark.smoke
    def test_stream_grammar():
        assert os.environ.get("ML4_TEST_TTFT", "1.0") == "1.0", "stream grammar: finish_reason sent twice"

    @pytest.mark.tools
    def test_tool_arguments_parse():
        if os.environ.get("ML4_TEST_TTFT", "1.0") != "1.0":
            raise KeyError("choices")
''')


def _leaves(node: dict) -> list[dict]:
    """Test entries under a report tree node (Allure groups a category's tests by message first)."""
    kids = node.get("children")
    return [leaf for k in kids for leaf in _leaves(k)] if kids else [node]


def _offline(cmd: list[str]) -> list[str]:
    """Run ``cmd`` in a network namespace with only loopback when the machine allows it (root, util-linux)."""
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, check=False)
    if probe.returncode != 0:
        return cmd
    return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]


def _generate(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = _offline([sys.executable, "-m", "pytest_ml4.report.cli", "generate", str(run_dir), *extra])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_report_generated_offline_renders_the_run(pytester: pytest.Pytester,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_checks=CHECKS)
    reports = pytester.path / "reports"
    args = ("--target", "rtxpro6000-tp8", "--ml4-reports", str(reports), "-p", "no:cacheprovider")
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=6)
    (first,) = sorted(p for p in reports.iterdir() if p.is_dir())
    _generate(first)

    monkeypatch.setenv("ML4_TEST_TTFT", "3.1")  # the second night regresses: one gate fails
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=3, failed=3)
    second = max(p for p in reports.iterdir() if p.is_dir())
    out = _generate(second, "--render").stdout
    assert f"history from {first / 'allure-report'}" in out

    index = second / "allure-report" / "index.html"
    html = index.read_text()
    assert sorted(p.name for p in index.parent.iterdir()) == ["index.html"], "one archivable file"
    assert "googletagmanager" not in html
    assert not re.findall(r'<(?:script|link|img)[^>]+(?:src|href)="https?://', html), "no external resources"
    trend = json.loads(extract_history(second / "allure-report")["history-trend.json"])
    assert len(trend) == 2, "the trend spans both nightly runs"

    seen = json.loads((second / "report-render.json").read_text())
    overview = seen["overview_text"]
    for text in ("Environment", "rtxpro6000-tp8", "live deployment", "Engine version", "Suite version", "Trend",
                 "#1\n#2", "Categories",
                 "Gate failures (deployment misses a release threshold)", "Executors"):
        assert text in overview, f"overview lacks {text!r}"
    titles = {r["name"] for r in (json.loads(p.read_text()) for p in (second / "allure-results").glob("*-result.json"))}
    assert titles == {"The engine reports healthy", "Ttft gate", "Parallel tool calls [1]",
                      "Parallel tool calls [4]", "Stream grammar", "Tool arguments parse"}
    assert titles <= set(seen["tree_names"]), "every test of the run is in the rendered tree"
    assert {"rtxpro6000-tp8", "Performance gates", "Tool calling"} <= set(seen["tree_names"])
    for shot in ("report-overview.png", "report-behaviors.png"):
        data = (second / shot).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    cases = {tc["name"]: tc for tc in embedded_files(index, "data/test-cases/").values()}
    assert cases["Ttft gate"]["status"] == "failed" and cases["The engine reports healthy"]["status"] == "passed"
    # Allure's own (Java) category matching agrees with categorize(), which the run summary uses.
    shown = {leaf["name"]: cat["name"] for cat in embedded_files(index)["data/categories.json"]["children"]
             for leaf in _leaves(cat)}
    predicted = {name: categorize(tc["status"], tc.get("statusMessage"), tc.get("statusTrace"))
                 for name, tc in cases.items() if tc["status"] in ("failed", "broken")}
    assert {n: [c] for n, c in shown.items()} == predicted
    assert set(shown.values()) == {GATE, PROTOCOL, DEFECT}


NOT_JUDGED_RUN = textwrap.dedent('''
    import pytest
    from pytest_ml4.checks.verdict import not_judged

    @pytest.mark.smoke
    def test_health_answers():
        pass

    @pytest.mark.reasoning
    def test_reasoning_share():
        not_judged("no baseline recorded for this deployment; record one with: pytest --ml4-record-baselines")

    @pytest.mark.restart
    def test_does_not_apply():
        pytest.skip("does not apply: one worker")
''')


def test_a_not_judged_gate_is_no_pass_ring_and_has_its_own_category(pytester: pytest.Pytester) -> None:
    """Allure 2's overview ring is passed / (passed + failed + broken): drawn as a skip, a not-judged gate left it
    at 100 %. Written as broken it takes the ring below, under the "Not judged" category alone."""
    pytester.makepyfile(test_checks=NOT_JUDGED_RUN)
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--ml4-reports", str(reports), "-p",
                                           "no:cacheprovider")
    assert result.ret == 6, result.stdout.str()[-2000:]
    (run,) = [p for p in reports.iterdir() if p.is_dir()]
    _generate(run, "--render")
    overview = json.loads((run / "report-render.json").read_text())["overview_text"]
    assert "\n50%\n" in overview and "100%" not in overview, overview[:600]
    cases = {tc["name"]: tc for tc in embedded_files(run / "allure-report" / "index.html",
                                                     "data/test-cases/").values()}
    assert cases["Reasoning share"]["status"] == "broken" and cases["Does not apply"]["status"] == "skipped"
    shown = {leaf["name"]: cat["name"]
             for cat in embedded_files(run / "allure-report" / "index.html")["data/categories.json"]["children"]
             for leaf in _leaves(cat)}
    assert shown == {"Reasoning share": NOT_JUDGED_CAT}, "in no other category (no gate failure, no test defect)"
