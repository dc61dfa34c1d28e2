"""Prints how fast engine logs are read and parsed (records/s, events/s) on a large synthetic journal.

The journal repeats the recorded excerpts in fixtures/logs/ (boot, stats and spec-decode lines, tracebacks),
so the mix of matching and non-matching lines resembles a busy engine log. Usage:
    python benchmarks/logs_parse.py [--copies N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pytest_ml4.logs import LogView, records_from_text
from pytest_ml4.logs.signatures import last_boot_start

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"  # the checkout's recordings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=500, help="how many times the excerpts are repeated")
    args = ap.parse_args()
    text = "".join(p.read_text() for p in sorted(LOGS.glob("*.log"))) * args.copies
    t0 = time.perf_counter()
    records = records_from_text(text)
    t1 = time.perf_counter()
    view = LogView(records)
    t2 = time.perf_counter()
    start = last_boot_start(records)
    t3 = time.perf_counter()
    n = len(records)
    print(f"lines: {n:,}  events: {len(view.events):,}")
    print(f"read (stamps, colour): {t1 - t0:.2f} s  = {n / (t1 - t0):,.0f} lines/s")
    print(f"parse (catalogue):     {t2 - t1:.2f} s  = {n / (t2 - t1):,.0f} lines/s")
    print(f"find last boot:        {t3 - t2:.2f} s  (starts at line {start:,})")


if __name__ == "__main__":
    main()
