"""The restart suite's "new requests" scenario alone, on the real Dynamo deployment: how long each phase takes.

    python benchmarks/restart_phases.py [--target gb300-agg] [--sim-engine vllm]

Starts the target's embedded deployment (``--sim-engine vllm``: the real ``dynamo.frontend`` with real
``python -m dynamo.vllm`` workers; ``sim``: the simulated workers) behind the fake Kubernetes API, restarts every
worker pod one at a time while probes are sent every ``probe.interval_s`` (as ``suites/test_restart.py`` does),
bounded by the budget derived from the target, and prints each phase's duration (old worker leaving, new worker
registering, first answer of a new engine) with the machine's load. No test is timed; the figures of a run are in
docs/notes/restart-real-workers-2026-12-04.md.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

from pytest_ml4_sim.deploy.dynamo import DynamoDeployment, DynamoSim
from pytest_ml4_sim.deploy.fake_k8s import serve_dynamo
from pytest_ml4_sim.deploy.real_vllm import tiny_overrides

from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.control import controller_for
from pytest_ml4.control.budget import (
    RestartBudget,
    deployment_start_overrides,
    pods_replaced_in_turn,
)
from pytest_ml4.control.k8s_api import api_client
from pytest_ml4.control.scenario import load_requests, run_restart_scenario
from pytest_ml4.target.model import deep_merge, load_target

DONE = re.compile(r"done waiting for (?P<what>.+) after (?P<s>\d+\.\d) s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="gb300-agg")
    ap.add_argument("--sim-engine", choices=("sim", "vllm"), default="vllm")
    ap.add_argument("--log-dir", default="reports/restart-phases")
    args = ap.parse_args()
    over = deployment_start_overrides(args.sim_engine)
    if args.sim_engine == "vllm":
        from pytest_ml4_sim.deploy.real_dynamo import RealDynamoDeployment
        over = deep_merge(tiny_overrides(), over)
        cls: type[DynamoDeployment] = RealDynamoDeployment
    else:
        cls = DynamoSim
    target = load_target(args.target, overrides=over)
    t0 = time.monotonic()
    dep = cls(target, log_file=Path(args.log_dir) / "engine.log").start(timeout=900)
    print(f"{args.target} ({args.sim_engine}): {len(dep.workers)} workers serving after {time.monotonic() - t0:.1f} s, "
          f"load {os.getloadavg()[0]:.1f}")
    fake = serve_dynamo(dep, "ml4-bench", target.control.dgd)
    try:
        ctl = controller_for(target, root_url=dep.url, base_url=dep.base_url, kube_api=api_client(fake.url),
                             namespace="ml4-bench")
        ctl.rolling = True
        spec = load_requests()
        budget = RestartBudget.for_target(target, pods=pods_replaced_in_turn(ctl),
                                          probe_max_tokens=int(spec["probe"]["max_tokens"]))
        print(f"bound {budget.describe()}")
        endpoint = Endpoint(base_url=dep.base_url, api_key=None, model=target.serving.served_model_name)
        run = run_restart_scenario(ctl, endpoint, spec=spec, with_streams=False, budget=budget,
                                   recovery_limit_s=target.gates.recovery_time_s_max,
                                   progress=lambda line: print(f"  {line} (load {os.getloadavg()[0]:.1f})"))
        print("phases:")
        for line in run.progress:
            if (m := DONE.search(line)) is not None:
                print(f"  {float(m['s']):7.1f} s  {m['what']}")
        print(f"first answer of a new engine: "
              f"{'never' if run.recovery_s is None else f'+{run.recovery_s:.1f} s after the trigger'}; "
              f"{len(run.requests)} requests, {sum(not r.ok for r in run.requests)} failed; "
              f"{'PAST ITS BOUND: ' + str(run.timed_out) if run.timed_out else 'within its bound'}")
    finally:
        fake.wait_settled()
        fake.stop()
        dep.stop()


if __name__ == "__main__":
    main()
