#!/usr/bin/env python3
"""What does one kill-matrix run cost?  Deployment start, suites, aiperf: wall AND CPU seconds.

    python benchmarks/kill_matrix_cost.py TARGET PROFILE [RUN ...] [--json PATH]

RUN is ``healthy`` (the default) or a kill group's name; each runs exactly the subprocess
``tests/test_kill_matrix.py`` runs for it (``tests/killmatrix.py`` ``suite_command``), one after the other, with
``--durations=0`` added. Printed per run:

* wall and CPU seconds of the whole subprocess tree (``getrusage(RUSAGE_CHILDREN)``: every descendant the tree
  waited for, the simulator, Dynamo workers, LiteLLM and aiperf included);
* ``aiperf``: wall seconds of the tests of the suite files that run aiperf (perf, KV, osl);
* ``suites``: the other tests' setup, call and teardown;
* ``collect``: the same command with ``--collect-only`` (interpreter start, imports, collection: no deployment),
  wall and CPU;
* ``deploy``: what is left: the deployment's start (the plugin's session start) and stop, the reports.

The machine is shared: wall time is noisy, CPU seconds much less so. Run it on a quiet machine for figures.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from killmatrix import REPO, env, load_matrix, nodes_of, plan_kill_run, suite_command

#: Suite files whose tests spend their time in aiperf runs.
AIPERF_FILES = ("suites/test_perf.py", "suites/test_kv_cache.py", "suites/test_osl.py")
_DURATION = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


@dataclass
class Cost:
    run: str
    wall_s: float
    cpu_s: float
    aiperf_s: float
    suites_s: float
    collect_s: float
    collect_cpu_s: float
    deploy_s: float
    tests: int


def nodes_for(target: str, profile: str, run: str) -> tuple[list[str], tuple[str, ...]]:
    """The nodes and extra options of the healthy run or of one kill group's run."""
    m = load_matrix(target)
    if run == "healthy":
        checks = [c for c in m.checks.values() if m.profile(c.key) == profile and not c.pending]
        return [n for c in checks for n in nodes_of(target, c)], ()
    kills = [k for k in m.kills.values() if k.group == run]
    if not kills:
        raise SystemExit(f"{target}: no kill group {run!r}; groups: {sorted({k.group for k in m.kills.values()})}")
    plan = plan_kill_run(m, kills, profile)
    return plan.nodes, tuple(a for k in kills for a in k.breaks + k.args)


def measure(target: str, profile: str, run: str, tmp: Path) -> Cost:
    m = load_matrix(target)
    nodes, extra = nodes_for(target, profile, run)
    cmd = suite_command(m, nodes, profile, extra, tmp)
    collect_wall, collect_cpu, _ = timed(cmd + ["--collect-only"])
    wall, cpu, out = timed(cmd + ["--durations=0", "--durations-min=0"])
    aiperf = suites = 0.0
    for line in out.splitlines():
        hit = _DURATION.match(line)
        if hit and hit[3].split("::")[0] in AIPERF_FILES:
            aiperf += float(hit[1])
        elif hit:
            suites += float(hit[1])
    return Cost(run, round(wall, 1), round(cpu, 1), round(aiperf, 1), round(suites, 1), round(collect_wall, 1),
                round(collect_cpu, 1), round(wall - aiperf - suites - collect_wall, 1), len(nodes))


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds of the whole process tree, and stdout of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, check=False).stdout
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("profile")
    ap.add_argument("runs", nargs="*", default=["healthy"], help="healthy, kill group names, or 'all'")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    costs = []
    print(f"{'run':28} {'tests':>5} {'wall s':>7} {'CPU s':>7} {'collect':>7} {'(CPU)':>6} {'deploy':>6} "
          f"{'aiperf':>7} {'suites':>7}", flush=True)
    runs = args.runs
    if runs == ["all"]:
        m = load_matrix(args.target)
        runs = ["healthy"] + [g for g in dict.fromkeys(k.group for k in m.kills.values())
                              if m.named([k for k in m.kills.values() if k.group == g], args.profile)]
    for run in runs:
        with tempfile.TemporaryDirectory(prefix="kmcost-") as tmp:
            c = measure(args.target, args.profile, run, Path(tmp))
        costs.append(c)
        print(f"{c.run:28} {c.tests:>5} {c.wall_s:>7} {c.cpu_s:>7} {c.collect_s:>7} {c.collect_cpu_s:>6} "
              f"{c.deploy_s:>6} {c.aiperf_s:>7} {c.suites_s:>7}", flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in costs], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
