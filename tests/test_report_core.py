"""Allure metadata (environment, executor, categories), labels, history extraction and crash results."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from pytest_ml4.report.categories import categorize, load_categories, write_categories
from pytest_ml4.report.environment import (
    engine_version,
    environment_properties,
    executor_from_env,
    read_environment,
    write_environment,
    write_executor,
)
from pytest_ml4.report.history import extract_history, previous_run, seed_history
from pytest_ml4.report.labels import (
    check_labels,
    check_title,
    humanize,
    load_suites,
    suite_of,
)
from pytest_ml4.report.results import write_crash_result
from pytest_ml4.target.model import load_target

GATE, PROTOCOL, UNREACHABLE, CRASH, DEFECT, NOT_JUDGED_CAT = (c.name for c in load_categories())


# ------------------------------------------------------------------------------------------- environment
def test_environment_properties_describe_the_target_without_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", "sk-live-0123456789abcdef")
    target = load_target("gb300-disagg")
    props = environment_properties(target, simulated=True, engine="0.33.0", faults=("slow_decode=2",),
                                   extra={"Note": "key sk-live-0123456789abcdef"})
    assert props["Target"] == "gb300-disagg"
    assert props["Topology"].startswith("disagg")
    assert props["Engine version"] == "0.33.0"
    assert props["Endpoint"].startswith("simulated")
    assert props["Injected faults"] == "slow_decode=2"
    assert props["Suite version"].startswith("pytest-ml4 ")
    assert "sk-live-0123456789abcdef" not in json.dumps(props)
    live = environment_properties(target, simulated=False)
    assert "configured" in live["Engine version"] and live["Endpoint"] == "live deployment"


def test_git_sha_names_the_commit_and_marks_local_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from pytest_ml4.report.environment import git_sha

    monkeypatch.delenv("ML4_GIT_SHA", raising=False)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f").write_text("1")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert git_sha(tmp_path) == head
    (tmp_path / "f").write_text("2")
    assert git_sha(tmp_path) == head + "+dirty"
    assert git_sha(tmp_path / "nope") == "unknown"
    monkeypatch.setenv("ML4_GIT_SHA", "abc123")   # container images have no .git
    assert git_sha(tmp_path) == "abc123"


def test_environment_file_round_trips_special_characters(tmp_path: Path) -> None:
    props = {"Model": "ml4 (/models/a=b)", "Key with: colon": "line1\nline2", "Path": "C:\\x"}
    path = write_environment(tmp_path, props)
    assert path.name == "environment.properties"
    assert read_environment(path) == props


CI_ENVS = {
    "github": ({"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r",
                "GITHUB_RUN_ID": "991", "GITHUB_RUN_NUMBER": "42", "GITHUB_WORKFLOW": "nightly"},
               {"type": "github", "buildOrder": 42, "buildUrl": "https://github.com/o/r/actions/runs/991",
                "buildName": "nightly #42"}),
    "gitlab": ({"GITLAB_CI": "true", "CI_PROJECT_URL": "https://gl/p", "CI_PIPELINE_IID": "7",
                "CI_JOB_NAME": "gate", "CI_JOB_URL": "https://gl/p/-/jobs/5"},
               {"type": "gitlab", "buildOrder": 7, "buildUrl": "https://gl/p/-/jobs/5", "buildName": "gate #7"}),
    "jenkins": ({"JENKINS_URL": "https://ci/", "BUILD_NUMBER": "13", "BUILD_URL": "https://bob:tok3n1234@ci/job/x/13/",
                 "BUILD_TAG": "jenkins-x-13"},
                {"type": "jenkins", "buildOrder": 13, "buildUrl": "https://***@ci/job/x/13/",
                 "buildName": "jenkins-x-13"}),
}


@pytest.mark.parametrize("ci", sorted(CI_ENVS))
def test_executor_from_each_ci(ci: str, tmp_path: Path) -> None:
    env, expected = CI_ENVS[ci]
    ex = executor_from_env({**env, "ML4_REPORT_URL": "https://reports/nightly/42/"})
    for key, value in expected.items():
        assert ex[key] == value, key
    assert ex["reportUrl"] == "https://reports/nightly/42/"
    written = json.loads(write_executor(tmp_path, ex).read_text())
    assert written == ex


def test_executor_outside_ci_is_local() -> None:
    ex = executor_from_env({})
    assert ex["type"] == "local" and "buildOrder" not in ex
    pod = executor_from_env({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "ml4-gate-x7k2p",
                             "ML4_NAMESPACE": "llm"})
    assert pod["type"] == "kubernetes" and pod["buildName"] == "ml4-gate-x7k2p in llm"


def test_engine_version_unreachable_gives_none() -> None:
    # Port 9 on loopback (discard) is closed: the caller falls back to the configured version.
    assert engine_version(["http://127.0.0.1:9/v1"], timeout=0.5) is None


# ------------------------------------------------------------------------------------------- categories
@pytest.mark.parametrize("status, message, expected", [
    ("failed", "AssertionError: gate TTFT p50 2.4 s exceeds 2.0 s at c32", GATE),
    ("failed", "AssertionError: decode tok/s/user 41 below the Dynamo gate 50", GATE),
    ("failed", "AssertionError: [FAIL] errors: c4 2 failed request(s), error rate 5.00 % (max 0 %)", GATE),
    ("failed", "AssertionError: stream grammar: finish_reason sent twice", PROTOCOL),
    ("failed", "AssertionError: tool_calls[0].function.arguments is not JSON", PROTOCOL),
    ("broken", "httpx.ConnectError: [Errno 111] Connection refused", UNREACHABLE),
    ("broken", "openai.APITimeoutError: Request timed out.", UNREACHABLE),
    ("broken", "worker 'gw1' crashed while running 'suites/test_x.py::test_y'", CRASH),
    ("broken", "KeyError: 'choices'", DEFECT),
])
def test_each_failure_lands_in_exactly_one_category(status: str, message: str, expected: str) -> None:
    assert categorize(status, message) == [expected]


def test_categories_file_is_written_and_valid(tmp_path: Path) -> None:
    path = write_categories(tmp_path)
    data = json.loads(path.read_text())
    assert [c["name"] for c in data] == [GATE, PROTOCOL, UNREACHABLE, CRASH, DEFECT, NOT_JUDGED_CAT]
    assert categorize("passed", "fine") == []


# ------------------------------------------------------------------------------------------- labels
def test_every_registered_suite_marker_has_a_title_and_severity() -> None:
    from pytest_ml4.plugin.markers import SUITE_MARKERS

    suites = load_suites()
    assert set(SUITE_MARKERS) <= set(suites)
    assert suites["smoke"].severity == "blocker"
    assert suites["perf"].title == "Performance gates"


def test_suite_from_marker_then_module_then_default() -> None:
    assert suite_of({"tools", "smoke"}).marker == "smoke", "the more severe suite wins"
    assert suite_of(set(), "test_reasoning.py").marker == "reasoning"
    assert suite_of({"parametrize"}, "test_misc.py").marker == "default"


@pytest.mark.parametrize("markers", [["tools", "reasoning"], ["reasoning", "tools"]])
def test_equally_severe_suites_go_to_the_checks_own_module(markers: list[str]) -> None:
    """Caught: a tools check also marked reasoning was counted under whichever marker a set iterated first, so the
    per-suite lines of two runs of the same checks differed."""
    assert suite_of(markers, "suites/test_tools.py").marker == "tools"
    assert suite_of(markers, "suites/test_reasoning.py").marker == "reasoning"
    assert suite_of(markers, "suites/test_replicas.py").marker == suite_of(markers[::-1], "test_replicas.py").marker


def test_titles_and_labels_read_like_a_release_note() -> None:
    def test_parallel_tool_calls_in_order() -> None:
        """Parallel tool calls come back in the order asked.

        More detail here."""

    assert check_title(test_parallel_tool_calls_in_order, "test_parallel_tool_calls_in_order") == \
        "Parallel tool calls come back in the order asked"
    assert check_title(None, "test_stream_usage_agrees") == "Stream usage agrees"
    assert humanize("test_") == "test_"
    labels = check_labels("rtxpro6000-tp8", {"kv"}, "test_kv.py", "test_pool_holds_256k")
    assert labels == {"epic": "rtxpro6000-tp8", "feature": "KV cache capacity and memory health",
                      "story": "Pool holds 256k", "severity": "critical",
                      "parentSuite": "KV cache capacity and memory health", "suite": "test_kv"}


# ------------------------------------------------------------------------------------------- history
def test_history_from_folder_and_from_single_file(tmp_path: Path) -> None:
    trend = b'[{"data":{"passed":3,"total":4}}]'
    folder = tmp_path / "folder-report"
    (folder / "history").mkdir(parents=True)
    (folder / "history" / "history-trend.json").write_bytes(trend)
    assert extract_history(folder) == {"history-trend.json": trend}

    single = tmp_path / "single"
    single.mkdir()
    b64 = base64.b64encode(trend).decode()
    (single / "index.html").write_text(f"<script>d('history/history-trend.json','{b64}');"
                                       f"d('data/suites.json','e30=')</script>")
    assert extract_history(single) == {"history-trend.json": trend}

    results = tmp_path / "results"
    assert seed_history(results, single) == ["history-trend.json"]
    assert (results / "history" / "history-trend.json").read_bytes() == trend
    assert seed_history(results, None) == [] and extract_history(tmp_path / "none") == {}


def _fake_run(root: Path, name: str, target: str, report: bool) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"schema": 1, "target": target, "run_id": name}))
    if report:
        (run / "allure-report").mkdir()
        (run / "allure-report" / "index.html").write_text("<html></html>")
    return run


def test_previous_run_is_newest_earlier_run_of_same_target_with_a_report(tmp_path: Path) -> None:
    _fake_run(tmp_path, "20261101-010000-a-000001", "a", report=True)
    wanted = _fake_run(tmp_path, "20261102-010000-a-000002", "a", report=True)
    _fake_run(tmp_path, "20261103-010000-b-000003", "b", report=True)
    _fake_run(tmp_path, "20261104-010000-a-000004", "a", report=False)
    current = _fake_run(tmp_path, "20261105-010000-a-000005", "a", report=False)
    _fake_run(tmp_path, "20261106-010000-a-000006", "a", report=True)
    assert previous_run(current) == wanted
    assert previous_run(wanted.parent / "20261101-010000-a-000001") is None


# ------------------------------------------------------------------------------------------- crash results
def test_crash_result_is_broken_with_labels_and_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", "sk-crash-abcdef0123456789")
    path = write_crash_result(tmp_path, "suites/test_tools.py::test_parallel[c2]",
                              "worker 'gw0' crashed while running ... key sk-crash-abcdef0123456789",
                              {"epic": "rtxpro6000-tp8", "feature": "Tool calling"}, "Parallel [c2]", 1.5)
    data = json.loads(path.read_text())
    assert data["status"] == "broken"
    assert data["name"] == "Parallel [c2]"
    labels = {(lb["name"], lb["value"]) for lb in data["labels"]}
    assert {("tag", "worker-crash"), ("epic", "rtxpro6000-tp8"), ("feature", "Tool calling")} <= labels
    assert data["fullName"] == "suites.test_tools#test_parallel"
    assert "sk-crash-abcdef0123456789" not in path.read_text()
    assert data["stop"] - data["start"] == 1500


def test_generate_refuses_an_output_folder_that_holds_the_results(tmp_path: Path) -> None:
    from pytest_ml4.report.html import ReportError, generate_report

    results = tmp_path / "run" / "allure-results"
    results.mkdir(parents=True)
    (results / "x-result.json").write_text("{}")
    for out in (tmp_path / "run", results, tmp_path):
        with pytest.raises(ReportError, match="would contain the results"):
            generate_report(results, out)
    assert (results / "x-result.json").is_file()
