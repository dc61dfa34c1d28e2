"""Can the simulator sustain N concurrent streams on this box?  Prints client-side figures beside the model's.

    python benchmarks/sim_streams.py [--target gb300-agg] [--concurrency 64] [--osl 1024] [--set sim.itl_ms=2]

Starts the simulator (SimServer), runs ``concurrency`` streaming requests at once with fixed output length
(min_tokens = max_tokens = osl), and prints TTFT/ITL percentiles, aggregate and per-user throughput, the
simulator's CPU time, and the ITL the perf model intended at that concurrency.  A simulator that keeps up shows
client ITL close to the model ITL and CPU well under one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import httpx
from pytest_ml4_sim.deploy.simulator import SimServer
from pytest_ml4_sim.sim.perfmodel import PerfModel

from pytest_ml4.target.model import deep_merge, load_target, parse_override


async def one(client: httpx.AsyncClient, osl: int) -> tuple[float, list[float], int]:
    body = {"messages": [{"role": "user", "content": "Explain how a KV cache works."}], "stream": True,
            "min_tokens": osl, "max_tokens": osl, "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    stamps: list[float] = []
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            if ev["choices"] and ("reasoning" in ev["choices"][0]["delta"] or "content" in ev["choices"][0]["delta"]):
                stamps.append(time.monotonic())
    ttft = stamps[0] - t0
    return ttft, stamps, tokens


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(int(p / 100 * len(xs)), len(xs) - 1)]


async def run(url: str, conc: int, osl: int, headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=conc + 4),
                                 headers=headers) as c:
        t0 = time.monotonic()
        results = await asyncio.gather(*(one(c, osl) for _ in range(conc)))
        wall = time.monotonic() - t0
    ttfts = [r[0] for r in results]
    itls = [(r[1][-1] - r[1][0]) / max(r[2] - 1, 1) for r in results]
    total = sum(r[2] for r in results)
    print(f"requests {conc}  output tokens {total}  wall {wall:.1f} s  aggregate {total / wall:.1f} tok/s  "
          f"per-user (decode) {statistics.mean((r[2] - 1) / (r[1][-1] - r[1][0]) for r in results):.1f} tok/s")
    print(f"TTFT p50 {pct(ttfts, 50):.3f} s  p99 {pct(ttfts, 99):.3f} s   ITL p50 {pct(itls, 50) * 1000:.2f} ms  "
          f"p99 {pct(itls, 99) * 1000:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="gb300-agg")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--osl", type=int, default=1024)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    a = ap.parse_args()
    over: dict = {}
    for o in a.overrides:
        over = deep_merge(over, parse_override(o))
    target = load_target(a.target, overrides=over or None)
    running = min(a.concurrency, target.engine.max_num_seqs)
    print(f"model ITL at {running} running: {PerfModel(target).itl(running) * 1000:.2f} ms")
    key = "sk-bench-" + os.urandom(8).hex()
    with SimServer(target, env={target.endpoint.api_key_env or "ML4_UNUSED_KEY": key}) as sim:
        cpu0 = _cpu(sim.pid)
        asyncio.run(run(sim.url, a.concurrency, a.osl, {"Authorization": f"Bearer {key}"}))
        print(f"simulator CPU time {_cpu(sim.pid) - cpu0:.1f} s")


def _cpu(pid: int | None) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
