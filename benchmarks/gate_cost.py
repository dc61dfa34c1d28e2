"""What does the gate spend?  Per suite: the requests, prompt and output tokens and the wall time it costs the
endpoint, read from the simulator's own counters.

    python benchmarks/gate_cost.py [--target rtxpro6000-tp8] [--suites smoke,tools,...] [--json PATH]
    python benchmarks/gate_cost.py --suites perf,perf-no-probes    # what the probes beside the load add
    python benchmarks/gate_cost.py --target gb300-agg --suites perf,perf-no-probes --repeat 3   # min/median of 3 pairs

Each suite runs on its own (``pytest suites/<its file> --target T --sim``, perf with ``--perf-short``, the
CI profile: a real gate run with the full sweep costs more) with this module loaded as a pytest plugin
(``-p gate_cost``). The plugin polls every engine's ``/metrics`` while the session runs, the same series a real
vLLM exposes: ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total``
(every finished_reason), and ``process_start_time_seconds`` to notice a restarted engine (its counters start
again from 0: the restart suite's engines are summed incarnation by incarnation, like Prometheus' ``increase()``).
The ``requests`` column counts every ``POST /v1/chat/completions`` line of the engine's access log (uvicorn's, as
real vLLM writes it; rejected requests included), ``served`` the finished requests of the counters. An engine
that is stopped drains its in-flight streams after it has stopped listening, so what those streams finish is no
longer scrapeable: for a suite whose engines restarted (``*``, the restart suite) the token and served figures are
lower bounds. The figures are what the engine saw: a LiteLLM proxy's retries count once per attempt that reached
it.

Wall time is the pytest run's duration without the simulator's and proxy's start-up (the sum of the JUnit test
times: setup, call and teardown of each test). The perf suite's open-loop phases draw their Poisson arrivals afresh
each run, so two runs of it differ by their schedules (seconds per phase) whatever else they do: the probes' line
also gives the wall time on the same arrival schedule (each run's wall less the summed first-to-last-request spans
of its aiperf runs, read from their per-request records).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from flake import (  # benchmarks/ is on sys.path
    PYTHON,
    REPO,
    choices,
    junit_cases,
    require_venv,
)

#: Suite marker -> its file under suites/ (the README's suite table).
SUITE_FILES = {"smoke": "test_smoke.py", "tools": "test_tools.py", "reasoning": "test_reasoning.py",
               "osl": "test_osl.py", "kv": "test_kv_cache.py", "restart": "test_restart.py", "perf": "test_perf.py",
               "preflight": "test_preflight.py", "accuracy": "test_accuracy.py",
               # the perf suite's open-loop gates on their own: what each adds to the perf suite
               "goodput": "test_perf.py", "capacity": "test_perf.py", "sessions": "test_perf.py",
               # the perf suite without the functional probes beside its load: what the probes add
               "perf-no-probes": "test_perf.py"}
SUITES = tuple(SUITE_FILES)
#: Extra pytest arguments per suite (the perf suite's short CI profile, the main job's BFCL sample size).
SUITE_ARGS: dict[str, list[str]] = {
    "perf": ["--perf-short"], "accuracy": ["--accuracy-size", "50"],
    "goodput": ["--perf-short", "-k", "goodput_at_production_rate and chat"],
    "capacity": ["--perf-short", "-k", "capacity_at_least_declared"],
    "sessions": ["--perf-short", "-k", "goodput_at_production_rate and sessions or sessions_reuse"],
    "perf-no-probes": ["--perf-short", "--perf-probe-share", "0"]}
COUNTERS = {"prompt_tokens": "vllm:prompt_tokens_total", "output_tokens": "vllm:generation_tokens_total",
            "served": "vllm:request_success_total"}
OUT_ENV = "ML4_GATE_COST_OUT"
POLL_S = 0.25


# ----------------------------------------------------------------------------------------------- metering (core)
@dataclass
class EngineMeter:
    """Counter increases of one engine URL across its incarnations (reset-aware)."""

    url: str
    start_time: float | None = None
    last: dict[str, float] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0.0))
    incarnations: int = 0

    def sample(self) -> None:
        from pytest_ml4.evidence.metrics import scrape

        try:
            snap = scrape(self.url, timeout=2.0)
        except Exception:  # noqa: BLE001 - an engine that is down (restarting) has nothing to add now
            return
        started = snap.value("process_start_time_seconds")
        now = {k: snap.sum(name) for k, name in COUNTERS.items()}
        if started != self.start_time:
            # A new engine process: its counters started from 0.
            self.start_time, self.last = started, dict.fromkeys(COUNTERS, 0.0)
            self.incarnations += 1
        for k, v in now.items():
            self.total[k] += max(0.0, v - self.last.get(k, 0.0))
        self.last = now


class Poller:
    """Samples the meters every ``POLL_S`` until stopped (so an engine's last counts before a restart are seen)."""

    def __init__(self, meters: list[EngineMeter]) -> None:
        self.meters = meters
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            for m in self.meters:
                m.sample()

    def start(self) -> None:
        for m in self.meters:
            m.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for m in self.meters:
            m.sample()


def engine_metrics_urls(sim: Any) -> list[str]:
    """The vLLM engines' ``/metrics`` of a simulator (a SimServer, or a Dynamo deployment's workers)."""
    workers = getattr(sim, "workers", None)
    if workers:
        return [f"{w.url.rstrip('/')}/metrics" for w in workers if getattr(w, "url", None)]
    return [f"{sim.url.rstrip('/')}/metrics"]


def access_log_posts(path: Path | None) -> int:
    """Chat requests in an engine's access log (uvicorn's ``"POST /v1/chat/completions HTTP/1.1" <status>``)."""
    if path is None or not path.exists():
        return 0
    return sum(1 for line in path.read_text(errors="replace").splitlines()
               if '"POST /v1/chat/completions HTTP/1.1"' in line)


# ----------------------------------------------------------------------------------------------- pytest plugin
_POLLER: Poller | None = None


@pytest.hookimpl(trylast=True)  # after the ml4 plugin started the simulator
def pytest_sessionstart(session: pytest.Session) -> None:
    global _POLLER
    from pytest_ml4.plugin.state import get_state

    state = get_state(session.config)
    if state.deployment is not None:
        _POLLER = Poller([EngineMeter(u) for u in engine_metrics_urls(state.deployment.engine)])
        _POLLER.start()



@pytest.hookimpl(tryfirst=True)  # before the ml4 plugin stops the simulator
def pytest_unconfigure(config: pytest.Config) -> None:
    from pytest_ml4.plugin.state import STATE_KEY

    state = config.stash.get(STATE_KEY, None)
    out = os.environ.get(OUT_ENV)
    if _POLLER is None or not out:
        return
    _POLLER.stop()
    totals = {k: sum(m.total[k] for m in _POLLER.meters) for k in COUNTERS}
    log = state.deployment.describe().log_file if state is not None and state.deployment is not None else None
    totals["requests"] = access_log_posts(Path(log) if log else None)
    totals["incarnations"] = sum(m.incarnations for m in _POLLER.meters)
    Path(out).write_text(json.dumps(totals))



# ----------------------------------------------------------------------------------------------- CLI
@dataclass
class SuiteCost:
    suite: str
    tests: int
    failed: int
    wall_s: float
    requests: int = 0       # chat POSTs in the engine's access log
    served: float = 0.0     # finished requests of vllm:request_success_total
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    incarnations: int = 0
    #: Seconds of the load's own arrival schedules (first to last request issued, summed over aiperf's runs): drawn
    #: afresh each run (Poisson arrivals, no fixed seed), so two runs of one suite differ by it whatever the probes do.
    schedule_s: float = 0.0


def schedule_seconds(reports: Path) -> float:
    """The summed arrival spans of every aiperf run under ``reports`` (``profile_export.jsonl``, profiling records:
    first to last ``credit_issued_ns``); the trace replay's per-phase copies are left out."""
    total = 0.0
    for path in reports.rglob("profile_export.jsonl"):
        if "phases" in path.parts:
            continue
        issued = []
        for line in path.read_text().splitlines():
            meta = json.loads(line).get("metadata", {}) if line.strip() else {}
            if meta.get("benchmark_phase") == "profiling" and meta.get("credit_issued_ns"):
                issued.append(int(meta["credit_issued_ns"]))
        if len(issued) > 1:
            total += (max(issued) - min(issued)) / 1e9
    return total


def run_suite(suite: str, target: str, work: Path, timeout: float) -> SuiteCost:
    junit, out = work / f"{suite}.xml", work / f"{suite}.json"
    argv = [str(PYTHON), "-m", "pytest", f"suites/{SUITE_FILES[suite]}", "--target", target, "-q", "-p", "no:randomly",
            "-p", "gate_cost", "--ml4-reports", str(work / f"reports-{suite}"), "--junitxml", str(junit),
            *([] if suite == "preflight" else ["--sim"]), *SUITE_ARGS.get(suite, [])]
    env = dict(os.environ, **{OUT_ENV: str(out)})
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent), env.get("PYTHONPATH", "")])
    subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if not junit.exists():
        raise SystemExit(f"gate_cost: suite {suite} produced no results ({' '.join(argv)})")
    tests, failed, wall = junit_cases(junit)
    if tests == 0:
        raise SystemExit(f"gate_cost: suite {suite} ran no test ({' '.join(argv)})")
    cost = SuiteCost(suite, tests, len(failed), wall, schedule_s=schedule_seconds(work / f"reports-{suite}"))
    if out.exists():
        for k, v in json.loads(out.read_text()).items():
            setattr(cost, k, v)
    return cost


