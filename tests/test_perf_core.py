"""Core perf logic without a server: baseline, gates, methodology check, runner command line, trace, outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from checkout import REPO_ROOT

from pytest_ml4.locations import data_file
from pytest_ml4.perf import gates
from pytest_ml4.perf.baseline import (
    Baseline,
    BaselineError,
    compare,
    parse_compare_fail,
    sequential_run,
)
from pytest_ml4.perf.evaluate import baseline_knee
from pytest_ml4.perf.export import ProfileExport
from pytest_ml4.perf.figures import PointFigures, figures_from_export
from pytest_ml4.perf.methodology import (
    WHY_NOT_IGNORE_EOS,
    explain,
    ignore_eos_in_files,
    ignore_eos_uses,
)
from pytest_ml4.perf.plots import write_plots
from pytest_ml4.perf.progress import SweepProgress
from pytest_ml4.perf.roofline import roofline
from pytest_ml4.perf.runner import (
    API_KEY_ENV,
    AiperfSpec,
    PhaseState,
    build_argv,
    child_env,
    config_yaml,
    expected_p99_latency_s,
)
from pytest_ml4.perf.summary import update_summary
from pytest_ml4.perf.sweep import grace_for, settings_from_target, short_trace
from pytest_ml4.target.baselines import default_baseline
from pytest_ml4.target.model import load_target

BASELINE = default_baseline("perf", "rtxpro6000-tp8")
AIPERF = REPO_ROOT / "fixtures" / "aiperf"
TRACE = data_file("traces", "agentic-mooncake.jsonl")


def seed_points() -> list[PointFigures]:
    base = Baseline.load(BASELINE)
    out = []
    for c, row in sorted(base.points.items()):
        out.append(PointFigures(concurrency=c, requests=int(row["requests"]), errors=0, error_rate_pct=0.0,
                                out_tok_s=row["out_tok_s"], tok_s_user=row["tok_s_user"], tok_s_user_p50=row["tok_s_user"],
                                ttft_p50_s=row["ttft_p50_s"], ttft_p99_s=row["ttft_p99_s"], itl_p50_ms=row["itl_p50_ms"],
                                itl_p99_ms=row["itl_p99_ms"], decode_conc_avg=row["decode_conc_avg"],
                                decode_conc_p50=min(c, 16), decode_conc_max=min(c, 16),
                                reasoning_share=row["reasoning_share"], osl_min=4096, osl_max=4096, osl_std=0.0,
                                duration_s=300.0))
    return out


# ------------------------------------------------------------------------------------------------ baseline
def test_seed_baseline_file_is_the_seed_table() -> None:
    b = Baseline.load(BASELINE)
    assert sorted(b.points) == [1, 2, 4, 8, 16, 32, 64]
    assert b.points[32]["out_tok_s"] == 409.6 and b.points[1]["itl_p50_ms"] == 11.7
    assert b.conditions["osl"] == 4096 and b.conditions["duration_s"] == 300
    assert b.tolerances["ttft_p50_s"] == 0.20 and b.tolerances["itl_p50_ms"] == 0.10
    assert "seed" in b.provenance.fields["source"]
    assert sum(int(r["requests"]) for r in b.points.values()) == 155  # "155 requests total across the seven runs"


def test_compare_is_direction_aware_and_skips_queueing_ttft() -> None:
    b = Baseline.load(BASELINE)
    pts = seed_points()
    assert all(not d.regressed for d in compare(pts, b, full_run=True))
    slow = [replace(p, itl_p50_ms=p.itl_p50_ms * 2, tok_s_user=p.tok_s_user / 2) for p in pts]
    bad = {(d.concurrency, d.figure) for d in compare(slow, b, full_run=True) if d.regressed}
    assert (1, "itl_p50_ms") in bad and (64, "tok_s_user") in bad
    faster = [replace(p, itl_p50_ms=p.itl_p50_ms / 2) for p in pts]
    devs = compare(faster, b, full_run=True)
    assert not any(d.regressed for d in devs)            # better is not a regression ...
    assert any(not d.within_band for d in devs)          # ... but it is outside the calibration band
    figures = {d.figure for d in compare(pts, b, full_run=True) if d.concurrency == 32}
    assert "ttft_p50_s" not in figures and "itl_p50_ms" in figures
    short = {d.figure for d in compare(pts, b, full_run=False)}
    assert short == set(b.short_run_metrics)


def test_sequential_run_windows() -> None:
    # The seed's c1 row: 0.56 s + 4095 x 11.7 ms = 48.5 s a request; the 7th starts at 291 s (< 300 s) and would
    # end at 339 s, after the 30 s grace, so aiperf drops it and the window is 330 s.
    run = sequential_run(0.56, 11.7, 4096, 300, 30)
    assert run.requests == 6 and run.window_s == 330
    assert run.out_tok_s == pytest.approx(6 * 4096 / 330)
    assert run.decode_conc_avg == pytest.approx(6 * 4095 * 0.0117 / 330)
    # Faster requests that all finish inside the grace: the window closes at the last completion.
    fast = sequential_run(0.5, 10.0, 4096, 300, 30)              # 41.45 s: 8 starts, the last ends at 331.6 s
    assert fast.requests == 7 and fast.window_s == 330
    done = sequential_run(0.5, 10.0, 4096, 300, 40)
    assert done.requests == 8 and done.window_s == pytest.approx(8 * 41.45)
    assert done.decode_conc_avg == pytest.approx(4095 * 0.010 / 41.45)
    with pytest.raises(ValueError):
        sequential_run(0.0, 0.0, 4096, 300, 30)


def test_contradictory_c1_figure_is_compared_with_what_the_row_implies() -> None:
    b = Baseline.load(BASELINE)
    value, note = b.reference(1, "decode_conc_avg")
    assert b.points[1]["decode_conc_avg"] == 1.0                 # the file keeps the printed figure
    assert value == pytest.approx(0.871, abs=0.001) and "contradicts" in note and "6 requests" in note
    assert b.reference(1, "out_tok_s") == (67.9, "")             # 74.5 implied: within its 10 %, printed kept
    assert b.reference(2, "decode_conc_avg") == (1.7, "")        # only c1 is worked out
    c1 = seed_points()[0]
    healthy = replace(c1, out_tok_s=74.5, decode_conc_avg=0.873)  # what an endpoint with the row's TTFT/ITL gives
    devs = {d.figure: d for d in compare([healthy], b, full_run=True)}
    assert devs["decode_conc_avg"].within_band and "contradicts" in devs["decode_conc_avg"].describe()
    idle = replace(c1, decode_conc_avg=0.7)                       # a client or proxy stalling between requests
    assert {d.figure for d in compare([idle], b, full_run=True) if d.regressed} == {"decode_conc_avg"}


def test_compare_fail_expressions() -> None:
    assert parse_compare_fail("itl_p50_ms:10%, tok_s_user:5%") == {"itl_p50_ms": 0.10, "tok_s_user": 0.05}
    assert parse_compare_fail(["out_tok_s:2.5%"]) == {"out_tok_s": 0.025}
    for bad in ("itl:10", "nosuch:5%", "itl_p50_ms:ten%"):
        with pytest.raises(BaselineError):
            parse_compare_fail(bad)
    b = Baseline.load(BASELINE)
    pts = [replace(p, out_tok_s=p.out_tok_s * 0.97) for p in seed_points()]
    strict = compare(pts, b, full_run=False, tolerances={"out_tok_s": 0.02})
    assert any(d.figure == "out_tok_s" and d.regressed for d in strict)


# ------------------------------------------------------------------------------------------------ gates
def test_error_gate_on_real_exports() -> None:
    clean = figures_from_export(ProfileExport.load(AIPERF / "basic_c2_reasoning_servermetrics"), 2)
    errs = figures_from_export(ProfileExport.load(AIPERF / "errors_20pct"), 4)
    assert gates.error_gate(clean, 0.0).passed
    failed = gates.error_gate(errs, 0.0)
    assert not failed.passed and "30 failed" in failed.detail
    assert gates.error_gate(errs, 25.0).passed


def test_dynamo_gate_thresholds() -> None:
    t = load_target("gb300-agg")
    ok = replace(seed_points()[0], tok_s_user_p50=55.0, ttft_p50_s=1.5)
    assert all(r.passed for r in gates.dynamo_gates(ok, t))
    slow = replace(ok, tok_s_user_p50=27.5)
    res = {r.gate: r.passed for r in gates.dynamo_gates(slow, t)}
    assert res == {"decode_tok_s_user_p50": False, "ttft_p50": True}
    late = replace(ok, ttft_p50_s=2.0)                    # "below 2 seconds": 2.0 fails
    assert {r.gate: r.passed for r in gates.dynamo_gates(late, t)} == {"decode_tok_s_user_p50": True,
                                                                        "ttft_p50": False}
    assert gates.dynamo_gates(ok, load_target("rtxpro6000-tp8")) == []


def test_saturation_and_knee() -> None:
    pts = seed_points()
    assert all(gates.saturation_gate(p, 16).passed for p in pts)
    over = replace(pts[-1], decode_conc_p50=20.0, decode_conc_max=24.0)
    assert not gates.saturation_gate(over, 16).passed
    never = replace(pts[-1], decode_conc_max=9.0, decode_conc_p50=9.0)
    assert not gates.saturation_gate(never, 16).passed
    # A client-side max above the cap (tokens still in flight through a proxy) is not an engine over the cap.
    assert gates.saturation_gate(replace(pts[-1], decode_conc_max=20.0), 16).passed
    assert not gates.saturation_gate(replace(pts[2], decode_conc_p50=6.0), 16).passed   # c4 cannot run 6
    assert gates.latency_knee(pts, 5.0) == 16            # "c16 is the latency knee: TTFT p99 there is 7.5 s"
    assert baseline_knee(Baseline.load(BASELINE), 5.0) == 16
    assert gates.knee_gate(pts, 5.0, not_before=16).passed
    assert not gates.knee_gate(pts, 1.0, not_before=16).passed   # a knee at c4 comes too early


# ------------------------------------------------------------------------------------------------ methodology
def test_ignore_eos_found_and_explained(tmp_path: Path) -> None:
    recipe = ("aiperf profile --input-file $TRACE_FILE --custom-dataset-type mooncake_trace "
              "--extra-inputs ignore_eos:true --concurrency $CONCURRENCY\n")
    yaml_cfg = "# ignore_eos: true would be wrong here\nendpoint:\n  extra:\n    ignore_eos: true\n"
    body = '{"model": "ml4", "ignore_eos": true}'
    assert len(ignore_eos_uses(recipe)) == 1
    assert [u.line for u in ignore_eos_uses(yaml_cfg)] == [4]
    assert len(ignore_eos_uses(body)) == 1
    assert ignore_eos_uses("--extra-inputs 'min_tokens:4096'  # not ignore_eos: true") == []
    f = tmp_path / "perf.yaml"
    f.write_text(recipe)
    text = explain(ignore_eos_in_files([f]))
    assert "perf.yaml:1" in text and "ParserTooComplex" in text and "min_tokens" in text
    assert "[2, 34]" in WHY_NOT_IGNORE_EOS


def test_shipped_manifests_never_use_ignore_eos() -> None:
    for name in ("rtxpro6000-tp8", "gb300-agg", "gb300-disagg", "vr200-agg", "vr200-disagg"):
        t = load_target(name)
        assert ignore_eos_in_files([t.resolve(m) for m in t.manifests]) == []


# ------------------------------------------------------------------------------------------------ runner
def test_argv_has_the_seed_flags_and_no_secret(tmp_path: Path) -> None:
    spec = AiperfSpec(model="ml4", url="http://127.0.0.1:9/v1", concurrency=16, isl=512, osl=4096, duration_s=300,
                      grace_s=600, min_tokens=4096, server_metrics_url="http://127.0.0.1:9/metrics")
    argv = build_argv(spec, tmp_path / "c16", tmp_path / "cfg.yaml", executable=Path("/x/aiperf"))
    line = " ".join(argv)
    for flag in ("--endpoint-type chat", "--streaming", "--tokenizer builtin", "--use-server-token-count",
                 "--extra-inputs min_tokens:4096", "--prompt-input-tokens-mean 512",
                 "--prompt-output-tokens-mean 4096", "--concurrency 16", "--benchmark-duration 300",
                 "--benchmark-grace-period 600", "--ui none", "--no-gpu-telemetry",
                 "--server-metrics http://127.0.0.1:9/metrics", "--request-rate 1000 --arrival-pattern constant",
                 f"--output-artifact-dir {tmp_path / 'c16'}"):
        assert flag in line, flag
    assert "--api-key" not in line
    cfg = config_yaml(spec)
    assert "${" + API_KEY_ENV + "}" in cfg
    env = child_env("sk-secret", base={"OPENAI_API_KEY": "ambient", "PATH": "/bin"})
    assert env[API_KEY_ENV] == "sk-secret" and "OPENAI_API_KEY" not in env
    assert env["HF_HUB_OFFLINE"] == "1" and env["TIKTOKEN_CACHE_DIR"]
    assert "sk-secret" not in repr(spec)


def test_spec_refuses_ignore_eos_with_min_tokens() -> None:
    with pytest.raises(ValueError, match="ignore_eos"):
        AiperfSpec(model="m", url="http://h/v1", concurrency=1, duration_s=1, min_tokens=8,
                   extra_inputs={"ignore_eos": True})
    with pytest.raises(ValueError):
        AiperfSpec(model="m", url="http://h/v1", concurrency=1, duration_s=None)


def test_grace_covers_the_expected_p99_latency() -> None:
    t = load_target("rtxpro6000-tp8")
    b = Baseline.load(BASELINE)
    full = settings_from_target(t)
    # OSL 4096 at the slowest 32.2 tok/s/user, queued 4 deep at c64 behind max_num_seqs 16.
    assert expected_p99_latency_s(4096, 32.2, 5.0, 64, 16) == pytest.approx(4 * (5 + 4096 / 32.2))
    assert grace_for(full, t, 64, b) >= expected_p99_latency_s(4096, 32.2, 5.0, 64, 16)
    assert grace_for(full, t, 1, b) >= 4096 / 32.2
    short = settings_from_target(t, short=True)
    assert short.concurrencies == (1, 4, 16, 32) and short.osl < 1000
    assert grace_for(short, t, 32, b) >= 30


def test_phase_state_parses_aiperf_console() -> None:
    st = PhaseState()
    st.feed("07:26:24.624 NOTICE   Phase profiling (profiling) started | phase_index=0", 1.0)
    st.feed("NOTICE   Phase profiling (profiling) sending complete | sent=22, completed=20, in_flight=2 | x", 2.0)
    assert (st.phase, st.sent, st.completed) == ("profiling", 22, 20)
    st.feed("NOTICE   Phase profiling (profiling) complete | completed=22, cancelled=3, errors=1 | sessions", 3.0)
    assert (st.completed, st.cancelled, st.errors) == (22, 3, 1)


# ------------------------------------------------------------------------------------------------ trace
def test_trace_is_generated_deterministically() -> None:
    out = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "make_trace.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_trace_blocks_are_consistent() -> None:
    rows = [json.loads(line) for line in TRACE.read_text().splitlines()]
    assert rows[0]["timestamp"] == 0
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    sizes: dict[int, set[int]] = {}
    uses = Counter()
    for r in rows:
        ids = r["hash_ids"]
        assert len(ids) == -(-r["input_length"] // 512)
        for i, h in enumerate(ids):
            size = 512 if i < len(ids) - 1 else r["input_length"] - 512 * (len(ids) - 1)
            sizes.setdefault(h, set()).add(size)
            uses[h] += 1
    assert all(len(s) == 1 for s in sizes.values()), "a hash id materialised at two sizes"
    assert all(sizes[h] == {512} for h, n in uses.items() if n > 1), "a reused id is not a full block"
    assert sum(1 for n in uses.values() if n > 1) > 10, "no prefix reuse between turns"


def test_short_trace(tmp_path: Path) -> None:
    n = short_trace(TRACE, tmp_path / "t.jsonl", rows=5, time_scale=0.1, max_output=64)
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    full = [json.loads(line) for line in TRACE.read_text().splitlines()][:5]
    assert n == 5 and [r["hash_ids"] for r in rows] == [r["hash_ids"] for r in full]
    assert all(r["output_length"] <= 64 for r in rows)
    assert [r["timestamp"] for r in rows] == [int(r["timestamp"] * 0.1) for r in full]


# ------------------------------------------------------------------------------------------------ outputs
def test_roofline_is_an_estimate_below_the_bound() -> None:
    r = roofline(load_target("rtxpro6000-tp8"), 90.1, 1)
    assert "ESTIMATE" in r.label
    assert r.bytes_per_step == pytest.approx(52e9 * 4.5 / 8)
    assert r.steps_per_s_bound == pytest.approx(8 * 1.792e12 / (52e9 * 4.5 / 8))
    assert 0 < r.pct_of_bound < 1 and "of the bound" in r.describe()
    assert roofline(load_target("gb300-agg")).active_params == 54e9


def test_plots_and_summary(tmp_path: Path) -> None:
    pts = seed_points()
    base = Baseline.load(BASELINE)
    paths = write_plots(pts, tmp_path, "seed", base, {"isl": 512, "osl": 4096, "duration_s": 300})
    assert [p.name for p in paths] == ["throughput.png", "ttft.png", "itl.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    update_summary(tmp_path, "t", True, "sweep", {"passed": True})
    update_summary(tmp_path, "t", True, "trace", {"passed": False})
    data = json.loads((tmp_path / "perf-summary.json").read_text())
    assert data["sweep"] == {"passed": True} and data["trace"] == {"passed": False}
    assert data["schema"] == "ml4-perf-summary/1"


def _legends(folder: Path) -> dict[str, list[dict[str, Any]]]:
    return json.loads((folder / "plots.json").read_text())["plots"]


def test_plots_draw_the_baseline_only_under_its_conditions(tmp_path: Path) -> None:
    """Under the baseline's own conditions every baseline figure is drawn, its legend naming
    them; under a short run's only what the gate compares (per-token rates), and TTFT says why it has none."""
    base = Baseline.load(BASELINE)
    write_plots(seed_points(), tmp_path / "same", "seed", base, {"isl": 512, "osl": 4096, "duration_s": 300})
    same = _legends(tmp_path / "same")
    assert "TTFT p50 (baseline:\nISL 512, OSL 4096, 300 s per point)" in same["ttft.png"][0]["legend"]
    assert not any(p["notes"] for panels in same.values() for p in panels)
    write_plots(seed_points(), tmp_path / "short", "short", base, {"isl": 128, "osl": 256, "duration_s": 20})
    short = _legends(tmp_path / "short")
    labels = [lab for panels in short.values() for p in panels for lab in p["legend"]]
    drawn = [lab for lab in labels if "baseline" in lab]
    assert drawn and all("(baseline:\nISL 512, OSL 4096, 300 s per point; per-token rate, compared)" in lab
                         for lab in drawn)
    assert {lab.split(" (baseline")[0] for lab in drawn} == {"per-user tok/s", "ITL p50", "ITL p99"}
    [ttft] = short["ttft.png"]
    assert not [lab for lab in ttft["legend"] if "baseline" in lab]
    assert ttft["notes"] == [("baseline (ISL 512, OSL 4096, 300 s per point) not drawn: measured under other "
                              "conditions than this run (ISL 128, OSL 256, 20 s per point); the gate compares only "
                              "itl_p50_ms, itl_p99_ms, tok_s_user")]


