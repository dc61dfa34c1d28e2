"""The BFCL accuracy gate: statistics, BFCL's checker on known calls, bad input, the synthetic-acceptance guard,
and the suite end to end against the simulator (passes vs the stored baseline, fails under ``accuracy_drop``).

What the end-to-end test proves is the gate's machinery (BFCL's own checker scores, the baseline is saved and
read back, the drop is judged and reported), never a model's accuracy: the simulator's answers are nobody's, and
its baseline is its own. So the verdict it expects is recomputed here from the two runs' counts with the
documented rule, not taken from the gate."""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest
from checkout import FIXTURES_DIR, REPO_ROOT
from pytest_ml4_sim.deploy.simulator import SimServer
from pytest_ml4_sim.sim.faults import ActiveFaults
from pytest_ml4_sim.sim.responder import plan_response

from pytest_ml4.accuracy.bfcl import CategoryError, load, resolve_categories
from pytest_ml4.accuracy.data import Item
from pytest_ml4.accuracy.score import score_reply
from pytest_ml4.accuracy.stats import drop_z, items_needed, wilson
from pytest_ml4.accuracy.synthetic import engine_config_unread, synthetic_acceptance
from pytest_ml4.logs import FileLogReader, LogView
from pytest_ml4.runtime.installed import ToolMissing, bfcl_site
from pytest_ml4.target.model import load_target

SUITE = str(REPO_ROOT / "suites" / "test_accuracy.py")


def test_wilson_interval_hand_values() -> None:
    # 50/100: centre 0.5, half-width 1.96*sqrt(0.0025 + 1.96^2/40000)/(1 + 1.96^2/100) = 0.0962.
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    # 0/10 keeps a non-zero upper bound (the reason for Wilson over the normal interval): 3.8416/13.8416.
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)


def test_drop_z_hand_values() -> None:
    # 120/200 vs 100/200: pooled 0.55, se = sqrt(0.55*0.45*0.01) = 0.04975, z = 0.1/0.04975 = 2.010.
    z, p = drop_z(120, 200, 100, 200)
    assert z == pytest.approx(2.010, abs=1e-3) and p == pytest.approx(0.0222, abs=1e-3)
    assert drop_z(10, 10, 10, 10) == (0.0, 1.0)


def test_items_needed_for_a_5_point_drop() -> None:
    # (1.6449*sqrt(2*.875*.125) + 0.8416*sqrt(.09 + .1275))^2 / .05^2 = 539.9 (docs/decisions/accuracy.md, BFCL).
    assert items_needed(0.90, 0.05) == 540
    assert items_needed(0.50, 0.05) > items_needed(0.90, 0.05)


