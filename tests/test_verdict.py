"""The four outcomes and the verdict at a glance: the area and overall verdicts, ``ml4-report verdict`` (the same
lines, the run's exit status), checks that do not apply decided at collection from the target, and ``ml4-report
scan`` leaving LiteLLM's ``os.environ/VAR`` references alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_ml4.checks.verdict import EXIT_NOT_JUDGED
from pytest_ml4.plugin.markers import unmet_need
from pytest_ml4.report.cli import main
from pytest_ml4.report.summary import CheckRecord, build_summary, write_summary
from pytest_ml4.report.verdict import run_verdict, verdict_lines
from pytest_ml4.target.model import load_target

REPO = Path(__file__).resolve().parent.parent


def _check(name: str, suite: str, outcome: str, message: str = "") -> dict[str, Any]:
    return {"nodeid": f"suites/test_{suite}.py::{name}", "suite": suite, "outcome": outcome, "message": message}


def test_an_area_is_its_worst_outcome_and_the_run_its_worst_area() -> None:
    checks = [_check("test_health", "smoke", "passed"), _check("test_burst", "smoke", "passed"),
              _check("test_share", "reasoning", "passed"),
              _check("test_share_of_output", "reasoning", "not_judged",
                     "not judged: no baseline recorded; record one with: pytest --ml4-record-baselines"),
              _check("test_affinity", "restart", "does_not_apply", "does not apply: vr200-agg has 1 worker"),
              _check("test_ttft", "perf", "failed", "gate TTFT p50 3.0 s over 2.0 s\nmore lines")]
    verdict = run_verdict(checks, 1)
    assert [(a.area, a.verdict) for a in verdict.areas] == [
        ("smoke", "PASS"), ("reasoning", "NOT JUDGED"), ("restart", "DOES NOT APPLY"), ("perf", "FAIL")]
    by_area = {a.area: a for a in verdict.areas}
    assert by_area["reasoning"].reason == ("test_share_of_output: no baseline recorded; record one with: "
                                           "pytest --ml4-record-baselines")
    assert by_area["restart"].reason == "test_affinity: vr200-agg has 1 worker"
    assert by_area["perf"].reason == "test_ttft: gate TTFT p50 3.0 s over 2.0 s", "the first line only"
    assert by_area["smoke"].reason == "2 passed"
    assert (verdict.overall, verdict.reason) == ("FAIL", "1 check(s) failed")
    # Without the failure the run is not judged, and says whether that was allowed.
    rest = [c for c in checks if c["suite"] != "perf"]
    assert run_verdict(rest, EXIT_NOT_JUDGED).overall == "NOT JUDGED"
    assert "allowed by --ml4-allow-not-judged" in run_verdict(rest, 0).reason
    passing = [c for c in rest if c["outcome"] != "not_judged"]
    assert run_verdict(passing, 0).overall == "PASS"
    # Checks that do not apply are never a pass, and a run that did not finish has no verdict.
    assert run_verdict([checks[4]], 0).overall == "NO VERDICT"
    assert run_verdict(passing, 2).overall == "NO VERDICT"


def test_the_lines_are_one_per_area_then_overall() -> None:
    lines = verdict_lines(run_verdict([_check("test_health", "smoke", "passed"),
                                       _check("test_rule", "preflight", "skipped", "not applied: no hardware")], 0))
    assert lines == ["smoke      PASS            1 passed",
                     "preflight  SKIPPED         test_rule: not applied: no hardware",
                     "overall    PASS            1 check(s) passed, none failed or went unjudged (exit 0)"]


def _write_run(root: Path, name: str, checks: list[CheckRecord], exit_status: int, started: float) -> Path:
    run = root / name
    run.mkdir(parents=True)
    doc = build_summary(run_dir=run, target="rtxpro6000-tp8", simulated=True, faults=(), versions={},
                        checks=checks, started=started, finished=started + 1, exit_status=exit_status)
    write_summary(run, doc)
    return run


def test_ml4_report_verdict_prints_the_runs_lines_and_exits_as_it_did(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _write_run(tmp_path, "20261101-a", [CheckRecord("suites/test_smoke.py::test_health", "Health", "smoke")], 0,
               time.time() - 100)
    latest = _write_run(tmp_path, "20261102-a", [
        CheckRecord("suites/test_smoke.py::test_health", "Health", "smoke"),
        CheckRecord("suites/test_reasoning.py::test_share", "Share", "reasoning", outcome="not_judged",
                    message="not judged: no baseline recorded for this deployment"),
        CheckRecord("suites/test_restart.py::test_session_affinity", "Affinity", "restart",
                    outcome="does_not_apply", message="does not apply: vr200-agg has 1 aggregated worker(s)"),
        CheckRecord("suites/test_restart.py::test_plain", "Plain", "restart", outcome="skipped", message="why")],
        EXIT_NOT_JUDGED, time.time())
    doc = json.loads((latest / "summary.json").read_text())
    assert doc["verdict"]["overall"] == "NOT JUDGED" and doc["verdict"]["exit_status"] == EXIT_NOT_JUDGED
    assert {a["area"]: a["verdict"] for a in doc["verdict"]["areas"]} == {
        "smoke": "PASS", "reasoning": "NOT JUDGED", "restart": "DOES NOT APPLY"}
    # A suite gate is passed only when the area passed: one whose checks do not apply is never true.
    assert {g["name"]: (g["passed"], g["outcome"]) for g in doc["gates"]} == {
        "suite: reasoning": (None, "not_judged"), "suite: restart": (None, "does_not_apply"),
        "suite: smoke": (True, "passed")}
    assert doc["reasons"] == {
        "not_judged": [{"nodeid": "suites/test_reasoning.py::test_share",
                        "reason": "no baseline recorded for this deployment"}],
        "does_not_apply": [{"nodeid": "suites/test_restart.py::test_session_affinity",
                            "reason": "vr200-agg has 1 aggregated worker(s)"}],
        "skipped": [{"nodeid": "suites/test_restart.py::test_plain", "reason": "why"}]}

    assert main(["verdict", "--runs", str(tmp_path)]) == EXIT_NOT_JUDGED, "the newest run, its exit status"
    out = capsys.readouterr().out.splitlines()
    assert out == ["ml4 verdict of 20261102-a (target rtxpro6000-tp8)",
                   "smoke      PASS            1 passed",
                   "reasoning  NOT JUDGED      test_share: no baseline recorded for this deployment",
                   "restart    DOES NOT APPLY  test_session_affinity: vr200-agg has 1 aggregated worker(s)",
                   "overall    NOT JUDGED      1 check(s) not judged: not a sign-off (exit 6)"]
    assert main(["verdict", str(tmp_path / "20261101-a")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("overall  PASS ")
    assert main(["verdict", str(tmp_path / "missing")]) == 2
    assert "no readable summary.json" in capsys.readouterr().err


@pytest.mark.parametrize(("target", "role", "need", "unmet"), [
    ("vr200-agg", "kv_routed", 2, "vr200-agg has 1 aggregated worker(s) (agg topology); this check needs 2"),
    ("vr200-disagg", "kv_routed", 2, "vr200-disagg has 1 prefill worker(s) (disagg topology); this check needs 2"),
    ("vr200-disagg", "stream", 2, "vr200-disagg has 1 decode worker(s) (disagg topology); this check needs 2"),
    ("gb300-agg", "kv_routed", 2, None),
    ("gb300-disagg", "kv_routed", 2, None),
    ("gb300-disagg", "stream", 2, None),
])
def test_a_check_needing_workers_does_not_apply_where_the_topology_has_too_few(target: str, role: str, need: int,
                                                                                unmet: str | None) -> None:
    assert unmet_need(load_target(target), [pytest.mark.replicas(role, need).mark], embedded=True) == unmet


def test_field_and_embedded_needs_are_read_from_the_target_and_the_run() -> None:
    gb300, rtx = load_target("gb300-agg"), load_target("rtxpro6000-tp8")
    seed = pytest.mark.applies_if("gates.reasoning_share", why="the seed figure").mark
    assert unmet_need(gb300, [seed], embedded=True) == "gb300-agg sets no gates.reasoning_share (the seed figure)"
    assert unmet_need(rtx, [seed], embedded=True) is None
    crash = pytest.mark.embedded_only(why="pods drain").mark
    assert unmet_need(gb300, [crash], embedded=False) == "staged only by the embedded deployment (--sim): pods drain"
    assert unmet_need(gb300, [crash], embedded=True) is None


def test_suite_checks_that_cannot_apply_are_decided_at_collection(tmp_path: Path) -> None:
    """vr200-agg (one worker, no seed figure): affinity, the worker crash and the seed-conditions share do not
    apply; no endpoint is needed to say so, and the summary keeps each reason."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    cmd = [sys.executable, "-m", "pytest", "suites/test_restart.py", "suites/test_reasoning.py", "--target",
           "vr200-agg", "-k", "session_affinity or worker_crash or seed_conditions", f"--ml4-reports={tmp_path}",
           "--ml4-no-allure", "-p", "no:randomly", "-p", "no:cacheprovider", "-q"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (summary,) = tmp_path.glob("*/summary.json")
    doc = json.loads(summary.read_text())
    reasons = {r["nodeid"].split("::")[-1]: r["reason"] for r in doc["reasons"]["does_not_apply"]}
    assert reasons == {
        "test_session_affinity": "vr200-agg has 1 aggregated worker(s) (agg topology); this check needs 2 (affinity "
                                 "is observable only between two workers the KV router chooses from)",
        "test_worker_crash_under_a_stream": "vr200-agg has 1 aggregated worker(s) (agg topology); this check needs 2 "
                                            "(a crashed stream needs another worker to migrate to; the outage is "
                                            "test_new_requests_during_restart's)",
        "test_reasoning_share_at_seed_conditions[stream]": "vr200-agg sets no gates.reasoning_share (the seed figure "
                                                           "this check compares with)",
        "test_reasoning_share_at_seed_conditions[nonstream]": "vr200-agg sets no gates.reasoning_share (the seed "
                                                              "figure this check compares with)",
    }
    assert doc["tests"]["passed"] == 0 and doc["verdict"]["overall"] == "NO VERDICT", "never counted as a pass"
    assert "restart    DOES NOT APPLY  test_session_affinity: vr200-agg has 1" in proc.stdout, proc.stdout[-2000:]


def test_scan_leaves_litellm_environment_references_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "litellm.yaml"
    config.write_text("model_list:\n  - litellm_params:\n      api_key: os.environ/LLM_API_KEY\n"
                      "general_settings:\n  master_key: os.environ/LITELLM_MASTER_KEY\n")
    assert main(["scan", str(config)]) == 0
    assert capsys.readouterr().out.strip() == f"0 leak(s) in {config}"
    config.write_text(config.read_text() + "      api_key: abcd1234efgh5678\n")  # control: a literal key is one
    assert main(["scan", str(config)]) == 1
