#!/usr/bin/env python3
"""Where a perf suite run's wall time goes, per load phase: each aiperf run's arrival schedule, the time from its
last arrival to its last answer, its latencies, and beside it what the probes did (``ml4-probes.json``: probes sent,
cut off, and how long the phase's end waited for the one in flight).

    python -m pytest suites/test_perf.py --target gb300-agg --sim --perf-short --ml4-reports /tmp/on
    python -m pytest suites/test_perf.py --target gb300-agg --sim --perf-short --perf-probe-share 0 --ml4-reports /tmp/off
    python benchmarks/phase_timing.py /tmp/on /tmp/off

Two runs of the open-loop phases (goodput, capacity, sessions) draw different Poisson schedules, so compare their
``after last arrival`` and latencies, not their durations.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def phase_rows(reports: Path) -> list[str]:
    rows = []
    for path in sorted(reports.rglob("profile_export.jsonl")):
        if "phases" in path.parts:   # the trace replay's per-phase copies of its run
            continue
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        records = [r for r in records if r.get("metadata", {}).get("benchmark_phase") == "profiling"]
        if not records:
            continue
        issued = [r["metadata"]["credit_issued_ns"] / 1e9 for r in records]
        ends = [r["metadata"]["request_end_ns"] / 1e9 for r in records]
        latency = sorted(r["metrics"]["request_latency"]["value"] / 1000 for r in records
                         if "request_latency" in r.get("metrics", {}))
        probes = path.parent / "ml4-probes.json"
        found = json.loads(probes.read_text()) if probes.is_file() else None
        probe_note = "no probes" if found is None else (
            f"{len(found['results'])} probes, {sum(bool(r.get('cut_off')) for r in found['results'])} cut off, "
            f"end waited {found.get('stop_wait_s')} s")
        name = str(path.parent.relative_to(reports)).partition("/perf/")[2] or str(path.parent.relative_to(reports))
        rows.append(f"{name[-48:]:48} {len(records):4d} {max(issued) - min(issued):8.2f} "
                    f"{max(ends) - max(issued):8.2f} {latency[len(latency) // 2] if latency else 0:6.2f} "
                    f"{latency[-1] if latency else 0:6.2f}  {probe_note}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", type=Path, help="--ml4-reports folders of perf suite runs")
    args = p.parse_args(argv)
    for reports in args.reports:
        if not reports.is_dir():
            p.error(f"{reports}: not a folder")
        print(f"{reports}\n{'aiperf run':48} {'reqs':>4} {'arrivals':>8} {'after':>8} {'p50 s':>6} {'max s':>6}  "
              f"probes\n{'':48} {'':4} {'span s':>8} {'last s':>8}")
        print("\n".join(phase_rows(reports)) or "  (no aiperf per-request export)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
