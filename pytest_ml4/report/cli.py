"""``ml4-report``: turn run folders into release sign-off reports and check nightly runs for regressions.

    ml4-report generate RUN_DIR [--render]   single-file Allure 2 HTML at RUN_DIR/allure-report/index.html
    ml4-report compare [--runs reports/]     latest run vs previous and vs baseline; trend PNG; exit 1 on regression
    ml4-report latest [--runs reports/]      print the newest run folder (for CI scripts)
    ml4-report scan PATH... [--secret-env V] fail (exit 1) when any file holds a secret
    ml4-report verdict [RUN]                 the run's verdict lines (per area, overall); exits as the run did

Everything runs offline: the Allure CLI and Chromium are local installs (scripts/install.d/30-allure.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_ml4.perf.baseline import Baseline
from pytest_ml4.report.compare import (
    compare_runs,
    format_table,
    trend_png,
)
from pytest_ml4.report.history import (
    REPORT_DIRNAME,
    RESULTS_DIRNAME,
    previous_run,
)
from pytest_ml4.report.redact import DEFAULT as REDACTOR
from pytest_ml4.report.redact import Redactor, register_secret_env
from pytest_ml4.report.summary import (
    load_summary,
    run_target,
    runs_in,
    stored_runs,
    verdict_lines_of,
)
from pytest_ml4.runtime.installed import ToolMissing
from pytest_ml4.target.baselines import BaselineRefused
from pytest_ml4.target.model import TargetError, load_target

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ml4-report", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate the single-file Allure 2 HTML report of a run folder")
    g.add_argument("run_dir", type=Path)
    g.add_argument("--results", type=Path, help="Allure results (default RUN_DIR/allure-results)")
    g.add_argument("-o", "--output", type=Path, help="report folder (default RUN_DIR/allure-report)")
    g.add_argument("--previous", type=Path,
                   help="previous report whose history feeds the trend (default: newest earlier run of the target)")
    g.add_argument("--name", default=None, help="report title (default: pytest-ml4 <target> release sign-off)")
    g.add_argument("--render", action="store_true",
                   help="also open it in headless Chromium and save screenshots into RUN_DIR")

    c = sub.add_parser("compare", help="compare the latest run with the previous one and the baseline")
    c.add_argument("--runs", type=Path, default=Path("reports"), help="folder holding the run folders")
    c.add_argument("--target", help="compare runs of this target (default: the latest run's)")
    c.add_argument("--baseline", help="baseline file, or 'none' (default: the target's perf.baseline)")
    c.add_argument("--tolerance", type=float, help="relative tolerance (default: the target's gates.perf_tolerance)")
    c.add_argument("--png", type=Path, help="trend image (default: <latest run>/trend.png)")

    la = sub.add_parser("latest", help="print the newest run folder (for CI scripts)")
    la.add_argument("--runs", type=Path, default=Path("reports"), help="folder holding the run folders")
    la.add_argument("--target", help="only runs of this target")

    v = sub.add_parser("verdict", help="print a run's verdict lines and exit with the run's exit status")
    v.add_argument("run", nargs="?", type=Path, help="run folder or its summary.json (default: the newest under --runs)")
    v.add_argument("--runs", type=Path, default=Path("reports"), help="folder holding the run folders")
    v.add_argument("--target", help="the newest run of this target (without RUN)")

    s = sub.add_parser("scan", help="fail when any file holds an API key or bearer token")
    s.add_argument("paths", nargs="+", type=Path)
    s.add_argument("--secret-env", action="append", default=[], help="env var holding a secret (repeatable)")
    return p


def cmd_generate(args: argparse.Namespace) -> int:
    from pytest_ml4.report.html import ReportError, generate_report, render_report

    run_dir = args.run_dir.resolve()
    results = args.results or run_dir / RESULTS_DIRNAME
    out = args.output or run_dir / REPORT_DIRNAME
    previous = args.previous
    if previous is None:
        prev_run = previous_run(run_dir)
        previous = prev_run / REPORT_DIRNAME if prev_run else None
    name = args.name or f"pytest-ml4 {run_target(run_dir) or ''} release sign-off".replace("  ", " ")
    try:
        index = generate_report(results, out, name=name, previous_report=previous)
        print(f"report: {index}" + (f" (history from {previous})" if previous else ""))
        if args.render:
            shown = render_report(index, run_dir)
            # What the browser showed, kept beside the screenshots for CI logs and tests.
            seen = {"overview_text": shown.overview_text, "tree_names": shown.tree_names,
                    "screenshots": [str(p) for p in shown.screenshots]}
            (run_dir / "report-render.json").write_text(json.dumps(seen, indent=2), encoding="utf-8")
            print(f"rendered: {len(shown.tree_names)} tree entries; screenshots: "
                  + ", ".join(str(p) for p in shown.screenshots))
    except (ReportError, ToolMissing) as err:
        print(f"ml4-report generate: {err}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    runs = stored_runs(args.runs, args.target)
    if not runs:
        print(f"ml4-report compare: no run summaries under {args.runs}"
              + (f" for target {args.target}" if args.target else ""), file=sys.stderr)
        return EXIT_USAGE
    target_name = args.target or runs[-1].get("target")
    if args.target is None:
        runs = [r for r in runs if r.get("target") == target_name]
    target = None
    try:
        target = load_target(target_name) if target_name else None
    except TargetError:
        pass  # a run of an ad-hoc target file: compare without its defaults
    tolerance = args.tolerance if args.tolerance is not None else (
        target.gates.perf_tolerance if target is not None else 0.10)
    baseline = None
    if args.baseline != "none":
        path = Path(args.baseline) if args.baseline else (
            target.resolve(target.perf.baseline) if target is not None and target.perf.baseline else None)
        if path is not None:
            if not path.is_file():
                print(f"ml4-report compare: baseline {path} not found", file=sys.stderr)
                return EXIT_USAGE
            try:
                baseline = Baseline.load(path)
            except BaselineRefused as err:
                print(f"ml4-report compare: {err}", file=sys.stderr)
                return EXIT_USAGE
    comp = compare_runs(runs, baseline, tolerance)
    if comp.previous is None and comp.baseline is None:
        # A first run is not an error: the next one has this one to compare with.
        print(f"ml4-report compare: first run: {comp.latest} of target {target_name} has no earlier run with "
              f"results under {args.runs} and no baseline; nothing to compare yet")
        return EXIT_OK
    print(format_table(comp))
    png = args.png or args.runs / runs[-1]["run_id"] / "trend.png"
    drawn = trend_png(runs, png, baseline)
    print(f"trend: {drawn}" if drawn else "trend: no perf figures in the stored runs")
    return EXIT_REGRESSION if comp.regressions else EXIT_OK


def cmd_scan(args: argparse.Namespace) -> int:
    from pytest_ml4.report.scan import scan_paths

    register_secret_env(*args.secret_env)
    redactor: Redactor = REDACTOR
    leaks = scan_paths(args.paths, redactor)
    for leak in leaks:
        print(leak)
    print(f"{len(leaks)} leak(s) in {', '.join(map(str, args.paths))}")
    return EXIT_REGRESSION if leaks else EXIT_OK


def cmd_verdict(args: argparse.Namespace) -> int:
    run = args.run
    if run is None:
        runs = runs_in(args.runs, args.target, with_results=True)
        if not runs:
            print(f"ml4-report verdict: no run folder with results under {args.runs}", file=sys.stderr)
            return EXIT_USAGE
        run = runs[-1]
    try:
        doc = load_summary(run)
    except (OSError, ValueError) as err:
        print(f"ml4-report verdict: {run}: no readable summary.json ({err})", file=sys.stderr)
        return EXIT_USAGE
    print(f"ml4 verdict of {doc.get('run_id')} (target {doc.get('target')})")
    for line in verdict_lines_of(doc):
        print(line)
    return int(doc.get("exit_status", EXIT_USAGE))


def cmd_latest(args: argparse.Namespace) -> int:
    runs = runs_in(args.runs, args.target, with_results=True)
    if not runs:
        print(f"ml4-report latest: no run folder with results under {args.runs}", file=sys.stderr)
        return EXIT_USAGE
    print(runs[-1])
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {"generate": cmd_generate, "compare": cmd_compare, "scan": cmd_scan, "latest": cmd_latest,
               "verdict": cmd_verdict}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
