"""The real Dynamo deployment on real workers (``--sim-engine vllm`` on a Dynamo target): start time, memory per
worker, streamed tok/s.

    python benchmarks/dynamo_vllm.py [--target vr200-agg] [--osl 128] [--concurrency 1 4]

Starts the real ``dynamo.frontend`` with the target's real ``python -m dynamo.vllm`` workers (as many as memory
allows here; the tiny scripted model), measures the time until the model is served by every worker, the resident
memory of each worker's process group (main, EngineCore, Worker) and the aggregate streamed output tokens per
second through the frontend at each concurrency (``min_tokens = max_tokens = osl``). Prints a table; no test is
timed. Needs ``scripts/install.d/65-dynamo-vllm.sh``. Reference (real-dynamo-vllm.md): one worker 35 s to
registered at load ~1, 69-138 s at load 5-27; ~3.7 GiB RSS per worker.
"""

from __future__ import annotations

import argparse
import os
import time

from _streaming import streamed_tok_s  # benchmarks/ is on sys.path
from pytest_ml4_sim.deploy.real_dynamo import RealDynamoDeployment
from pytest_ml4_sim.deploy.real_vllm import tiny_overrides
from real_vllm import group_rss_mib

from pytest_ml4.runtime.installed import DYNAMO_VLLM_ENGINE_VERSION
from pytest_ml4.target.model import deep_merge, load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="vr200-agg")
    ap.add_argument("--osl", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = ap.parse_args()
    over = deep_merge(tiny_overrides(), {"engine": {"version": DYNAMO_VLLM_ENGINE_VERSION}})
    target = load_target(args.target, overrides=over)
    dep = RealDynamoDeployment(target)
    t0 = time.monotonic()
    dep.start(timeout=900)
    try:
        print(f"{args.target}: real dynamo.frontend + {len(dep.workers)} dynamo.vllm worker(s) "
              f"({dep.plan.note() or 'as declared'}); serving after {time.monotonic() - t0:.1f} s; "
              f"load {os.getloadavg()[0]:.1f}")
        for w in dep.workers:
            print(f"  {w.role}#{w.index}: RSS of its process group {group_rss_mib(os.getpgid(w.pid or 0)):.0f} MiB")
        print(f"  frontend RSS {group_rss_mib(os.getpgid(dep.frontend.pid or 0)):.0f} MiB")
        for c in args.concurrency:
            tok_s = streamed_tok_s(dep.base_url, target.serving.served_model_name, args.osl, c, headers={})
            print(f"  streamed, concurrency {c}: {tok_s:.1f} tok/s (osl {args.osl})")
    finally:
        dep.stop()


if __name__ == "__main__":
    main()
