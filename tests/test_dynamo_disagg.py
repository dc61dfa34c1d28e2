"""Real dynamo.vllm workers in a disaggregated deployment (harness/pytest_ml4_sim/deploy/real_dynamo_disagg.py, data in
pytest_ml4/data/dynamo_vllm/disagg.yaml): each role's arguments and environment, one core per worker, the plan capped to
one worker per role and saying so, and the warm-up request that must come back prefilled and decoded on two
different workers. The real prefill -> decode run is nightly (two real workers, minutes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_ml4_sim.deploy import real_dynamo_disagg as disagg
from pytest_ml4_sim.deploy.worker_plan import plan_workers

from pytest_ml4.runtime.orphans import group_members

REPO = Path(__file__).resolve().parents[1]


def test_prefill_and_decode_args_carry_their_nixl_role_and_the_longer_lease() -> None:
    for role, mode, kv_role in (("prefill", "prefill", "kv_producer"), ("decode", "decode", "kv_consumer")):
        args = disagg.worker_args(role)
        assert args[:2] == ["--disaggregation-mode", mode] and args[2] == "--kv-transfer-config"
        config = json.loads(args[3])
        assert config["kv_connector"] == "NixlConnector" and config["kv_role"] == kv_role
        assert config["kv_buffer_device"] == "cpu"
        assert config["kv_connector_extra_config"]["kv_lease_duration"] > 30   # vLLM's default lost first pulls
        assert config["kv_connector_extra_config"]["num_threads"] == 1        # vLLM's 4 busy-poll an idle core


def test_engine_processes_yield_to_the_dynamo_runtime_that_keeps_the_worker_registered() -> None:
    """The group leader (dynamo.vllm's main process, whose runtime renews the discovery lease) keeps its priority;
    every thread of the processes it spawned (EngineCore, Worker) is lowered."""
    child_code = ("import subprocess, sys, threading, time; "
                  "threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
                  "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)")
    leader = subprocess.Popen([sys.executable, "-c", child_code], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(group_members(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert disagg.lower_engine_priority(leader.pid, leader.pid) >= 1
        nice = disagg.settings().engine_nice
        assert nice > 0
        for member in group_members(leader.pid):
            threads = [int(t.name) for t in Path(f"/proc/{member.pid}/task").iterdir()]
            want = 0 if member.pid == leader.pid else nice
            assert [os.getpriority(os.PRIO_PROCESS, t) for t in threads] == [want] * len(threads), member
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_each_worker_gets_its_side_channel_port_and_a_core_of_its_own() -> None:
    first, second = disagg.worker_env(25001, 0, cores=2), disagg.worker_env(25002, 1, cores=2)
    assert first["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "25001" and second["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "25002"
    assert (first["VLLM_CPU_OMP_THREADS_BIND"], second["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")
    assert first["UCX_TLS"] == "tcp,sm,self" and first["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert disagg.own_core(2, cores=2) == 0
    assert disagg.own_core(0) in os.sched_getaffinity(0)


def test_plan_is_capped_to_one_worker_per_role_and_says_why() -> None:
    plan = disagg.cap_plan(plan_workers({"prefill": 2, "decode": 2}, free_gib=64.0))
    assert plan.started == {"prefill": 1, "decode": 1} and plan.reduced
    assert plan.note() is not None and plan.note().startswith("reduced to 1 worker per role, one core each")
    small = plan_workers({"prefill": 1, "decode": 1}, free_gib=64.0)
    assert disagg.cap_plan(small) is small and small.note() is None


class _Answer:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status_code, self._body, self.text = status, body, json.dumps(body)

    def json(self) -> dict[str, Any]:
        return self._body


def _warm_up_with(monkeypatch: pytest.MonkeyPatch, answer: Any) -> disagg.WarmUp:
    def post(*_: Any, **__: Any) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(httpx, "post", post)
    return disagg.warm_up("http://127.0.0.1:9/v1", "m")


def test_warm_up_needs_a_prefill_and_a_decode_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = _warm_up_with(monkeypatch, _Answer(200, {"nvext": {"worker_id": {"prefill_worker_id": 1,
                                                                          "decode_worker_id": 2}}}))
    assert (ok.prefill_worker, ok.decode_worker) == (1, 2) and "prefilled on 1, decoded on 2" in ok.line()
    with pytest.raises(disagg.DisaggError, match=r"not handed from a prefill to a decode worker"):
        _warm_up_with(monkeypatch, _Answer(200, {"nvext": {"worker_id": {"prefill_worker_id": 1,
                                                                         "decode_worker_id": 1}}}))
    with pytest.raises(disagg.DisaggError, match=r"answered HTTP 503 after"):
        _warm_up_with(monkeypatch, _Answer(503, {"message": "Service temporarily unavailable"}))
    with pytest.raises(disagg.DisaggError, match=r"got no answer within 300 s: ReadTimeout"):
        _warm_up_with(monkeypatch, httpx.ReadTimeout("slow"))


@pytest.mark.nightly
def test_real_prefill_then_decode_over_nixl(tmp_path: Path) -> None:
    """gb300-disagg on real workers: one prefill and one decode dynamo.vllm behind the real frontend, the KV handed
    over NIXL/UCX on loopback, the suites' disagg handoff and KV checks passing and summary.json naming the
    reduced topology. Nightly: two real workers boot for minutes here."""
    pytest.importorskip("pytest_ml4_sim.deploy.real_dynamo")
    from pytest_ml4.runtime.installed import ToolMissing, dynamo_vllm_python

    try:
        dynamo_vllm_python()
    except ToolMissing as err:
        pytest.skip(str(err))
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "pytest", "suites", "--target", "gb300-disagg", "--sim", "--sim-engine", "vllm",
           "-m", "smoke or kv", "-p", "no:cacheprovider", "-q", "--ml4-allow-not-judged", "--ml4-run-dir",
           str(run_dir)]
    proc = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=3000,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "prefill 1 of 2, decode 1 of 2" in json.dumps(summary), "summary.json does not say the topology was reduced"
