"""Prints what Allure 2 (the report the project renders) and Allure 3 (npm ``allure``) cost on the same results.

Installs Allure 3 into a scratch folder with npm (network needed once), then generates a report of the given Allure
results folder with each and prints install size, install time and generation time; Allure 2 is the copy
``scripts/install.d/30-allure.sh`` installed, with the Java runtime it needs measured beside it. Usage:
    python benchmarks/allure_2_vs_3.py RUN_DIR/allure-results [--allure3 3.18.0] [--scratch /tmp/ml4-allure3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

from pytest_ml4.runtime.installed import allure_executable, allure_home, java_executable


def _size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def _timed(cmd: list[str], **kw: object) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, **kw)  # type: ignore[call-overload]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--allure3", default="3.18.0", help="npm allure version")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/ml4-allure3"))
    args = ap.parse_args()
    results = args.results.resolve()
    args.scratch.mkdir(parents=True, exist_ok=True)
    install_s = _timed(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", f"allure@{args.allure3}"],
                       cwd=args.scratch)
    a3 = args.scratch / "node_modules" / ".bin" / "allure"
    gen3 = _timed([str(a3), "generate", str(results), "-o", str(args.scratch / "report")])
    a2 = allure_executable()
    out2 = args.scratch / "report2"
    gen2 = _timed([str(a2), "generate", str(results), "-o", str(out2), "--clean", "--single-file"],
                  env={**os.environ, "ALLURE_NO_ANALYTICS": "true"})
    java = java_executable(required=False)
    jre = java.resolve().parents[1] if java else None
    print(f"Allure 3 {args.allure3}: node_modules {_size_mb(args.scratch / 'node_modules'):.0f} MB, install "
          f"{install_s:.1f} s, generate {gen3:.1f} s, no Java")
    print(f"Allure 2 ({a2}): package {_size_mb(allure_home()):.0f} MB + Java runtime "
          f"{_size_mb(jre) if jre else float('nan'):.0f} MB, generate {gen2:.1f} s")


if __name__ == "__main__":
    main()
