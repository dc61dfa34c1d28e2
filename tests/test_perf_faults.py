"""Fault detection: a 2x ITL regression and a 5 % error rate each fail the right perf gate, and only that one.

The simulator is started with the fault (``pytest_ml4_sim.sim.faults``), one aiperf point is run at the target's highest
sweep concurrency (where the Dynamo profile sits just inside its gate), and the same gate code as the perf suite
judges it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.dynamo import DynamoSim
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.perf import gates
from pytest_ml4.perf.baseline import Baseline, compare
from pytest_ml4.perf.figures import PointFigures, figures_from_export
from pytest_ml4.perf.runner import AiperfSpec, failure_log, run_aiperf
from pytest_ml4.target.model import Target, load_target


def run_point(target: Target, faults: tuple[str, ...], tmp: Path, *, concurrency: int, osl: int,
              requests: int) -> PointFigures:
    env = dict(os.environ)
    key = None
    if target.endpoint.requires_api_key and target.endpoint.api_key_env:
        key = env[target.endpoint.api_key_env] = "sk-fault-" + os.urandom(6).hex()
    # The deployment the plugin's --sim starts: a Dynamo frontend with its workers, or a vLLM engine.
    sim_class = DynamoSim if target.is_dynamo else SimServer
    with sim_class(target, faults=faults, log_file=tmp / "engine.log", env=env) as sim:
        spec = AiperfSpec(model=target.serving.served_model_name, url=sim.base_url, concurrency=concurrency,
                          isl=128, osl=osl, duration_s=None, request_count=requests, min_tokens=osl,
                          server_metrics_url=sim.url + "/metrics")
        run = run_aiperf(spec, tmp / "aiperf", api_key=key)
    assert run.ok, run.describe() + "\n" + failure_log(run, [key])
    return figures_from_export(run.require(), concurrency)


def verdicts(fig: PointFigures, target: Target) -> dict[str, bool]:
    return {r.gate: r.passed for r in gates.point_gates(fig, target)}


@pytest.fixture(scope="module")
def gb300() -> Target:
    return load_target("gb300-agg")


def test_double_itl_fails_the_dynamo_decode_gate_only(gb300: Target, tmp_path: Path) -> None:
    c = max(gb300.perf.concurrencies)
    fig = run_point(gb300, ("slow_decode=2",), tmp_path, concurrency=c, osl=128, requests=2 * c)
    assert verdicts(fig, gb300) == {"errors": True, "decode_tok_s_user_p50": False, "ttft_p50": True}, fig


def test_five_percent_errors_fail_the_error_gate_only(tmp_path: Path) -> None:
    # On the engine itself: in front of it, Dynamo's request migration and LiteLLM's retries (open item 2)
    # re-send a failed request, which is what they are for, so the client would not see the 500s.
    rtx = load_target("rtxpro6000-tp8")
    base = Baseline.load(rtx.resolve(str(rtx.perf.baseline)))
    # A deterministic schedule (every 20th request: 5 %), not a random rate that can miss.
    fig = run_point(rtx, ("error_every=20",), tmp_path, concurrency=4, osl=128, requests=40)
    assert fig.errors > 0 and fig.error_rate_pct is not None and fig.error_rate_pct > 0
    assert not gates.error_gate(fig, rtx.gates.request_error_rate_max).passed
    devs = compare([fig], base, full_run=False)
    assert devs and not [d.describe() for d in devs if d.regressed], "the error fault must not move the rates"


def test_double_itl_fails_the_rtx_baseline_on_itl_and_per_user_rate(tmp_path: Path) -> None:
    rtx = load_target("rtxpro6000-tp8")
    base = Baseline.load(rtx.resolve(str(rtx.perf.baseline)))
    fig = run_point(rtx, ("slow_decode=2",), tmp_path, concurrency=4, osl=128, requests=8)
    devs = compare([fig], base, full_run=False)
    regressed = {d.figure for d in devs if d.regressed}
    assert {"itl_p50_ms", "tok_s_user"} <= regressed, [d.describe() for d in devs]
    assert gates.error_gate(fig, rtx.gates.request_error_rate_max).passed