def test_a_simulator_perf_baseline_is_refused_on_a_live_run(tmp_path: Path) -> None:
    """A perf baseline made by the simulator (``--perf-save`` under ``--sim``) judges simulator
    runs only; seed 000's own table (provenance ``seed``) judges live runs; one without provenance is refused."""
    from pytest_ml4.plugin.perf import load_perf_baseline

    data = json.loads(BASELINE.read_text())
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({**data, "provenance": {"kind": "simulator", "command": "pytest --sim --perf-save"}}))
    with pytest.raises(pytest.UsageError, match=r"^--perf-baseline: baseline .*sim.json was made by the simulator "
                                                r"and cannot judge a live deployment: record one on this deployment$"):
        load_perf_baseline(sim, live=True)
    assert load_perf_baseline(sim, live=False).points == load_perf_baseline(BASELINE, live=True).points
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({k: v for k, v in data.items() if k != "provenance"}))
    with pytest.raises(pytest.UsageError, match="states no provenance"):
        load_perf_baseline(bare, live=False)


def test_a_targets_simulator_baseline_judges_simulator_runs_only(tmp_path: Path) -> None:
    """The target's own perf.baseline made by the simulator: it judges a simulator run; on a live run there is no
    baseline, and the reason names the file and the command that records one (the check says not judged)."""
    from pytest_ml4.plugin.perf import choose_perf_baseline
    from pytest_ml4.target.model import load_target

    data = json.loads(BASELINE.read_text())
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({**data, "provenance": {"kind": "simulator", "command": "pytest --sim --perf-save"}}))
    target = load_target("rtxpro6000-tp8", overrides={"perf": {"baseline": str(sim)}})
    assert choose_perf_baseline(None, target, live=False).baseline is not None
    live = choose_perf_baseline(None, target, live=True)
    assert live.baseline is None
    assert live.missing.startswith(f"the target's perf.baseline {sim} was made by the simulator, not recorded on this "
                                   f"deployment; record one with: pytest --target rtxpro6000-tp8 -m perf --ml4-record-baselines")
    none = choose_perf_baseline(None, load_target("gb300-agg", overrides={"perf": {"baseline": None}}), live=True)
    assert none.baseline is None and none.missing.startswith("no stored baseline for this target (perf.baseline)")
    with pytest.raises(pytest.UsageError, match="made by the simulator and cannot judge a live deployment"):
        choose_perf_baseline(str(sim), target, live=True)


def test_progress_lines() -> None:
    lines: list[str] = []
    prog = SweepProgress(lines.append, [1, 4, 16], point_estimate_s=60, interval_s=0)
    prog.point_started(4)
    st = PhaseState(phase="profiling", completed=7)
    prog.tick(30.0, st)
    prog.point_done(4, "ok")
    assert "point 2/3: c4 started" in lines[0]
    assert "c4 profiling" in lines[1] and "~01:30 left" in lines[1] and "7 request(s) completed" in lines[1]
    assert lines[2].endswith("c4 done: ok")
