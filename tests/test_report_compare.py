"""Run summaries and the nightly comparison (``ml4-report compare``): table, trend PNG, exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_ml4.perf.baseline import Baseline
from pytest_ml4.perf.summary import update_summary
from pytest_ml4.report.cli import main
from pytest_ml4.report.compare import (
    compare_runs,
    format_table,
    trend_png,
)
from pytest_ml4.report.summary import (
    CheckRecord,
    build_summary,
    perf_points,
    stored_runs,
    write_summary,
)
from pytest_ml4.target.baselines import default_baseline, direction

BASELINE = default_baseline("perf", "rtxpro6000-tp8")


def _points(scale_itl: float = 1.0, scale_tok: float = 1.0) -> list[dict[str, float]]:
    base = {c["concurrency"]: c for c in json.loads(BASELINE.read_text())["figures"]}
    return [{"concurrency": c, "itl_p50_ms": p["itl_p50_ms"] * scale_itl, "tok_s_user": p["tok_s_user"] * scale_tok,
             "ttft_p50_s": p["ttft_p50_s"], "out_tok_s": p["out_tok_s"] * scale_tok, "requests": p["requests"]}
            for c, p in sorted(base.items())]


def _run(root: Path, name: str, *, points: list[dict[str, float]] | None, outcome: str = "passed",
         started: float = 1.0e9, target: str = "rtxpro6000-tp8", settings: dict | None = None) -> Path:
    run = root / name
    run.mkdir(parents=True)
    if points is not None:
        # Written by the perf suite's own writer, so the two sides agree on the file.
        update_summary(run, target, True, "sweep", {
            "points": [dict(p, ok=True, problems=[], artifact_dir="aiperf/c1") for p in points],
            "gates": [{"gate": "zero errors", "concurrency": None, "passed": outcome == "passed", "detail": ""},
                      {"gate": "ttft knee", "concurrency": 16, "passed": True, "detail": "p99 7.5 s"}],
            "baseline": None, "passed": outcome == "passed",
            "settings": settings or {"isl": 512, "osl": 4096, "duration_s": 300, "short": False}})
    checks = [CheckRecord("suites/test_smoke.py::test_health", "Health", "smoke", "passed"),
              CheckRecord("suites/test_tools.py::test_parallel", "Parallel", "tools", outcome,
                          message="" if outcome == "passed" else "AssertionError: stream grammar broken")]
    doc = build_summary(run_dir=run, target=target, simulated=True, faults=(), versions={"engine": "0.33.0"},
                        checks=checks, started=started, finished=started + 60, exit_status=0)
    write_summary(run, doc)
    return run


def test_summary_holds_gates_versions_and_perf_per_concurrency(tmp_path: Path) -> None:
    run = _run(tmp_path, "r1", points=_points(), outcome="failed")
    doc = json.loads((run / "summary.json").read_text())
    assert doc["schema"] == 1 and doc["target"] == "rtxpro6000-tp8" and doc["versions"]["engine"] == "0.33.0"
    assert doc["tests"] == {"total": 2, "passed": 1, "failed": 1, "broken": 0, "skipped": 0, "not_judged": 0,
                            "does_not_apply": 0}
    assert doc["suites"]["tools"]["failed"] == 1
    gates = {g["name"]: g["passed"] for g in doc["gates"]}
    assert gates == {"suite: smoke": True, "suite: tools": False, "perf sweep: zero errors": False,
                     "perf sweep: ttft knee @c16": True}
    assert doc["perf"]["16"]["itl_p50_ms"] == pytest.approx(31.5)
    assert doc["duration_s"] == 60


def test_perf_points_accepts_list_and_mapping_shapes() -> None:
    as_list = {"points": [{"concurrency": 4, "x_s": 1, "flag": True, "label": "a"}]}
    as_map = {"per_concurrency": {"4": {"x_s": 1}}}
    assert perf_points(as_list) == perf_points(as_map) == {4: {"x_s": 1.0}}
    assert perf_points({"nothing": 1}) == {}


def test_direction_of_seed_figures() -> None:
    assert [direction(m) for m in ("ttft_p50_s", "itl_p99_ms", "error_rate_pct", "out_tok_s", "tok_s_user",
                                   "decode_conc_avg", "requests")] == [-1, -1, -1, 1, 1, 1, 0]


def test_itl_regression_beyond_tolerance_is_flagged_vs_previous_and_baseline(tmp_path: Path) -> None:
    _run(tmp_path, "20261101-a", points=_points(), started=1.0e9)
    _run(tmp_path, "20261102-a", points=_points(scale_itl=1.25), started=1.1e9)
    runs = stored_runs(tmp_path, "rtxpro6000-tp8")
    comp = compare_runs(runs, Baseline.load(BASELINE), tolerance=0.10)
    bad = {(r.scope, r.subject) for r in comp.regressions}
    assert ("vs previous", "c16 itl_p50_ms") in bad
    assert ("vs baseline", "c16 itl_p50_ms") in bad
    assert not any("tok_s" in s or "requests" in s for _, s in bad)
    # TTFT past c16 is queueing (baseline: value_max_concurrency {"ttft": 16}): never judged by value.
    assert not any(r.subject in ("c32 ttft_p50_s", "c64 ttft_p50_s") for r in comp.rows if r.scope == "vs baseline")
    table = format_table(comp)
    assert "REGRESSION" in table and "+25.0%" in table and "regression(s) beyond tolerance" in table


def test_small_drift_within_tolerance_and_verdict_changes(tmp_path: Path) -> None:
    _run(tmp_path, "20261101-a", points=_points(), started=1.0e9)
    _run(tmp_path, "20261102-a", points=_points(scale_itl=1.05, scale_tok=0.97), outcome="failed", started=1.1e9)
    comp = compare_runs(stored_runs(tmp_path), None, tolerance=0.10)
    subjects = {r.subject for r in comp.regressions}
    assert subjects == {"check suites/test_tools.py::test_parallel", "gate suite: tools",
                        "gate perf sweep: zero errors"}


def test_trend_png_draws_the_key_figures(tmp_path: Path) -> None:
    for i, scale in enumerate((1.0, 1.02, 0.97)):
        _run(tmp_path, f"2026110{i + 1}-a", points=_points(scale_itl=scale), started=1.0e9 + i)
    out = trend_png(stored_runs(tmp_path), tmp_path / "trend.png", Baseline.load(BASELINE))
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
    assert trend_png([{"run_id": "x", "perf": {}}], tmp_path / "none.png") is None


def test_cli_compare_exit_status_and_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path, "20261101-a", points=_points(), started=1.0e9)
    _run(tmp_path, "20261102-a", points=_points(scale_itl=1.02), started=1.1e9)
    _run(tmp_path, "20261100-b", points=_points(scale_itl=3.0), started=0.9e9, target="gb300-agg")
    assert main(["compare", "--runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "baseline: " + str(BASELINE) in out and "no regressions" in out
    assert (tmp_path / "20261102-a" / "trend.png").is_file()

    _run(tmp_path, "20261103-a", points=_points(scale_itl=1.5), started=1.2e9)
    assert main(["compare", "--runs", str(tmp_path), "--png", str(tmp_path / "t.png")]) == 1
    assert "REGRESSION" in capsys.readouterr().out
    # A looser tolerance accepts the same run; an unknown baseline path is a usage error.
    assert main(["compare", "--runs", str(tmp_path), "--tolerance", "0.6", "--baseline", "none"]) == 0
    assert main(["compare", "--runs", str(tmp_path), "--baseline", str(tmp_path / "missing.json")]) == 2
    assert main(["compare", "--runs", str(tmp_path / "empty")]) == 2


def test_cli_latest_picks_newest_run_by_start_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path, "zz-explicit-name", points=None, started=1.0e9)      # named out of time order on purpose
    _run(tmp_path, "20261102-a", points=None, started=1.1e9)
    _run(tmp_path, "20261101-b", points=None, started=1.2e9, target="gb300-agg")
    assert main(["latest", "--runs", str(tmp_path), "--target", "rtxpro6000-tp8"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "20261102-a")
    assert main(["latest", "--runs", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "20261101-b")
    assert main(["latest", "--runs", str(tmp_path / "nothing")]) == 2


def test_trace_replay_figures_and_gates_are_kept(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    update_summary(run, "gb300-disagg", True, "trace", {
        "settings": {"trace": "fixtures/x.jsonl", "rows": 10, "warmup_requests": 2, "concurrency": 32},
        "point": {"concurrency": 32, "ttft_p50_s": 1.2, "tok_s_user_p50": 61.0, "ok": True, "osl_min": None},
        "gates": [{"gate": "dynamo tok/s/user p50 > 50", "concurrency": 32, "passed": True, "detail": ""}],
        "passed": True})
    doc = build_summary(run_dir=run, target="gb300-disagg", simulated=True, faults=(), versions={}, checks=[],
                        started=1.0, finished=2.0, exit_status=0)
    assert doc["perf_trace"] == {"concurrency": 32.0, "ttft_p50_s": 1.2, "tok_s_user_p50": 61.0}
    assert doc["gates"] == [{"name": "perf trace: dynamo tok/s/user p50 > 50 @c32", "passed": True, "detail": "",
                             "source": "perf"}]
    assert doc["perf"] == {}


def test_short_runs_meet_the_baseline_only_on_short_run_figures_and_unlike_runs_are_not_compared(
        tmp_path: Path) -> None:
    short = {"isl": 512, "osl": 256, "duration_s": 5, "short": True}
    _run(tmp_path, "20261101-a", points=_points(), started=1.0e9)
    _run(tmp_path, "20261102-a", points=_points(scale_tok=0.5), started=1.1e9, settings=short)
    comp = compare_runs(stored_runs(tmp_path), Baseline.load(BASELINE), tolerance=0.10)
    against_base = {r.subject.split()[1] for r in comp.rows if r.scope == "vs baseline"}
    assert against_base == {"tok_s_user", "itl_p50_ms"}, "the baseline's short_run_metrics only"
    assert {r.subject for r in comp.regressions} == {f"c{c} tok_s_user" for c in (1, 2, 4, 8, 16, 32, 64)}
    (note,) = [r for r in comp.rows if r.scope == "vs previous"]
    assert note.subject == "perf settings" and "osl=4096" in str(note.reference) and not note.regressed


def _empty_run(root: Path, name: str, started: float) -> Path:
    """A run whose start failed or was interrupted: a summary with no check judged."""
    run = root / name
    run.mkdir(parents=True)
    write_summary(run, build_summary(run_dir=run, target="rtxpro6000-tp8", simulated=True, faults=(), versions={},
                                     checks=[], started=started, finished=started + 1, exit_status=2,
                                     interrupted=True))
    return run


def test_latest_names_the_newest_run_with_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path, "20261102-a", points=None, started=1.1e9)
    _empty_run(tmp_path, "20261103-interrupted", started=1.2e9)
    assert main(["latest", "--runs", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "20261102-a")


def test_latest_with_only_empty_runs_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _empty_run(tmp_path, "20261103-interrupted", started=1.2e9)
    assert main(["latest", "--runs", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"ml4-report latest: no run folder with results under {tmp_path}"


def test_compare_on_a_first_run_says_so_and_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A first run (a fresh CI cache, a new cluster's Job) is no error: the next run has it to compare with."""
    _run(tmp_path, "20261102-a", points=None, started=1.1e9)
    _empty_run(tmp_path, "20261103-interrupted", started=1.2e9)  # not an earlier run to compare with either
    assert main(["compare", "--runs", str(tmp_path), "--baseline", "none"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"ml4-report compare: first run: 20261102-a of target rtxpro6000-tp8 has no earlier run with results "
        f"under {tmp_path} and no baseline; nothing to compare yet")


def test_control_compare_with_an_earlier_run_compares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path, "20261101-a", points=None, started=1.0e9)
    _run(tmp_path, "20261102-a", points=None, started=1.1e9)
    assert main(["compare", "--runs", str(tmp_path), "--baseline", "none", "--png", str(tmp_path / "t.png")]) == 0
    assert "previous run: 20261101-a" in capsys.readouterr().out