def row(c: SuiteCost) -> str:
    mark = "*" if c.incarnations > 1 else " "
    return (f"{c.suite:10} {c.tests:5d} {c.failed:6d} {c.requests:8d} {c.served:7.0f} {c.prompt_tokens:10.0f}{mark} "
            f"{c.output_tokens:10.0f}{mark} {c.wall_s:7.1f}")


def _pct(a: float, b: float) -> float | None:
    return 100 * (a - b) / b if b else None


def _fmt(pct: float | None) -> str:
    return "n/a" if pct is None else f"{pct:+.1f} %"


def probe_overhead(with_probes: SuiteCost, without: SuiteCost) -> tuple[float | None, float | None, float | None]:
    """The probes' added requests, wall time, and wall time beside the load's schedules (the wall less the arrival
    spans each run drew), in % of the perf suite without them. Requests are the access log's, else (Dynamo workers
    write none) the engines' served counters."""
    if with_probes.requests and without.requests:
        requests = _pct(with_probes.requests, without.requests)
    else:
        requests = _pct(with_probes.served, without.served)
    same_schedule = _pct(with_probes.wall_s - with_probes.schedule_s + without.schedule_s, without.wall_s)
    return requests, _pct(with_probes.wall_s, without.wall_s), same_schedule


def probes_cost(with_probes: SuiteCost, without: SuiteCost) -> str:
    """What the functional probes beside the load add to the perf suite (the issue's budget: at most 10 %)."""
    requests, wall, same_schedule = probe_overhead(with_probes, without)
    return (f"probes beside the load: {_fmt(requests)} requests, {with_probes.wall_s - without.wall_s:+.1f} s wall "
            f"({_fmt(wall)}; {_fmt(same_schedule)} on the same arrival schedule: load schedules "
            f"{with_probes.schedule_s:.1f} s vs {without.schedule_s:.1f} s) over the perf suite")


