"""The goodput gate against the simulator: a fault that slows only the tail fails it while the P50 gates pass, and
the healthy deployment (the control) passes it.

The fault ``tail_slow=0.1`` makes every 10th request an engine admits decode 10x slower: its ITL leaves the SLO, the
median request is untouched. Both runs use the suite's own workload spec (Poisson arrivals at the target's
production rate, aiperf's ``--goodput``) and the suite's gate code; aiperf's good count is checked against one
counted here from the per-request export, so the gate is not judged by a figure only aiperf computed.

Nightly: two Dynamo deployments and two aiperf runs (~2.5 min on 2 cores). In CI the kill matrix's ``tail_slow``
kill fails the suite's goodput check and its healthy run passes it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.dynamo import DynamoSim

from pytest_ml4.perf import gates
from pytest_ml4.perf.export import read_records
from pytest_ml4.perf.figures import figures_from_export
from pytest_ml4.perf.goodput import (
    CONCURRENCY_CAP,
    count_good,
    goodput_gate,
    goodput_of,
    workload_spec,
)
from pytest_ml4.perf.runner import failure_log, run_aiperf
from pytest_ml4.target.model import load_target

TARGET = "gb300-disagg"
REQUESTS = 40


def run_chat(faults: tuple[str, ...], tmp: Path) -> tuple[gates.GateResult, dict[str, bool], int, int]:
    target = load_target(TARGET)
    w = target.perf.workloads["chat"]
    with DynamoSim(target, faults=faults, log_file=tmp / "engine.log", env=dict(os.environ)) as sim:
        spec = workload_spec(target, "chat", model=target.serving.served_model_name, url=sim.base_url,
                             rate=w.request_rate, requests=REQUESTS)
        run = run_aiperf(spec, tmp / "aiperf")
    assert run.ok, run.describe() + "\n" + failure_log(run)
    export = run.require()
    g = goodput_of(export, "chat", w.request_rate, w.slo, target.perf.goodput_floor)
    own = count_good(read_records(tmp / "aiperf"), w.slo)
    p50 = {r.gate: r.passed for r in gates.dynamo_gates(figures_from_export(export, CONCURRENCY_CAP), target)}
    return goodput_gate(g, w.slo), p50, g.good, own


@pytest.mark.nightly
@pytest.mark.parametrize("faults, goodput_passes", [((), True), (("tail_slow=0.1",), False)],
                         ids=["healthy", "tail_slow"])
def test_tail_fault_fails_goodput_and_passes_p50_gates(faults: tuple[str, ...], goodput_passes: bool,
                                                       tmp_path: Path) -> None:
    gate, p50, aiperf_good, own_good = run_chat(faults, tmp_path)
    assert aiperf_good == own_good, f"aiperf counted {aiperf_good} good requests, the per-request export {own_good}"
    assert p50 == {"decode_tok_s_user_p50": True, "ttft_p50": True}, p50
    assert gate.passed is goodput_passes, str(gate)
    if not goodput_passes:
        assert "of chat requests met every SLO" in gate.detail and "floor 95%" in gate.detail, gate.detail