@pytest.fixture(scope="module")
def bfcl(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return load(tmp_path_factory.mktemp("bfcl"))


def _item(bfcl, category: str, idx: int) -> tuple[Item, object]:  # type: ignore[no-untyped-def]
    entry = bfcl.load_dataset_entry(category)[idx]
    tools = bfcl.convert_to_tool(entry["function"], bfcl.gorilla_to_openapi, bfcl.openai_style)
    answers = {a["id"]: a["ground_truth"] for a in bfcl.load_ground_truth_entry(category)} \
        if category != "irrelevance" else {}
    return Item(entry["id"], category, entry["question"][0], entry["function"], tools), answers.get(entry["id"])


def _msg(name: str, args: dict) -> dict:  # type: ignore[type-arg]
    return {"content": None, "tool_calls": [{"id": "a1", "type": "function",
                                             "function": {"name": name, "arguments": json.dumps(args)}}]}


def test_bfcl_checker_on_known_calls(bfcl) -> None:  # type: ignore[no-untyped-def]
    item, answer = _item(bfcl, "simple_python", 0)  # triangle area, base 10, height 5 (bfcl.md "Data")
    assert item.tools[0]["function"]["name"] == "calculate_triangle_area"
    assert score_reply(bfcl, item, _msg("calculate_triangle_area", {"base": 10, "height": 5}), answer).valid
    wrong = score_reply(bfcl, item, _msg("calculate_triangle_area", {"base": 11, "height": 5}), answer)
    assert not wrong.valid and wrong.error_type == "value_error:others"
    typed = score_reply(bfcl, item, _msg("calculate_triangle_area", {"base": 10.0, "height": 5}), answer)
    assert not typed.valid and typed.error_type.startswith("type_error")
    none = score_reply(bfcl, item, {"content": "The area is 25."}, answer)
    assert not none.valid and none.got == "The area is 25."
    irr, _ = _item(bfcl, "irrelevance", 0)
    assert score_reply(bfcl, irr, {"content": "I cannot help with that."}, None).valid
    assert not score_reply(bfcl, irr, _msg(irr.tools[0]["function"]["name"], {}), None).valid


def test_unknown_category_lists_the_known_ones() -> None:
    with pytest.raises(CategoryError, match=r"unknown BFCL category simple; known: simple_python, multiple"):
        resolve_categories(["simple"])


def test_missing_bfcl_names_the_install_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ML4_TOOLS", str(tmp_path))
    with pytest.raises(ToolMissing, match=r"bfcl-eval 2026\.3\.23 not found .*scripts/install\.d/70-bfcl\.sh"):
        bfcl_site()


def test_guard_refuses_synthetic_acceptance() -> None:
    rtx = load_target("rtxpro6000-tp8")
    assert synthetic_acceptance(rtx, [rtx.resolve(m) for m in rtx.manifests]) == []
    flagged = load_target("rtxpro6000-tp8", overrides={"engine": {"speculative": {"synthetic_acceptance": True}}})
    assert "engine.speculative.synthetic_acceptance" in synthetic_acceptance(flagged, [])[0]
    case = FIXTURES_DIR / "preflight" / "spec-synthetic-acceptance"
    vr = load_target("vr200-agg")
    assert synthetic_acceptance(vr, [case / "clean" / "deploy.yaml"]) == []
    # The preflight rule lets a performance-only deployment use it; the accuracy gate never does.
    assert synthetic_acceptance(vr, [case / "broken" / "deploy.yaml"])
    assert synthetic_acceptance(vr, [case / "clean" / "perf-only-deploy.yaml"])


def _engine_log(path: Path) -> LogView:
    return LogView(FileLogReader(path).since_last_boot(), str(path))


@pytest.mark.parametrize("log", ["real-vllm-0.32-startup.log", "real-dynamo-vllm-engine-config.log"])
def test_guard_reads_the_config_real_engines_log(log: str) -> None:
    """Real vLLM 0.32 and a real dynamo.vllm worker (vLLM 0.31) log their speculative config at boot (recorded
    lines): read, and none is synthetic."""
    view = _engine_log(FIXTURES_DIR / "logs" / log)
    rtx = load_target("rtxpro6000-tp8")
    assert engine_config_unread(view) == ""
    assert synthetic_acceptance(rtx, [], view) == []


def test_guard_names_what_it_could_not_read(tmp_path: Path) -> None:
    """No log, or a log without the config line: the engine was not asked, which the check reports as not judged."""
    assert "could not be read (journalctl: permission denied)" in engine_config_unread(None,
                                                                                       "journalctl: permission denied")
    frontend = tmp_path / "frontend.log"
    frontend.write_text("2026-12-01T18:53:30.1Z  INFO dynamo_llm::http::service: Starting HTTP service\n")
    assert "shows no speculative config line" in engine_config_unread(_engine_log(frontend))


@pytest.mark.parametrize("faults", [(), ("synthetic_acceptance",)], ids=["healthy", "synthetic"])
def test_guard_asks_the_running_engine(tmp_path: Path, faults: tuple[str, ...]) -> None:
    """The simulated engine started with synthetic acceptance while its target declares none: only its logged
    config shows it, in both the API server's non-default args and the engine core's config line."""
    target = load_target("rtxpro6000-tp8")
    log = tmp_path / "engine.log"
    with SimServer(target, faults=list(faults), log_file=log, env={"LLM_API_KEY": "sk-test-123"}):
        view = _engine_log(log)
    reasons = synthetic_acceptance(target, [target.resolve(m) for m in target.manifests], view)
    assert engine_config_unread(view) == ""
    if not faults:
        assert reasons == []
        return
    assert len(reasons) == 2, reasons
    assert "'synthetic_acceptance_rate': 0.7" in reasons[0] and "synthetic_acceptance=True" in reasons[1]
    assert all(r.startswith("the running engine logged speculative_config=") for r in reasons)


def test_accuracy_drop_fault_is_deterministic_and_breaks_calls(bfcl) -> None:  # type: ignore[no-untyped-def]
    entries = bfcl.load_dataset_entry("simple_python")[:100]
    bodies = [{"messages": e["question"][0], "tools": bfcl.convert_to_tool(e["function"], bfcl.gorilla_to_openapi,
                                                                          bfcl.openai_style)} for e in entries]
    faults = ActiveFaults(["accuracy_drop=0.3"])
    clean = [plan_response(b, "auto").tool_calls for b in bodies]
    broken = [plan_response(b, "auto", faults).tool_calls for b in bodies]
    assert broken == [plan_response(b, "auto", faults).tool_calls for b in bodies]
    changed = sum(c != d for c, d in zip(clean, broken, strict=True))
    assert 15 <= changed <= 45, changed  # about 30 of 100 single-call answers


def _run(pytester: pytest.Pytester, reports: Path, *extra: str) -> pytest.RunResult:
    # Fast simulator timings: what is measured here is correctness, not latency.
    return pytester.runpytest_subprocess(
        SUITE, "--target", "rtxpro6000-tp8", "--sim", "--ml4-no-proxy", "-m", "accuracy", "-p", "no:randomly",
        "--accuracy-categories", "irrelevance,live_irrelevance", "--accuracy-size", "40",
        "--accuracy-concurrency", "16", "--ml4-set", "sim.itl_ms=1", "--ml4-set", "sim.ttft_s=0.01",
        "--ml4-set", "sim.extra.prefill_tok_s=1000000", "--ml4-reports", str(reports), "-rA", *extra, timeout=300)


def _drops_by_the_documented_rule(acc: dict[str, Any]) -> set[str]:
    """The categories the "BFCL accuracy" decision (docs/decisions/accuracy.md) calls a drop, from the summary's raw
    counts: more than the tolerance lost AND a one-sided pooled two-proportion z-test below alpha (stdlib NormalDist)."""
    tolerance, alpha = acc["settings"]["tolerance"], acc["settings"]["alpha"]
    drops = set()
    for category, now in acc["categories"].items():
        base = acc["baseline"]["categories"][category]
        p_base, p_now = base["passed"] / base["n"], now["passed"] / now["n"]
        pooled = (base["passed"] + now["passed"]) / (base["n"] + now["n"])
        se = math.sqrt(pooled * (1 - pooled) * (1 / base["n"] + 1 / now["n"]))
        p_value = 1 - NormalDist().cdf((p_base - p_now) / se) if se else 1.0
        if p_base - p_now > tolerance and p_value < alpha:
            drops.add(category)
    assert drops, f"the fault left no category dropping by the rule: {acc['categories']}"
    return drops


def test_suite_passes_vs_stored_baseline_and_fails_under_accuracy_drop(pytester: pytest.Pytester,
                                                                       tmp_path: Path) -> None:
    saved = tmp_path / "baseline.json"
    ok = _run(pytester, tmp_path / "r1", "--accuracy-save", str(saved))
    # pytest_ml4/data/baselines/accuracy-rtxpro6000-tp8.json was measured on 200 items per category: not this run's 40,
    # so it does not judge it and the gate says so, naming the command that records one.
    assert _outcomes(ok) == {"passed": 2, "not_judged": 1}
    ok.stdout.fnmatch_lines([("NOT JUDGED *test_accuracy_vs_baseline: accuracy (figures in accuracy-summary.json): "
                              "accuracy not compared with "
                              "*accuracy-rtxpro6000-tp8.json: measured under other conditions (baseline vs this "
                              "run: size 200 vs 40); record one under these conditions with: pytest --target "
                              "rtxpro6000-tp8 -m accuracy --ml4-record-baselines from a repository holding "
                              "targets/rtxpro6000-tp8.yaml*")])
    ok.stdout.fnmatch_lines(["*[[]ml4 accuracy[]] 80/80 items*"])
    doc = json.loads(saved.read_text())
    assert set(doc["figures"]) == {"irrelevance", "live_irrelevance"} and doc["conditions"]["size"] == 40
    assert doc["provenance"]["kind"] == "simulator" and "--accuracy-save" in doc["provenance"]["command"]
    bad = _run(pytester, tmp_path / "r2", "--accuracy-baseline", str(saved), "--ml4-fault", "accuracy_drop=0.5")
    bad.assert_outcomes(passed=2, failed=1)
    out = bad.stdout.str()
    assert "accuracy regression vs baseline" in out
    # Both categories named, with both figures and both sample sizes.
    assert "irrelevance: " in out and "live_irrelevance: " in out and "/40) vs baseline" in out
    [run_dir] = list((tmp_path / "r2").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["accuracy"]["categories"]["irrelevance"]["n"] == 40
    assert summary["accuracy"]["conditions"] == summary["accuracy"]["baseline"]["conditions"] == doc["conditions"]
    assert summary["accuracy"]["drops"] and not summary["accuracy"]["passed"]
    assert set(summary["accuracy"]["drop_categories"]) == _drops_by_the_documented_rule(summary["accuracy"])
    assert {g["name"]: g["passed"] for g in summary["gates"]}["accuracy: irrelevance"] is False
    # The Allure attachment lists every failed item with BFCL's error type.
    attached = [json.loads(p.read_text()) for p in (run_dir / "allure-results").glob("*-attachment.json")]
    items = next(a for a in attached if isinstance(a, list) and a and "error_type" in a[0])
    assert {"question", "expected", "got", "error_type"} <= set(items[0])
    assert any(i["error_type"] == "irrelevance:called_a_function" for i in items)


def _accuracy_run(baseline: Path | None, size: int = 200) -> Any:
    from pytest_ml4.accuracy.gate import CategoryScore, run_conditions
    from pytest_ml4.plugin.accuracy import AccuracyOptions, AccuracyRun

    run = AccuracyRun(AccuracyOptions(["irrelevance"], size, baseline, None))
    run.scores = {"irrelevance": CategoryScore("irrelevance", 200, 120)}
    run.conditions = run_conditions("2026.3.23", size, 1234)
    return run


def test_a_live_run_is_never_judged_by_the_simulators_baseline() -> None:
    """The stored accuracy baselines are the simulator's; on a live run the default one is no
    baseline (not judged, naming the command that records one), a named one is refused with one line, and on a
    simulator run the default one judges (control)."""
    from pytest_ml4.plugin.accuracy import judge_against_baseline

    target = load_target("rtxpro6000-tp8")
    from pytest_ml4.target.baselines import default_baseline

    default = default_baseline("accuracy", "rtxpro6000-tp8")
    live = _accuracy_run(None)
    judge_against_baseline(live, target, live=True)
    assert live.baseline is None and not live.baseline_refused
    # The hint records into the team's folder, never the package's (the bundled target's folder).
    assert "was made by the simulator, not recorded on this deployment; record one with: pytest --target " \
           "rtxpro6000-tp8 -m accuracy --ml4-record-baselines from a repository holding targets/rtxpro6000-tp8.yaml " \
           "(a copy of the bundled target): it writes baselines/accuracy-rtxpro6000-tp8.json beside that targets/ " \
           "folder, never into the installed package" in live.baseline_missing
    named = _accuracy_run(default)
    judge_against_baseline(named, target, live=True)
    assert named.baseline is None and "\n" not in named.baseline_refused
    assert "was made by the simulator and cannot judge a live deployment" in named.baseline_refused
    sim = _accuracy_run(None)
    judge_against_baseline(sim, target, live=False)
    assert sim.baseline is not None and sim.baseline.path == default and not sim.baseline_missing
    other = _accuracy_run(default, size=50)
    judge_against_baseline(other, target, live=False)
    assert other.baseline_refused.endswith("(baseline vs this run: size 200 vs 50)")


def test_unknown_category_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(SUITE, "--target", "rtxpro6000-tp8", "--accuracy-categories", "simple")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--accuracy-categories: unknown BFCL category simple; known: simple_python*"])


def test_report_compare_flags_a_significant_category_drop() -> None:
    from pytest_ml4.report.compare import compare_accuracy

    prev = {"categories": {"simple_python": {"n": 200, "passed": 160}, "irrelevance": {"n": 200, "passed": 120}}}
    # simple_python 80% -> 70% (z = 0.1/sqrt(.75*.25*.01) = 2.31, p = 0.010): a regression; irrelevance 60% ->
    # 58% is within the 5-point tolerance.
    latest = {"settings": {"tolerance": 0.05, "alpha": 0.05},
              "categories": {"simple_python": {"n": 200, "passed": 140}, "irrelevance": {"n": 200, "passed": 116}}}
    rows = {r.subject: r for r in compare_accuracy("vs previous", prev, latest)}
    assert rows["accuracy simple_python (n=200 vs 200)"].regressed
    assert rows["accuracy simple_python (n=200 vs 200)"].change == "-10.0 pts"
    assert not rows["accuracy irrelevance (n=200 vs 200)"].regressed
    assert compare_accuracy("vs previous", None, latest) == []


def _outcomes(result: pytest.RunResult) -> dict[str, int]:
    """pytest's exit-line counts, ``not_judged`` included (assert_outcomes knows only pytest's own outcomes)."""
    return {k: v for k, v in result.parseoutcomes().items() if k not in ("warnings", "warning")}