def test_comparisons_across_conditions_are_refused_with_one_line() -> None:
    """A baseline of other conditions that lists no figure comparable across run lengths, or an
    accuracy of another sample, is not compared: one row says why, naming both conditions."""
    from pytest_ml4.report.compare import compare_accuracy, compare_with_baseline
    from pytest_ml4.target.baselines import Provenance

    base = Baseline("b", {1: {"tok_s_user": 90.0}}, {}, Provenance("seed", {}), path=Path("b.json"),
                    conditions={"isl": 512, "osl": 4096, "duration_s": 300})
    (row,) = compare_with_baseline(base, {1: {"tok_s_user": 50.0}}, {"isl": 128, "osl": 256, "duration_s": 5}, 0.1)
    assert not row.regressed and "\n" not in row.change
    assert row.change == ("perf figures not compared with b.json: measured under other conditions (baseline vs this "
                          "run: isl 512 vs 128; osl 4096 vs 256; duration_s 300 vs 5)")
    # Control: the same figures under the baseline's conditions are compared (and this one regressed).
    (same,) = compare_with_baseline(base, {1: {"tok_s_user": 50.0}}, {"isl": 512, "osl": 4096, "duration_s": 300},
                                    0.1)
    assert same.regressed
    cond = {"benchmark": "BFCL v4 (bfcl-eval)", "bfcl_eval": "2026.3.23", "seed": 1234}
    ref = {"conditions": {**cond, "size": 200}, "categories": {"irrelevance": {"n": 200, "passed": 120}}}
    new = {"conditions": {**cond, "size": 40}, "categories": {"irrelevance": {"n": 40, "passed": 10}}}
    (acc,) = compare_accuracy("vs previous", ref, new)
    assert acc.change.endswith("(baseline vs this run: size 200 vs 40)") and not acc.regressed
