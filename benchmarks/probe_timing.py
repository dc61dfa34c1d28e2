#!/usr/bin/env python3
"""Timing error of the stream probe and of aiperf against the simulator's own schedule, on the same run.

The simulator records, per streamed chunk, the gap since the sequence's previous chunk
(``vllm:inter_token_latency_seconds``) and, per request, arrival to first token (``vllm:time_to_first_token_seconds``)
in its Prometheus histograms: that is the server-side schedule. On one simulator run, aiperf drives ``--concurrency``
streams, then the stream probe (``pytest_ml4.client.stream_probe``) sends the same number of requests at the same concurrency;
each client's means are printed beside the server's means over that client's own phase (histogram differences),
so the error is the client's timing error, averaged over its requests.

    python benchmarks/probe_timing.py [--target rtxpro6000-tp8] [--concurrency 4] [--osl 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.client.stream_probe import probe_chat_stream
from pytest_ml4.evidence.metrics import diff, scrape
from pytest_ml4.perf.export import read_records
from pytest_ml4.perf.runner import AiperfSpec, run_aiperf
from pytest_ml4.target.model import load_target


def server_means(before, after) -> tuple[float | None, float | None]:
    d = diff(before, after)

    def mean(name: str) -> float | None:
        n = d.sum(f"{name}_count")
        return d.sum(f"{name}_sum") / n if n else None

    return mean("vllm:inter_token_latency_seconds"), mean("vllm:time_to_first_token_seconds")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="rtxpro6000-tp8")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--osl", type=int, default=256)
    ap.add_argument("--requests", type=int, default=16, help="aiperf requests")
    args = ap.parse_args(argv)
    target = load_target(args.target)
    out = Path(tempfile.mkdtemp(prefix="probe-timing-"))
    env = dict(os.environ)
    key = None
    if target.endpoint.requires_api_key and target.endpoint.api_key_env:
        key = env[target.endpoint.api_key_env] = "sk-bench-" + os.urandom(6).hex()
    with SimServer(target, log_file=out / "engine.log", env=env) as sim:
        metrics = sim.url + "/metrics"
        spec = AiperfSpec(model=target.serving.served_model_name, url=sim.base_url, concurrency=args.concurrency,
                          isl=256, osl=args.osl, duration_s=None, request_count=args.requests,
                          min_tokens=args.osl, server_metrics_url=metrics)
        # Phase 1: aiperf alone; its server-side share of the histograms is the difference around it.
        before = scrape(metrics)
        run = run_aiperf(spec, out / "aiperf", api_key=key)
        mid = scrape(metrics)
        # Phase 2: the probe alone, same concurrency and request count, same simulator.
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": target.serving.served_model_name, "stream": True, "max_tokens": args.osl,
                "min_tokens": args.osl, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "Explain how a KV cache works."}]}
        with httpx.Client(base_url=sim.base_url, headers=headers, timeout=120,
                          limits=httpx.Limits(max_connections=args.concurrency)) as http, \
                ThreadPoolExecutor(args.concurrency) as pool:
            probes = list(pool.map(lambda _i: probe_chat_stream(http, body), range(args.requests)))
        after = scrape(metrics)
    if not run.ok:
        print(run.describe(), file=sys.stderr)
        return 1
    a_s_itl, a_s_ttft = server_means(before, mid)
    p_s_itl, p_s_ttft = server_means(mid, after)
    p_itl = statistics.fmean(g for p in probes for g in p.itl_s)
    p_ttft = statistics.fmean(p.ttft_s for p in probes if p.ttft_s is not None)
    recs = read_records(run.out_dir)
    a_itl = statistics.fmean(g for r in recs for g in (r.value("inter_chunk_latency") or [])) / 1000.0
    a_ttft = statistics.fmean(r.value("time_to_first_token") for r in recs) / 1000.0
    print(f"{args.target} simulator, c{args.concurrency}, {args.requests} requests of OSL {args.osl} per client\n")
    print(f"{'figure':<22}{'client':>8}{'server':>10}{'measured':>10}{'error':>10}")
    rows = (("chunk gap mean (ms)", "probe", p_s_itl, p_itl), ("chunk gap mean (ms)", "aiperf", a_s_itl, a_itl),
            ("TTFT mean (ms)", "probe", p_s_ttft, p_ttft), ("TTFT mean (ms)", "aiperf", a_s_ttft, a_ttft))
    for name, who, s, m in rows:
        if s is None:
            print(f"{name:<22}{who:>8}{'n/a':>10}")
            continue
        print(f"{name:<22}{who:>8}{s * 1e3:>10.2f}{m * 1e3:>10.2f}{(m - s) * 1e3:>+10.2f}")
    print("\nserver = the simulator's own histograms over that client's phase; error = client mean - server mean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
