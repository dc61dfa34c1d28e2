"""Does the gate cry wolf under load?  Runs the main job and the restart suite N times back to back with every core
kept busy by a load generator, and prints the failures per test (goal: 0 in 10).

    python benchmarks/flake.py [--runs 10] [--targets rtxpro6000-tp8,gb300-disagg] [--jobs main,restart]
                               [--load-procs N] [--timeout 1800] [--json PATH]

Jobs: ``main`` is what ``scripts/run-sim.sh TARGET`` runs (``pytest suites --target T --sim --perf-short``, install
step left out: run ``scripts/install.sh`` once first), ``restart`` is ``pytest suites --target T --sim -m restart``.
The load generator is one busy-looping process per core (``--load-procs``, default ``os.cpu_count()``), started
before the first run and stopped by PID after the last, at normal priority so the gate really competes for the
CPUs. Not a timed test: it measures whether outcomes depend on load, and prints one line per test that failed at
least once (``failures/runs``), then a total; exit code 1 when anything failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
#: The pytest arguments of each job after ``--target T --sim`` (main = scripts/run-sim.sh without its install).
JOBS: dict[str, list[str]] = {"main": ["suites", "--perf-short", "--accuracy-size", "50"],
                              "restart": ["suites", "-m", "restart"]}
BUSY_LOOP = "while True:\n    pass\n"


def start_load(procs: int) -> list[subprocess.Popen[bytes]]:
    """One busy loop per core; each in its own session so stopping it touches nothing else."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(procs)]


def stop_load(load: list[subprocess.Popen[bytes]]) -> None:
    for proc in load:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def junit_cases(junit: Path) -> tuple[int, list[str], float]:
    """(tests run, ids of the failed or errored ones, summed test time) from a JUnit XML file."""
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    bad = [f"{c.get('classname')}::{c.get('name')}" for c in cases if _problem(c) is not None]
    return len(cases), bad, sum(float(c.get("time") or 0) for c in cases)


def _problem(case: ET.Element) -> ET.Element | None:
    return case.find("failure") if case.find("failure") is not None else case.find("error")


def failure_lines(junit: Path, width: int = 300) -> list[str]:
    """``id: first line of the message`` of each failed test, so a flake says what went wrong."""
    out = []
    for c in ET.parse(junit).getroot().iter("testcase"):
        bad = _problem(c)
        if bad is not None:
            first = (bad.get("message") or bad.text or "").strip().splitlines()[:1]
            out.append(f"{c.get('classname')}::{c.get('name')}: {(first[0] if first else '')[:width]}")
    return out


def choices(p: argparse.ArgumentParser, flag: str, raw: str, known: Iterable[str]) -> list[str]:
    """A comma-separated option's items, each one of ``known`` (else the parser's one-line error)."""
    items, known = [x.strip() for x in raw.split(",") if x.strip()], list(known)
    unknown = [x for x in items if x not in known]
    if unknown:
        p.error(f"{flag}: unknown {unknown}; known: {', '.join(known)}")
    return items


def require_venv(p: argparse.ArgumentParser) -> None:
    if not PYTHON.exists():
        p.error(f"{PYTHON} is missing: run scripts/install.sh first")


def run_job(job: str, target: str, work: Path, timeout: float) -> tuple[int, list[str], float, str]:
    """(tests, failed ids, wall seconds, note) of one pytest run; a crash or timeout counts as a failure."""
    junit = work / f"{target}-{job}.xml"
    argv = [str(PYTHON), "-m", "pytest", *JOBS[job], "--target", target, "--sim", "-q", "-p", "no:randomly",
            "--ml4-reports", str(work / "reports"), "--junitxml", str(junit)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 0, [f"{target} {job}: timed out after {timeout:.0f} s"], time.monotonic() - t0, "timeout"
    wall = time.monotonic() - t0
    if not junit.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        return 0, [f"{target} {job}: no results (exit {proc.returncode}): {' | '.join(tail)}"], wall, "crash"
    tests, bad, _ = junit_cases(junit)
    for line in failure_lines(junit):
        print(f"    FAILED {line}", flush=True)
    if bad:
        # Kept for reading: the run's reports folder is in the same work directory (see --keep).
        junit.rename(junit.with_name(f"{junit.stem}-{time.time_ns()}.xml"))
    else:
        junit.unlink()
    return tests, bad, wall, f"exit {proc.returncode}"


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--targets", default="rtxpro6000-tp8,gb300-disagg")
    p.add_argument("--jobs", default="main,restart", help=f"comma-separated from {', '.join(JOBS)}")
    p.add_argument("--load-procs", type=int, default=os.cpu_count() or 2, help="busy loops (0: no load)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per pytest run")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--keep", type=Path, default=None, help="work folder kept afterwards (reports, failed JUnit)")
    args = p.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    jobs = choices(p, "--jobs", args.jobs, JOBS)
    require_venv(p)

    failures: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    walls: dict[str, list[float]] = {}
    # A SIGTERM (kill, a CI timeout) must still stop the busy loops, which live in their own sessions.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    load = start_load(args.load_procs)
    try:
        with tempfile.TemporaryDirectory(prefix="ml4-flake-") as scratch:
            tmp = str(args.keep or scratch)
            Path(tmp).mkdir(parents=True, exist_ok=True)
            for n in range(1, args.runs + 1):
                for target in targets:
                    for job in jobs:
                        key = f"{target} {job}"
                        tests, bad, wall, note = run_job(job, target, Path(tmp), args.timeout)
                        runs[key] += 1
                        walls.setdefault(key, []).append(wall)
                        failures.update(f"{key}: {b}" for b in bad)
                        print(f"run {n}/{args.runs} {key}: {tests} tests, {len(bad)} failed, {wall:.0f} s ({note})",
                              flush=True)
    finally:
        stop_load(load)

    print(f"\nfailures per test ({args.runs} runs, {args.load_procs} busy loops on {os.cpu_count()} cores):")
    for name, count in sorted(failures.items()):
        key = name.split(":", 1)[0]
        print(f"  {count}/{runs[key]}  {name}")
    for key in runs:
        print(f"  {key}: {sum(c for n, c in failures.items() if n.startswith(key + ':'))} failures in {runs[key]} "
              f"runs, wall {min(walls[key]):.0f}-{max(walls[key]):.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"runs": dict(runs), "failures": dict(failures), "wall_s": walls,
                                         "load_procs": args.load_procs, "cpus": os.cpu_count()}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
