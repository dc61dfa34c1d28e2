"""Every restart scenario ends within a bound derived from the target, and past it fails naming the phase it was
in; the checks depending on it are then not judged (pytest_ml4/control/budget.py).

A worker that never comes back (fault ``restart_never_registers``) is shown with a small declared start time
(``--ml4-set control.worker_start_s=8``), so the bound is seconds, not the production one."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from checkout import REPO_ROOT
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.checks.restart import assert_restart_finished, assert_scenario_judgeable
from pytest_ml4.checks.verdict import NotJudged
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.client.transport import Deadlines
from pytest_ml4.control import SimController
from pytest_ml4.control.budget import (
    FIRST_ANSWER,
    REGISTER,
    RestartBudget,
    deployment_start_overrides,
)
from pytest_ml4.control.scenario import run_restart_scenario
from pytest_ml4.target.model import load_target

SUITE = REPO_ROOT / "suites" / "test_restart.py"
START_S = 8


def test_the_bound_is_derived_from_the_target() -> None:
    target = load_target("gb300-agg", overrides={"control": {"worker_start_s": 300}})
    d = Deadlines.for_target(target)
    budget = RestartBudget.for_target(target, pods=2, retry_window_s=7.5, probe_max_tokens=256)
    assert budget.restart_s == 600                      # two pods one after another, 300 s each
    assert budget.answer_s == pytest.approx(d.connect_s + d.first_byte_s + 256 * d.slow_itl_s)
    assert budget.total_s == pytest.approx(600 + 7.5 + budget.answer_s)
    assert "2 pod(s) x control.worker_start_s 300 s" in budget.describe()
    assert "proxy retry window 7.5 s" in budget.describe()


def test_embedded_deployments_declare_their_own_start_time() -> None:
    sim = deployment_start_overrides("sim")["control"]["worker_start_s"]
    real = deployment_start_overrides("vllm")["control"]["worker_start_s"]
    assert 0 < sim < real
    with pytest.raises(ValueError, match="deployment-start.yaml: no worker start time for --sim-engine 'tpu'"):
        deployment_start_overrides("tpu")


def test_no_answer_of_the_new_engine_fails_the_first_answer_phase(rtx_api_key: str, tmp_path: Path) -> None:
    """The new engine answers only errors (fault error_after_restart=1): the scenario stops at its bound, shorter
    than the recovery gate, naming the first-answer phase; what depends on it is not judged."""
    fast = load_target("rtxpro6000-tp8", overrides={"sim": {"restart_outage_s": 0.1, "ttft_s": 0.005,
                                                            "itl_ms": 0.2}})
    budget = RestartBudget(worker_start_s=30, pods=1, retry_window_s=0.0, answer_s=2.0)
    with SimServer(fast, faults=["error_after_restart=1"], log_file=tmp_path / "engine.log") as sim:
        ep = Endpoint(base_url=sim.base_url, api_key=rtx_api_key, model="ml4")
        ctl = SimController(sim, "ml4", api_key=rtx_api_key, timeout_s=120)
        lines: list[str] = []
        t0 = time.monotonic()
        run = run_restart_scenario(ctl, ep, with_streams=False, recovery_limit_s=600, budget=budget,
                                   progress=lines.append)
        took = time.monotonic() - t0
    assert run.restart is not None, run.report()        # the restart itself finished ...
    assert run.timed_out is not None and run.timed_out.phase == FIRST_ANSWER, run.report()
    assert took < budget.total_s + 15, run.report()     # ... and the wait ended at the bound, not at the gate
    assert "HTTP 500" in run.timed_out.last_seen, run.report()
    with pytest.raises(AssertionError, match=f"past its deadline while {FIRST_ANSWER}"):
        assert_restart_finished(run)
    with pytest.raises(NotJudged, match=f"failed {FIRST_ANSWER}"):
        assert_scenario_judgeable(run, "restart with new requests")
    assert any(FIRST_ANSWER in line for line in lines), lines


def test_a_worker_that_never_comes_back_fails_naming_the_phase(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """gb300-agg's rolling restart: the replaced worker starts but never registers. The streams scenario fails
    within its bound naming the register phase and what it saw; the other checks are not judged, none hangs."""
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess(
        str(SUITE), "--target", "gb300-agg", "--sim", "-m", "restart", "--ml4-reports", str(tmp_path / "r"),
        "--ml4-fault", "restart_never_registers=1", "--ml4-set", f"control.worker_start_s={START_S}",
        "-p", "no:randomly", "-rA", timeout=400)
    took = time.monotonic() - t0
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    # gb300-agg collects 11 restart checks: 2 disagg ones do not apply, the streams scenario fails, the 8 others
    # (prefix reuse and session affinity judged apart) wait on it and are not judged.
    assert outcomes.get("failed") == 1 and outcomes.get("not_judged") == 8, out[-4000:]
    assert re.search(r"FAILED \S*test_restart.py::test_in_flight_streams_end_detectably", out), out[-4000:]
    assert f"restart scenario past its deadline while {REGISTER} (bound {START_S} s" in out, out[-4000:]
    assert "last seen: workers: 1/2 pods ready" in out, out[-4000:]
    waited = [float(w) for w in re.findall(r"waited (\d+\.\d) s for replacement", out)]
    assert waited and max(waited) < START_S + 5, out[-4000:]
    assert re.search(rf"NOT JUDGED \S*test_restart.py::test_recovery_time: the restart with streams in flight "
                     rf"before it failed {REGISTER}", out), out[-4000:]
    # Progress as the perf sweep prints it: phase, elapsed, what it waits for.
    assert re.search(rf"\[ml4 restart\] restart with streams in flight +\d+\.\d+s {REGISTER}: replacement of ",
                     out), out[-4000:]
    assert took < 240, f"the run took {took:.0f} s\n{out[-4000:]}"
