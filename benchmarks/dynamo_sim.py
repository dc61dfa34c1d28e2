"""The embedded Dynamo deployment (real dynamo.frontend 1.6.1 + the project's Dynamo workers): start time, idle
memory and streamed throughput at concurrency 1 and 16.

    python benchmarks/dynamo_sim.py [--target gb300-agg] [--osl 256] [--requests-per-stream 2]

Prints the wall time from ``DynamoSim.start()`` until it serves (model listed, every worker in ``/health``), the
RSS of the frontend and of each worker when idle (from ``/proc/PID/status``), and the client-side aggregate and
per-stream tok/s of streamed requests with a fixed output length (``min_tokens = max_tokens = osl``).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from pytest_ml4.sim.dynamo import DynamoSim
from pytest_ml4.targets import load_target


def rss_mib(pid: int | None) -> float:
    if pid is None:
        return 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def stream_once(client: httpx.AsyncClient, model: str, osl: int) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "Explain how a KV cache works."}],
            "stream": True, "min_tokens": osl, "max_tokens": osl, "stream_options": {"include_usage": True}}
    tokens = 0
    async with client.stream("POST", "/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"usage"' in line and '"choices":[]' in line:
                tokens = int(line.split('"completion_tokens":')[1].split(",")[0].split("}")[0])
    return tokens


async def throughput(dsim: DynamoSim, concurrency: int, osl: int, per_stream: int) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=dsim.base_url, timeout=600) as client:
        async def user() -> int:
            return sum([await stream_once(client, dsim.target.serving.served_model_name, osl)
                        for _ in range(per_stream)])

        t0 = time.monotonic()
        totals = await asyncio.gather(*(user() for _ in range(concurrency)))
        dt = time.monotonic() - t0
    return sum(totals) / dt, sum(totals) / dt / concurrency


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
                agg, per_user = asyncio.run(throughput(dsim, c, args.osl, args.requests_per_stream))
                print(f"c{c}: {agg:,.0f} tok/s aggregate, {per_user:,.0f} tok/s per stream (osl {args.osl})")
        finally:
            dsim.stop()


if __name__ == "__main__":
    main()