def probes_cost_over_pairs(pairs: list[tuple[SuiteCost, SuiteCost]]) -> str:
    """Min and median of the probes' overhead over several pairs of runs (a shared machine's noise is one-sided: it
    only lengthens a run, so the minimum is the truer figure and the median the typical one)."""
    import statistics

    lines = []
    for name, i in (("requests", 0), ("wall", 1), ("wall on the same arrival schedule", 2)):
        values = [v for v in (probe_overhead(a, b)[i] for a, b in pairs) if v is not None]
        if values:
            lines.append(f"probes beside the load over {len(values)} pairs: {name} min {_fmt(min(values))}, median "
                         f"{_fmt(statistics.median(values))} ({', '.join(_fmt(v) for v in values)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="rtxpro6000-tp8")
    p.add_argument("--suites", default=",".join(SUITES))
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per suite")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--repeat", type=int, default=1,
                   help="run the suites this many times, in turn (pairs of perf,perf-no-probes: min and median); the "
                        "total and --json are the last round's")
    p.add_argument("--keep", type=Path, default=None,
                   help="keep each round's reports in this folder (round-N/reports-SUITE: benchmarks/phase_timing.py "
                        "reads them) instead of a temporary one")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat: expected a count >= 1, got {args.repeat}")
    suites = choices(p, "--suites", args.suites, SUITES)
    require_venv(p)
    costs: list[SuiteCost] = []
    print(f"{'suite':10} {'tests':>5} {'failed':>6} {'requests':>8} {'served':>7} {'prompt tok':>11} {'output tok':>11} "
          f"{'wall s':>7}")
    pairs: list[tuple[SuiteCost, SuiteCost]] = []
    for round_no in range(1, args.repeat + 1):
        costs = []
        with tempfile.TemporaryDirectory(prefix="ml4-gate-cost-") as tmp:
            work = Path(tmp) if args.keep is None else args.keep / f"round-{round_no}"
            work.mkdir(parents=True, exist_ok=True)
            for suite in suites:
                c = run_suite(suite, args.target, work, args.timeout)
                costs.append(c)
                print(row(c), flush=True)
        by_name = {c.suite: c for c in costs}
        if "perf" in by_name and "perf-no-probes" in by_name:
            pairs.append((by_name["perf"], by_name["perf-no-probes"]))
            print(probes_cost(*pairs[-1]), flush=True)
    total = SuiteCost("total", sum(c.tests for c in costs), sum(c.failed for c in costs),
                      sum(c.wall_s for c in costs), sum(c.requests for c in costs), sum(c.served for c in costs),
                      sum(c.prompt_tokens for c in costs), sum(c.output_tokens for c in costs))
    total.incarnations = max((c.incarnations for c in costs), default=0)
    print(row(total))
    if len(pairs) > 1:
        print(probes_cost_over_pairs(pairs))
    if any(c.incarnations > 1 for c in costs):
        print("* engines restarted during the suite: served and token figures are lower bounds (see --help)")
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in [*costs, total]], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
