"""Performance gates with aiperf: a fixed-OSL concurrency sweep per target, and an agentic trace replay on Dynamo.

The sweep is seed 000's loop (streaming chat, builtin tokenizer, server token counts, ``min_tokens`` = OSL), its
concurrencies, ISL/OSL and duration from the target's ``perf:`` section, shortened with ``--perf-short`` or the
``--perf-*`` options for CI. Each test below checks one gate, so a failure names what regressed:

* every point is a usable aiperf run (complete, not cancelled, no request dropped after the grace period);
* zero errors (seed 000: "0 errors, 0 cancels");
* the Dynamo gate: decode tok/s/user P50 > 50 and TTFT P50 < 2 s (seed 002) at every point;
* the stored baseline within tolerance (RTX PRO: seed 000's table, ``pytest_ml4/data/baselines/``), ``--perf-compare-fail``;
* decode concurrency saturating at ``max_num_seqs`` (and running together below it); the latency knee (first
  TTFT p99 over the target's limit) not before ``gates.knee_not_before`` or the baseline's knee;
* plots and ``perf-summary.json`` (with the roofline ESTIMATE, reported, not gated) in the run folder;
* the answers stay correct under load: functional probes sent beside every load phase (tool calls, reasoning,
  fixed length; ``pytest_ml4.perf.probes``) pass the single-request suites' verdicts, one check per phase kind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_ml4.checks.codes import fail, fails_with, require
from pytest_ml4.checks.load import assert_answers_correct_under_load
from pytest_ml4.checks.perf import (
    assert_gate_passed,
    assert_gates_pass,
    assert_no_request_errors,
    assert_trace_replayed,
)
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.perf.capacity import capacity_gate
from pytest_ml4.perf.evaluate import knee_bound
from pytest_ml4.perf.gates import knee_unseen
from pytest_ml4.perf.probes import load_answers, phase_findings
from pytest_ml4.perf.summary import SCHEMA, SUMMARY_NAME, update_summary
from pytest_ml4.perf.trace import TraceMissing, replay_agentic_trace
from pytest_ml4.perf.workloads import (
    PREFIX_COUNTERS,
    CapacityRunFailed,
    goodput_verdict,
    keeps_sessions_together,
    prefix_reuse_floor,
)
from pytest_ml4.target.baselines import describe_conditions
from pytest_ml4.target.model import Target

pytestmark = [pytest.mark.perf, pytest.mark.exclusive]  # no other traffic during a measurement

def _attach(name: str, body: str | bytes, kind: str = "TEXT", extension: str | None = None) -> None:
    try:
        import allure
    except ImportError:
        return
    allure.attach(body, name=name, attachment_type=getattr(allure.attachment_type, kind), extension=extension)


@fails_with("perf.point_unusable", "a sweep point is not a usable aiperf run")
def test_every_point_is_a_usable_aiperf_run(ml4_perf_sweep: Any) -> None:
    bad = [p for p in ml4_perf_sweep.points if not p.ok]
    for p in bad:
        _attach(f"aiperf log c{p.concurrency}", p.log_tail)
    require(not bad, "perf.point_unusable",
            lambda: "\n".join(f"c{p.concurrency}: {'; '.join(p.problems)} ({p.out_dir})" for p in bad))


def test_zero_errors(ml4_perf_sweep: Any) -> None:
    assert_no_request_errors(ml4_perf_sweep.verdict.by_gate("errors"))


@fails_with("perf.point_no_figures", "a sweep point has no figures")
@fails_with("perf.osl_not_fixed", "a sweep point's output_sequence_length is not min = max = OSL, std 0")
@fails_with("perf.extra_inputs", "a sweep point was not asked with min_tokens = OSL, or asked with ignore_eos")
def test_fixed_output_length_in_every_point(ml4_perf_sweep: Any) -> None:
    osl = ml4_perf_sweep.settings.osl
    for p in ml4_perf_sweep.points:
        f = p.point
        if f is None:
            fail("perf.point_no_figures", f"c{p.concurrency}: no figures")
        if (f.osl_min, f.osl_max, f.osl_std) != (osl, osl, 0.0):
            fail("perf.osl_not_fixed",
                 f"c{p.concurrency}: output_sequence_length min {f.osl_min} max {f.osl_max} std {f.osl_std}, expected {osl}")
        extra = p.export().extra_inputs
        if not (extra.get("min_tokens") == osl and "ignore_eos" not in extra):
            fail("perf.extra_inputs", f"c{p.concurrency}: extra inputs {extra}")


@pytest.mark.dynamo
def test_dynamo_gate(ml4_perf_sweep: Any, ml4_target: Target) -> None:
    results = ml4_perf_sweep.verdict.by_gate("decode_tok_s_user_p50") + ml4_perf_sweep.verdict.by_gate("ttft_p50")
    gates = ml4_target.gates
    defined = gates.decode_tok_s_user_p50_min is not None or gates.ttft_p50_s_max is not None
    # Gates judge points with figures: a defined gate with no result means the sweep produced none.
    none = ("no point produced figures" if defined else
            f"target {ml4_target.name} defines no Dynamo gate (gates.decode_tok_s_user_p50_min, ttft_p50_s_max)")
    assert_gates_pass(results, none=none, none_code="perf.no_figures" if defined else "perf.dynamo_gate_undefined")


@fails_with("perf.baseline_incomparable", "no figure of the sweep is comparable with the baseline")
def test_baseline(ml4_perf_sweep: Any) -> None:
    if ml4_perf_sweep.recorded is not None:   # --ml4-record-baselines: passes as recorded, the next run compares
        print(f"perf sweep recorded as this deployment's baseline: {ml4_perf_sweep.recorded}")
        return
    if ml4_perf_sweep.baseline is None:
        not_judged(ml4_perf_sweep.baseline_missing)
    devs = ml4_perf_sweep.verdict.deviations
    require(devs, "perf.baseline_incomparable",
            "no figure of this sweep is comparable with the baseline (no common concurrency)")
    base, run = ml4_perf_sweep.baseline.conditions, ml4_perf_sweep.settings.conditions()
    compared = "every figure" if ml4_perf_sweep.verdict.full_run else "the per-token rates only (other run length)"
    _attach("baseline comparison", f"this run: {describe_conditions(run)}\nbaseline {ml4_perf_sweep.baseline.name}: "
            f"{describe_conditions(base)}\ncompared: {compared}\n" + "\n".join(d.describe() for d in devs))
    assert_gates_pass(ml4_perf_sweep.verdict.by_gate("baseline"))


def test_decode_concurrency_saturates_at_max_num_seqs(ml4_perf_sweep: Any) -> None:
    """Past ``max_num_seqs`` the decode concurrency p50 is the cap; below it at least half the concurrency runs
    together. The lower bound is what makes the gate bite where the sweep never passes the cap (Dynamo: 64 >
    every sweep concurrency): an engine capped lower than the target states fails it. The figure
    is the engine's own ``vllm:num_requests_running`` when aiperf scraped one engine's /metrics (the client-side
    decode concurrency also counts prefill and proxy lag, which grow with the client's load), else the
    client-side ``effective_decode_concurrency``; the message names which (``pytest_ml4.perf.gates``)."""
    assert_gates_pass(ml4_perf_sweep.verdict.by_gate("saturation"), none="no point produced figures")


def test_latency_knee(ml4_perf_sweep: Any, ml4_target: Target) -> None:
    """The knee (first TTFT p99 over ``gates.ttft_p99_knee_s``) comes no earlier than the target's stated bound
    (``gates.knee_not_before``) or the stored baseline's knee; with neither it fails: a knee judged against
    nothing used to pass on every Dynamo target. A sweep with no point below the bound cannot
    see a knee before it: not judged (a c32-only sweep against a c32 bound passed every time)."""
    unseen = knee_unseen(ml4_perf_sweep.settings.concurrencies,
                         knee_bound(ml4_target, ml4_perf_sweep.baseline, ml4_target.gates.ttft_p99_knee_s))
    if unseen:
        not_judged(unseen)
    [knee] = ml4_perf_sweep.verdict.by_gate("knee")
    print(knee)
    assert_gate_passed(knee)


@fails_with("perf.plot_missing", "a perf plot is missing or empty")
@fails_with("perf.summary_written", "perf-summary.json does not record the sweep as run and judged")
def test_plots_and_summary_written(ml4_perf_sweep: Any, ml4_run_dir: Path) -> None:
    for png in ml4_perf_sweep.outputs.plots:
        if not (png.is_file() and png.stat().st_size > 1000):
            fail("perf.plot_missing", f"plot missing or empty: {png}")
        _attach(png.name, png.read_bytes(), "PNG")
    summary = ml4_run_dir / SUMMARY_NAME
    data = json.loads(summary.read_text())
    require(data["schema"] == SCHEMA, "perf.summary_written", lambda: f"{summary}: schema {data['schema']!r}")
    sweep = data["sweep"]
    points = [p["concurrency"] for p in sweep["points"]]
    require(points == list(ml4_perf_sweep.settings.concurrencies), "perf.summary_written",
            lambda: f"{summary}: points {points}, the sweep ran {ml4_perf_sweep.settings.concurrencies}")
    require(sweep["passed"] == ml4_perf_sweep.verdict.passed, "perf.summary_written",
            lambda: f"{summary}: passed {sweep['passed']}, the verdict says {ml4_perf_sweep.verdict.passed}")
    _attach(SUMMARY_NAME, summary.read_text(), "JSON")


# ------------------------------------------------------------------------------------- agentic trace replay
@pytest.mark.dynamo
@fails_with("perf.trace_missing", "the agentic trace to replay is missing")
def test_agentic_trace_replay(ml4_target: Target, ml4_perf_client: Any, ml4_run_dir: Path, ml4_perf_settings: Any,
                              ml4_perf_progress: Any, ml4_endpoint: Endpoint) -> None:
    """The agentic trace replays on its schedule after a warmup, every row answered, within seed 002's gate"""
    try:
        replay = replay_agentic_trace(ml4_target, ml4_perf_client, ml4_run_dir, ml4_perf_settings,
                                      ml4_perf_progress, bool(ml4_endpoint.simulated))
    except TraceMissing as err:
        fail("perf.trace_missing", str(err))
    if not replay.point.ok:
        _attach("aiperf log (trace)", replay.point.log_tail)
    assert_trace_replayed(replay)


# ------------------------------------------------------------------------------------ goodput, capacity, sessions
@fails_with("perf.workload_undeclared", "the target declares no perf workload (or capacity) the check needs")
def _workload(target: Any, name: str) -> Any:
    w = target.perf.workloads.get(name)
    if w is None:
        fail("perf.workload_undeclared", f"target {target.name} declares no perf.workloads.{name} (README 'SLOs')")
    return w


@pytest.mark.parametrize("workload", ["chat", "sessions"])
@fails_with("perf.workload_run_unusable", "an open-loop workload's aiperf run is not usable")
def test_goodput_at_production_rate(workload: str, ml4_perf_workloads: Any, ml4_target: Target, ml4_run_dir: Path,
                                    ml4_endpoint: Endpoint) -> None:
    """At the workload's production rate (Poisson arrivals), the share of requests meeting every SLO (TTFT, ITL,
    end-to-end; aiperf's own ``--goodput``) is at least ``perf.goodput_floor``. The plot shows each latency's
    distribution against its SLO line. P50 gates hide the tail; this one does not (fault ``tail_slow``)."""
    _workload(ml4_target, workload)
    run = ml4_perf_workloads.production(workload)
    if not run.ok:
        _attach(f"aiperf log ({workload})", run.log_tail)
    require(run.ok, "perf.workload_run_unusable", lambda: f"{workload}: {'; '.join(run.problems)} ({run.out_dir})")
    verdict = goodput_verdict(ml4_target, run, ml4_run_dir, bool(ml4_endpoint.simulated))
    if verdict.gate is None:
        not_judged(f"goodput of {workload}: {verdict.why}")
    _attach(verdict.plot.name, verdict.plot.read_bytes(), "PNG")
    print(verdict.gate)
    assert_gate_passed(verdict.gate)


@fails_with("perf.capacity_run_failed", "the capacity runs could not be made")
@fails_with("perf.workload_undeclared")
def test_capacity_at_least_declared(ml4_perf_workloads: Any, ml4_target: Target, ml4_run_dir: Path,
                                    ml4_endpoint: Endpoint) -> None:
    """The declared ``capacity_rps`` of the chat workload meets the goodput floor, judged from pooled repeated
    runs with a one-sided 95 % bound (``pytest_ml4.perf.capacity``); a bounded bisection above it reports the
    highest rate that met it. Noise alone gives "inconclusive", reported as not judged, never pass or fail."""
    w = _workload(ml4_target, "chat")
    if w.capacity_rps is None:
        fail("perf.workload_undeclared", f"target {ml4_target.name} declares no perf.workloads.chat.capacity_rps")
    try:
        found = ml4_perf_workloads.capacity("chat")
    except CapacityRunFailed as err:
        fail("perf.capacity_run_failed", str(err))
    update_summary(ml4_run_dir, ml4_target.name, bool(ml4_endpoint.simulated), "capacity_chat", found.as_dict())
    gate = capacity_gate(found, "chat")
    if gate is None:
        not_judged(f"capacity: the goodput at the declared {w.capacity_rps:g} req/s is neither significantly "
                   f"above nor below the floor after its repeats (noise or a rate right at the limit): "
                   f"{found.describe()}")
    print(gate)
    assert_gate_passed(gate)


@fails_with("perf.prefix_reuse",
            "the engines served fewer prompt tokens from their prefix cache than the sessions guarantee")
@fails_with("perf.workload_run_unusable")
def test_sessions_reuse_the_shared_prefix(ml4_perf_workloads: Any, ml4_target: Target) -> None:
    """Multi-turn sessions sharing a system prompt hit the engines' prefix cache, read from the engines' own
    counters (``vllm:prefix_cache_hits_total`` / ``_queries_total``; on Dynamo every prompt-computing worker's:
    a disaggregated deployment's prefill workers). At least the shared system prompt of every request after each
    engine's first must come from cache, and where the deployment keeps a session on one engine (one engine, or
    Dynamo's KV router) every follow-up turn's previous prompt too: reuse across turns is what the router promises.
    Not judged when the counters cannot be read (no worker /metrics known, or the counters absent)."""
    w = _workload(ml4_target, "sessions")
    run = ml4_perf_workloads.production("sessions")
    require(run.ok, "perf.workload_run_unusable", lambda: f"sessions: {'; '.join(run.problems)} ({run.out_dir})")
    if run.engine_counters is None:
        not_judged(f"prefix reuse: the engines' prefix-cache counters could not be read: "
                   f"{run.engine_metrics_problem}")
    queries, hits = (run.engine_counters[k] for k in PREFIX_COUNTERS)
    engines = len(ml4_perf_workloads.engine_metrics_urls)
    floor = prefix_reuse_floor(w, run.records(), run.requests, engines, ml4_target.engine.block_size,
                               keeps_sessions_together(ml4_target, engines))
    share = hits / queries if queries else 0.0
    print(f"prefix cache: {hits:.0f} of {queries:.0f} prompt tokens from cache ({share:.1%}); floor "
          f"{floor.tokens:.0f} (system prompt {floor.system:.0f}, earlier turns {floor.turns:.0f})")
    require(hits >= floor.tokens, "perf.prefix_reuse",
            lambda: f"sessions: the engines served {hits:.0f} prompt tokens from their prefix cache ({share:.1%} of "
                    f"{queries:.0f}), fewer than the {floor.tokens:.0f} guaranteed by {floor.describe(w.system_prompt_tokens)} "
                    f"over {run.requests} requests on {engines} engine(s)")



# ------------------------------------------------------------------------------------ correctness under load
def _phase_folders(phase: str, request: pytest.FixtureRequest, target: Target) -> list[str]:
    """The aiperf folders of the phase kind's runs (running them if no other check has yet)."""
    if phase == "sweep":
        return [p.out_dir for p in request.getfixturevalue("ml4_perf_sweep").points]
    if phase == "trace":
        try:
            replay = replay_agentic_trace(target, request.getfixturevalue("ml4_perf_client"),
                                          request.getfixturevalue("ml4_run_dir"),
                                          request.getfixturevalue("ml4_perf_settings"),
                                          request.getfixturevalue("ml4_perf_progress"),
                                          bool(request.getfixturevalue("ml4_endpoint").simulated))
        except TraceMissing as err:
            pytest.fail(str(err), pytrace=False)
        return [replay.point.out_dir]
    workloads = request.getfixturevalue("ml4_perf_workloads")
    if phase == "capacity":
        _workload(target, "chat")
        try:
            workloads.capacity("chat")
        except (CapacityRunFailed, KeyError) as err:
            pytest.fail(str(err), pytrace=False)
        return [str(p) for p in workloads.capacity_folders("chat")]
    name = phase.removeprefix("goodput-")
    _workload(target, name)
    return [workloads.production(name).out_dir]


@pytest.mark.parametrize("phase", ["sweep", "goodput-chat", "goodput-sessions", "capacity",
                                   pytest.param("trace", marks=pytest.mark.dynamo)])
def test_answers_stay_correct_under_load(phase: str, request: pytest.FixtureRequest, ml4_target: Target,
                                         pytestconfig: pytest.Config) -> None:
    """Beside every run of the phase, the suite's own probes (tool calls under every tool_choice, parallel calls,
    reasoning at each effort, a fixed length with min_tokens; streamed and not) at a small share of its requests:
    every answer passes the single-request suites' verdicts; so do the load's own answers where aiperf's records
    carry it (reasoning reported where the workload reasons, usage adding up). A batching bug breaks answers only on a busy engine,
    which one request at a time never sees. Fails naming the phase, its load, the probe and the first violation,
    with the answer's transcript attached."""
    folders = _phase_folders(phase, request, ml4_target)
    off = ("the probes are off (--perf-probe-share 0)" if request.getfixturevalue("ml4_perf_probes") is None
           else "the runs went to Kubernetes (--perf-kube): no probe runs beside them"
           if pytestconfig.getoption("ml4_perf_kube") is not None else None)
    load = [a for f in folders if (a := load_answers(f"{phase} {Path(f).name}", f)) is not None]
    assert_answers_correct_under_load(phase, phase_findings(folders), folders, off, load)


def test_answers_stay_correct_over_the_soak(request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                                            ml4_target: Target, ml4_run_dir: Path) -> None:
    """``--ml4-soak DURATION`` (nightly): the chat workload at its production rate for DURATION with the probes
    beside it; every answer passes its verdict, and the probes and violations over time are printed and plotted
    (``perf/soak-probes.png``) so a defect that starts late shows when."""
    from pytest_ml4.perf.soak import (
        SOAK_PLOT,
        bucket_width,
        soak_buckets,
        write_soak_plot,
    )
    from pytest_ml4.plugin.perf import soak_duration

    duration = soak_duration(pytestconfig)
    if duration is None:
        pytest.skip("runs only with --ml4-soak DURATION (nightly runs)")
    _workload(ml4_target, "chat")
    run = request.getfixturevalue("ml4_perf_workloads").soak("chat", duration)
    found = phase_findings([run.out_dir])
    if found:
        plot = write_soak_plot(found[0], duration, ml4_run_dir / "perf" / SOAK_PLOT,
                               f"{ml4_target.name}, soak of {duration:g} s at {run.rate:g} req/s")
        _attach(plot.name, plot.read_bytes(), "PNG")
        for bucket in soak_buckets(found[0], duration):
            print(bucket.describe(bucket_width(duration)))
    off = "the probes are off (--perf-probe-share 0)" if request.getfixturevalue("ml4_perf_probes") is None else None
    load = [a for a in [load_answers(f"soak {Path(run.out_dir).name}", run.out_dir)] if a is not None]
    assert_answers_correct_under_load("soak", found, [run.out_dir], off, load)
