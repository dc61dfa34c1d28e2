"""The embedded Dynamo deployment (real dynamo.frontend 1.6.1 + the project's Dynamo workers): start time, idle
memory and streamed throughput at concurrency 1 and 16.

    python benchmarks/dynamo_sim.py [--target gb300-agg] [--osl 256] [--requests-per-stream 2]

Prints the wall time from ``DynamoSim.start()`` until it serves (model listed, every worker in ``/health``), the
RSS of the frontend and of each worker when idle (from ``/proc/PID/status``), and the client-side aggregate and
per-stream tok/s of streamed requests with a fixed output length (``min_tokens = max_tokens = osl``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _streaming import streamed_tok_s  # benchmarks/ is on sys.path
from pytest_ml4_sim.deploy.dynamo import DynamoSim

from pytest_ml4.target.model import load_target


def rss_mib(pid: int | None) -> float:
    if pid is None:
        return 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="gb300-agg")
    ap.add_argument("--osl", type=int, default=256)
    ap.add_argument("--requests-per-stream", type=int, default=2)
    args = ap.parse_args()
    target = load_target(args.target)
    with tempfile.TemporaryDirectory(prefix="ml4-dynamo-bench-") as tmp:
        dsim = DynamoSim(target, log_file=Path(tmp) / "engine.log")
        t0 = time.monotonic()
        dsim.start()
        try:
            print(f"target {target.name}: {len(dsim.workers)} workers, start {time.monotonic() - t0:.1f} s")
            time.sleep(2)
            procs = [("dynamo.frontend", dsim.frontend.pid)] + [(f"{w.role}#{w.index}", w.pid) for w in dsim.workers]
            rss = {name: rss_mib(pid) for name, pid in procs}
            print("idle RSS MiB: " + ", ".join(f"{k} {v:.0f}" for k, v in rss.items())
                  + f"; total {sum(rss.values()):.0f}")
            for c in (1, 16):
                agg = streamed_tok_s(dsim.base_url, target.serving.served_model_name, args.osl, c,
                                     per_stream=args.requests_per_stream)
                per_user = agg / c
                print(f"c{c}: {agg:,.0f} tok/s aggregate, {per_user:,.0f} tok/s per stream (osl {args.osl})")
        finally:
            dsim.stop()


if __name__ == "__main__":
    main()
