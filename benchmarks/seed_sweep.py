#!/usr/bin/env python3
"""Rerun seed 000's aiperf sweep loop and print its table beside the seed's (long; not part of CI).

The loop is the seed's (ISL 512, OSL 4096, ``--extra-inputs min_tokens:4096``, c = 1 2 4 8 16 32 64, 300 s per
point, aiperf's default 30 s grace), run against the embedded simulator of ``rtxpro6000-tp8`` (default) or a live
endpoint (``--url``, key from ``$LLM_API_KEY``). Each figure is compared with the seed within the calibration
tolerances: 10 % for throughput, per-user rate, ITL and decode concurrency at every point, 20 % for TTFT up to c16;
TTFT at c32/c64 is queueing and is checked by shape (a jump past the knee). A c1 figure that the seed row's own
TTFT and ITL contradict (decode concurrency 1.0 there) is compared with the value they imply, marked ``*`` and
explained under the table (``Baseline.reference``).

``--time-scale K`` (simulator only) runs the simulator K times faster (``ML4_SIM_TIME_SCALE``) with the aiperf
window and grace divided by K, then scales the figures back (rates / K, latencies x K): the full loop takes about
45/K minutes. K = 1 is the faithful run.

    python benchmarks/seed_sweep.py                      # ~45 min
    python benchmarks/seed_sweep.py --time-scale 5       # ~10 min
    python benchmarks/seed_sweep.py --concurrencies 1,16 --duration 120
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pytest_ml4.perf.baseline import Baseline
from pytest_ml4.perf.figures import PointFigures, figures_from_export
from pytest_ml4.perf.runner import AiperfSpec, run_aiperf
from pytest_ml4.target.baselines import default_baseline
from pytest_ml4.target.model import load_target

SEED = default_baseline("perf", "rtxpro6000-tp8")
RATE_FIGURES = ("out_tok_s", "tok_s_user", "tok_s_user_p50")
LATENCY_FIGURES = ("ttft_p50_s", "ttft_p99_s", "itl_p50_ms", "itl_p99_ms", "duration_s")
SHOWN = ("requests", "out_tok_s", "tok_s_user", "ttft_p50_s", "ttft_p99_s", "itl_p50_ms", "itl_p99_ms",
         "decode_conc_avg", "reasoning_share")
TOL = {"out_tok_s": 0.10, "tok_s_user": 0.10, "itl_p50_ms": 0.10, "itl_p99_ms": 0.10, "decode_conc_avg": 0.10,
       "ttft_p50_s": 0.20, "ttft_p99_s": 0.20}


def unscale(fig: PointFigures, k: float) -> PointFigures:
    """Figures of a K-times-faster run expressed in real time."""
    changes = {n: getattr(fig, n) / k for n in RATE_FIGURES if getattr(fig, n) is not None}
    changes.update({n: getattr(fig, n) * k for n in LATENCY_FIGURES if getattr(fig, n) is not None})
    return replace(fig, **changes)


def verdict(c: int, name: str, got: float | None, want: float | None, measured: list[PointFigures]) -> str:
    if got is None or want is None or name not in TOL:
        return ""
    if name.startswith("ttft") and c > 16:
        # Shape: past the knee TTFT jumps well above the c16 value (queueing behind max_num_seqs).
        c16 = next((f for f in measured if f.concurrency == 16), None)
        ref = getattr(c16, name) if c16 else None
        return "shape ok" if ref is not None and got > 3 * ref else "SHAPE?"
    dev = (got - want) / want
    return f"{dev:+.0%}" + ("" if abs(dev) <= TOL[name] else " !")


def print_table(measured: list[PointFigures], seed: Baseline) -> int:
    misses = 0
    notes: list[str] = []
    header = f"{'c':>3} | " + " | ".join(f"{n:>22}" for n in SHOWN)
    print(header)
    print("-" * len(header))
    for f in measured:
        ref = seed.points.get(f.concurrency, {})
        cells = []
        for n in SHOWN:
            got, want = f.get(n), ref.get(n)
            if want is not None and n in TOL:
                # A printed c1 figure that the row's own TTFT and ITL contradict is compared with the implied one.
                want, note = seed.reference(f.concurrency, n)
                if note:
                    notes.append(f"c{f.concurrency} {n}: {note}")
            mark = verdict(f.concurrency, n, got, want, measured)
            misses += mark.endswith("!") or mark == "SHAPE?"
            g = "-" if got is None else f"{got:.3g}"
            w = "-" if want is None else f"{want:.3g}" + ("*" if n in TOL and ref.get(n) != want else "")
            cells.append(f"{g:>7} /{w:>7} {mark:>6}")
        print(f"{f.concurrency:>3} | " + " | ".join(cells))
    print("\ncells: measured / seed deviation ('!' outside tolerance: 10 %, TTFT 20 % up to c16; c32/c64 TTFT by shape)")
    for line in notes:
        print(f"* {line}")
    return misses


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="live endpoint base URL (…/v1); default: start the simulator")
    ap.add_argument("--metrics-url", help="the engine's /metrics for a live endpoint")
    ap.add_argument("--target", default="rtxpro6000-tp8")
    ap.add_argument("--concurrencies", default="1,2,4,8,16,32,64")
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--grace", type=float, default=30.0, help="aiperf's default, as in the seed's loop")
    ap.add_argument("--osl", type=int, default=4096)
    ap.add_argument("--isl", type=int, default=512)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=None, help="folder for the exports (default: a temp folder)")
    args = ap.parse_args(argv)
    k = args.time_scale
    concurrencies = [int(x) for x in args.concurrencies.split(",")]
    out = args.out or Path(tempfile.mkdtemp(prefix="seed-sweep-"))
    target = load_target(args.target)
    key = os.environ.get(target.endpoint.api_key_env or "", "") or None
    sim = None
    if args.url is None:
        from pytest_ml4_sim.deploy.simulator import SimServer

        env = dict(os.environ, ML4_SIM_TIME_SCALE=str(k))
        if target.endpoint.requires_api_key and target.endpoint.api_key_env and not key:
            key = env[target.endpoint.api_key_env] = "sk-bench-" + os.urandom(6).hex()
        sim = SimServer(target, log_file=out / "engine.log", env=env)
        sim.start(timeout=60)
        base_url, metrics_url = sim.base_url, sim.url + "/metrics"
    elif k != 1.0:
        ap.error("--time-scale needs the simulator")
    else:
        base_url, metrics_url = args.url, args.metrics_url
    measured: list[PointFigures] = []
    try:
        for c in concurrencies:
            t0 = time.monotonic()
            spec = AiperfSpec(model=target.serving.served_model_name, url=base_url, concurrency=c, isl=args.isl,
                              osl=args.osl, duration_s=args.duration / k, grace_s=args.grace / k,
                              min_tokens=args.osl, server_metrics_url=metrics_url)
            run = run_aiperf(spec, out / f"sweep-c{c}", api_key=key)
            if run.export is None:
                print(f"c{c}: {run.describe()}", file=sys.stderr)
                continue
            fig = unscale(figures_from_export(run.export, c), k)
            measured.append(fig)
            note = "" if run.ok else f"  [{'; '.join(run.problems)}]"
            print(f"c{c}: {time.monotonic() - t0:.0f} s wall, {fig.requests} requests{note}", file=sys.stderr,
                  flush=True)
    finally:
        if sim is not None:
            sim.stop()
    seed = Baseline.load(SEED)
    print(f"\nseed 000 loop against {'the simulator' if sim else base_url}"
          f"{f' (time scale {k:g})' if k != 1 else ''}; exports in {out}\n")
    misses = print_table(measured, seed)
    (out / "seed-sweep.json").write_text(json.dumps([f.as_dict() for f in measured], indent=2))
    print(f"\n{misses} figure(s) outside tolerance")
    return 0 if misses == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
