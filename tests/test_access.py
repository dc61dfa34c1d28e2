"""Access at a glance (issue 33 item 5): ``ml4-preflight --target NAME --access`` and the session header list what
each selected suite needs, set or missing, reachable or not; a check whose suite needs a missing access ends not
judged at setup, before any request.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ml4_http_stub import Scripted, StubServer
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.plugin.access import selected_suites
from pytest_ml4.plugin.markers import SUITE_MARKERS
from pytest_ml4.preflight.cli import main as preflight
from pytest_ml4.target.access import _PROBES, needs_table, survey
from pytest_ml4.target.model import load_target

REPO = Path(__file__).resolve().parent.parent
KEY = "sk-access-test-0123456789"


def test_the_table_names_every_suite_and_only_accesses_it_can_probe() -> None:
    table = needs_table()
    assert set(table.suites) == set(SUITE_MARKERS), "a suite marker without its access row (or a stale row)"
    assert set(table.accesses) == set(_PROBES)
    named = {a for row in table.suites.values() for a in (*row.needs, *row.uses)}
    assert named <= set(table.accesses), named - set(table.accesses)
    assert all(spec.what and spec.from_ and spec.how for spec in table.accesses.values())


@pytest.mark.parametrize(("expr", "suites"), [
    ("smoke or tools", ["smoke", "tools"]),
    ("not perf and not restart and not accuracy", ["smoke", "tools", "reasoning", "osl", "kv", "preflight"]),
    ("", list(SUITE_MARKERS)),
    ("(smoke or kv) and not smoke", ["kv"]),
    ("smoke(when=1) or not (perf or restart or accuracy or osl or kv or preflight or tools or reasoning)",
     ["smoke"]),
    ("smoke and", list(SUITE_MARKERS)),   # pytest refuses it itself; the header then lists every suite
])
def test_the_header_lists_the_suites_m_selects(expr: str, suites: list[str]) -> None:
    assert sorted(selected_suites(expr)) == sorted(suites)


@pytest.fixture(scope="module")
def sim_url() -> str:
    with SimServer("rtxpro6000-tp8", env={"LLM_API_KEY": KEY}) as sim:
        yield sim.base_url


def test_access_against_the_embedded_simulator(sim_url: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ML4_RTXPRO_URL", sim_url)
    monkeypatch.setenv("LLM_API_KEY", KEY)
    assert preflight(["--target", "rtxpro6000-tp8", "--access", "--suites", "smoke,tools"]) == 0
    out = capsys.readouterr().out
    assert (f"  endpoint       ML4_RTXPRO_URL: set, reachable ({sim_url}/models: HTTP 200); enables smoke, tools"
            in out), out
    assert "  api_key        LLM_API_KEY: set, reachable (accepted); enables smoke, tools" in out, out
    assert "  engine_metrics ML4_RTXPRO_METRICS_URL: missing; enables smoke (uses)" in out, out
    assert "logs" not in out and "restart" not in out, "smoke and tools need neither logs nor restart rights"
    assert "ml4-preflight: every access the 2 suite(s) need is set and reachable" in out
    assert KEY not in out


def test_a_refused_key_is_set_but_not_accepted(sim_url: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ML4_RTXPRO_URL", sim_url)
    monkeypatch.setenv("LLM_API_KEY", "sk-wrong-0123456789")
    assert preflight(["--target", "rtxpro6000-tp8", "--access", "--suites", "smoke"]) == 1
    out = capsys.readouterr().out
    assert f"  api_key        LLM_API_KEY: set, NOT reachable (refused: {sim_url}/models: HTTP 401)" in out, out
    assert "ml4-preflight: smoke cannot be judged: needs api_key (API key the endpoint accepts): LLM_API_KEY is " \
           "not reachable" in out, out
    assert "sk-wrong" not in out


def test_an_unset_variable_is_missing_with_the_fix(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ML4_RTXPRO_URL", raising=False)
    monkeypatch.setenv("LLM_API_KEY", KEY)
    assert preflight(["--target", "rtxpro6000-tp8", "--access", "--suites", "smoke,reasoning,preflight"]) == 1
    out = capsys.readouterr().out
    assert ("  endpoint       ML4_RTXPRO_URL: missing; enables smoke, reasoning; export the variable with "
            "https://HOST/v1, or pass --endpoint URL") in out, out
    assert ("ml4-preflight: smoke, reasoning cannot be judged: needs endpoint (OpenAI-compatible endpoint URL): "
            "ML4_RTXPRO_URL is missing; export the variable with https://HOST/v1, or pass --endpoint URL") in out, out
    assert "preflight cannot" not in out, "preflight needs no endpoint"


def test_kubernetes_accesses_name_the_namespace_variable() -> None:
    accesses = {a.name: a for a in survey(load_target("gb300-agg"), ["kv", "restart"], env={}, probe=False)}
    assert accesses["logs"].status == accesses["restart"].status == "missing"
    assert accesses["logs"].detail == "unset: ML4_NAMESPACE" and accesses["restart"].needed_by == ("restart",)
    assert accesses["worker_metrics"].source == "worker: ML4_GB300_AGG_WORKER_METRICS"
    assert accesses["worker_metrics"].status == "missing" and accesses["worker_metrics"].used_by == ("kv",)
    provided = survey(load_target("gb300-agg"), ["kv", "restart"], env={}, simulated=True)
    assert {a.status for a in provided} == {"provided"}


def test_bad_access_usage_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert preflight(["--access"]) == 2
    assert preflight(["--target", "rtxpro6000-tp8", "--access", "--suites", "smoke,smok"]) == 2
    err = capsys.readouterr().err
    assert "ml4-preflight: --access needs --target NAME" in err
    assert "ml4-preflight: --suites: unknown suite(s) smok; known: smoke, tools" in err


def test_a_suite_without_its_access_is_not_judged_before_any_request(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """gb300-agg live without ML4_NAMESPACE: every kv check ends not judged at setup naming the variable, and no
    request but the session-start check reaches the endpoint; the header says the same."""
    monkeypatch.delenv("ML4_NAMESPACE", raising=False)
    monkeypatch.delenv("ML4_GB300_AGG_WORKER_METRICS", raising=False)
    (pytester.path / "suites").mkdir()
    (pytester.path / "suites" / "test_kv_cache.py").write_text((REPO / "suites" / "test_kv_cache.py").read_text())
    models = b'{"object":"list","data":[{"id":"mistral-large-4","object":"model"}]}'
    with StubServer({"/v1/models": Scripted(200, "application/json", [models])}) as srv:
        result = pytester.runpytest("--target", "gb300-agg", "--endpoint", srv.base_url, "-m", "kv",
                                    f"--ml4-run-dir={pytester.path / 'run'}", "suites/test_kv_cache.py")
        paths = [s.path for s in srv.seen]
    outcomes = result.parseoutcomes()
    assert outcomes.get("not_judged") == 5 and set(outcomes) <= {"not_judged", "deselected"}, outcomes
    result.stdout.fnmatch_lines([
        "ml4 access for kv (ml4-preflight --target NAME --access):",
        ("  logs           kubernetes pods/log of DGD mistral-large-4-agg-gb300: missing (unset: ML4_NAMESPACE); "
        "enables kv; set the namespace variable; grant list pods and get pods/log*"),
        ("NOT JUDGED suites/test_kv_cache.py::test_kv_pool_holds_the_target_requirement: needs logs (the engine log*): "
        "kubernetes pods/log of DGD mistral-large-4-agg-gb300 is missing (unset: ML4_NAMESPACE); set the namespace "
        "variable*"),
    ])
    # The session-start check and, at the end, the version the summary records: no check sent anything.
    assert set(paths) <= {"/v1/models", "/version"}, paths


# -- late failures: target fields a selected suite needs, checked at collection (issue 33 "Late failures") --------

def _team_target(folder: Path, drop: list[str]) -> Path:
    """A team's copy of rtxpro6000-tp8 (its manifests and baseline beside it) with the dotted fields removed."""
    import shutil

    import yaml

    bundled = REPO / "pytest_ml4" / "data" / "targets"
    targets = folder / "targets"
    shutil.copytree(bundled, targets)
    doc = yaml.safe_load((bundled / "rtxpro6000-tp8.yaml").read_text())
    for dotted in drop:
        *parents, leaf = dotted.split(".")
        node = doc
        for part in parents:
            node = node[part]
        del node[leaf]
    (targets / "mine.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return targets


def test_missing_fields_name_the_file_the_field_and_the_suite(tmp_path: Path) -> None:
    from pytest_ml4.target.access import missing_fields

    targets = _team_target(tmp_path, ["gates.knee_not_before", "perf.baseline", "perf.workloads.sessions"])
    target = load_target("mine", targets)
    lines = [f.line() for f in missing_fields(target, ["perf", "smoke"])]
    where = targets / "mine.yaml"
    assert lines == [
        (f"{where}: gates.knee_not_before or perf.baseline not set; the perf suite's test_latency_knee needs it: the "
        f"latency knee is judged against the target's bound or a stored baseline's knee"),
        (f"{where}: perf.workloads.sessions not set; the perf suite's test_goodput_at_production_rate[sessions] needs "
        f"it: the sessions workload's production rate and SLOs (README 'SLOs')"),
        (f"{where}: perf.workloads.sessions not set; the perf suite's "
         f"test_answers_stay_correct_under_load[goodput-sessions] needs it: the probes ride the sessions workload's "
         f"production-rate run"),
        (f"{where}: perf.workloads.sessions not set; the perf suite's test_sessions_reuse_the_shared_prefix needs it: "
        f"the sessions workload (turns, shared system prompt) is what it replays"),
    ]
    assert missing_fields(target, ["smoke", "kv"]) == [], "no perf selected: nothing to say"
    assert [f.check for f in missing_fields(target, ["perf"], given=["perf.baseline"])] == [
        "test_goodput_at_production_rate[sessions]", "test_answers_stay_correct_under_load[goodput-sessions]",
        "test_sessions_reuse_the_shared_prefix"]
    assert missing_fields(load_target("rtxpro6000-tp8"), ["perf"]) == [], "the bundled targets set every field"


def test_dynamo_only_fields_and_a_trace_that_is_not_there(tmp_path: Path) -> None:
    from pytest_ml4.target.access import missing_fields

    doc_dir = REPO / "pytest_ml4" / "data" / "targets"
    target = load_target("gb300-agg", doc_dir, overrides={"perf": {"trace": "traces/none.jsonl"},
                                                          "gates": {"decode_tok_s_user_p50_min": None,
                                                                    "ttft_p50_s_max": None}})
    missing = {f.check: f for f in missing_fields(target, ["perf"])}
    assert set(missing) == {"test_dynamo_gate", "test_agentic_trace_replay", "test_answers_stay_correct_under_load[trace]"}
    assert missing["test_agentic_trace_replay"].problem == (f"names {target.resolve('traces/none.jsonl')}, which does "
                                                            f"not exist")


def test_a_perf_run_reports_missing_fields_before_any_request(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A team's target without the knee bound, a baseline and the sessions workload: the header names each missing
    field, and those checks end not judged at setup: no sweep, no request (was: failed after the whole sweep)."""
    monkeypatch.setenv("LLM_API_KEY", KEY)
    targets = _team_target(tmp_path, ["gates.knee_not_before", "perf.baseline", "perf.workloads.sessions"])
    (pytester.path / "suites").mkdir()
    (pytester.path / "suites" / "test_perf.py").write_text((REPO / "suites" / "test_perf.py").read_text())
    models = b'{"object":"list","data":[{"id":"ml4","object":"model"}]}'
    with StubServer({"/v1/models": Scripted(200, "application/json", [models])}) as srv:
        collected = pytester.runpytest(f"--target-dir={targets}", "--target", "mine", "--endpoint", srv.base_url,
                                       "-m", "perf", "--collect-only", "suites/test_perf.py")
        result = pytester.runpytest(f"--target-dir={targets}", "--target", "mine", "--endpoint", srv.base_url,
                                    "-m", "perf", f"--ml4-run-dir={pytester.path / 'run'}", "suites/test_perf.py",
                                    "-k", "latency_knee or sessions")
        paths = [s.path for s in srv.seen]
    where = targets / "mine.yaml"
    collected.stdout.fnmatch_lines([
        (f"ml4 target field: {where}: gates.knee_not_before or perf.baseline not set; the perf suite's "
        f"test_latency_knee needs it: * (not judged)"),
        (f"ml4 target field: {where}: perf.workloads.sessions not set; the perf suite's "
        f"test_goodput_at_production_rate[[]sessions] needs it: * (not judged)"),
    ])
    assert result.parseoutcomes().get("not_judged") == 4, result.outlines[-15:]
    result.stdout.fnmatch_lines([
        (f"NOT JUDGED suites/test_perf.py::test_latency_knee: {where}: gates.knee_not_before or perf.baseline not "
        f"set; the perf suite's test_latency_knee needs it: *"),
        (f"NOT JUDGED suites/test_perf.py::test_sessions_reuse_the_shared_prefix: {where}: perf.workloads.sessions "
        f"not set*"),
    ])
    assert set(paths) <= {"/v1/models", "/version"}, f"a check sent requests: {paths}"
