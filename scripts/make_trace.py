#!/usr/bin/env python3
"""Generate ``pytest_ml4/data/traces/agentic-mooncake.jsonl``: a deterministic agentic ``mooncake_trace`` for aiperf.

Shape (an estimate of an agent workload, not a recording): ``--sessions`` agent sessions start at random times;
each makes several turns whose context grows by the previous answer and a tool result, so consecutive turns share
their prefix (high KV reuse, as in the Dynamo recipes' "90kv" agent traces, dynamo.md §7), and every session shares
the same tool-definition prefix. Rows are single requests in mooncake form (aiperf.md §4.4)::

    {"timestamp": ms, "input_length": int, "output_length": int, "hash_ids": [int, ...]}

``hash_ids`` name 512-token blocks. A reused id must always be a full block (aiperf rejects a trace that
materialises an id at two sizes), so only full blocks get persistent ids; a trailing partial block gets an id that
is never used again. Timestamps are sorted; the first row is at 0, which makes aiperf replay on a fixed schedule.

Usage: ``python scripts/make_trace.py [--out PATH] [--seed 42] [--sessions 16]``; the same arguments give the same
bytes. ``--check`` verifies the committed file is what the script generates.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

BLOCK = 512
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "pytest_ml4" / "data" / "traces" / "agentic-mooncake.jsonl"
TOOL_PREFIX_BLOCKS = 6          # ~3k tokens of system prompt + tool schemas shared by every session


class _Ids:
    def __init__(self) -> None:
        self.next = 0

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def _blocks_for(context: int, persistent: list[int], ids: _Ids) -> list[int]:
    """Ids for a prompt of ``context`` tokens: persistent full blocks (extended as needed) + a fresh partial one."""
    full, partial = divmod(context, BLOCK)
    while len(persistent) < full:
        persistent.extend(ids.take(1))
    out = persistent[:full]
    if partial:
        out = out + ids.take(1)
    return out


def generate(seed: int = 42, sessions: int = 16, window_s: float = 240.0) -> list[dict[str, int | list[int]]]:
    rng = random.Random(seed)
    ids = _Ids()
    shared = ids.take(TOOL_PREFIX_BLOCKS)
    rows: list[dict[str, int | list[int]]] = []
    for s in range(sessions):
        # The first session starts at 0 so the schedule starts at once; the others spread over the window.
        t = 0.0 if s == 0 else rng.uniform(0.0, window_s * 0.6)
        persistent = list(shared)
        context = TOOL_PREFIX_BLOCKS * BLOCK + rng.randint(800, 2500)   # system + tools + the user task
        for _turn in range(rng.randint(3, 7)):
            if context > 60_000:
                break
            # Agent turns: mostly short tool calls, sometimes a long reasoning/answer turn.
            out_len = rng.randint(120, 400) if rng.random() < 0.75 else rng.randint(800, 1500)
            rows.append({"timestamp": int(t * 1000), "input_length": context, "output_length": out_len,
                         "hash_ids": _blocks_for(context, persistent, ids)})
            # Next turn: answer + tool result appended; the agent waits for the tool (seconds).
            context += out_len + rng.randint(300, 3000)
            t += out_len * 0.02 + rng.uniform(2.0, 12.0)
    rows.sort(key=lambda r: (r["timestamp"], r["hash_ids"][-1]))
    return rows


def render(rows: list[dict[str, int | list[int]]]) -> str:
    return "".join(json.dumps(r, separators=(", ", ": ")) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--check", action="store_true", help="exit 1 if --out differs from what would be generated")
    args = ap.parse_args(argv)
    text = render(generate(args.seed, args.sessions))
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from the generator output'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({text.count(chr(10))} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
