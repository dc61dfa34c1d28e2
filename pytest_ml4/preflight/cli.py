"""``ml4-preflight PATH...``: print preflight findings for config files; exit 1 on errors, 2 on bad usage.

Without known hardware every rule that does not depend on it still runs; the others are listed as not applied
with the flag that would apply them (``--target NAME``), and do not change the exit status.

Paths may be files or directories (searched for .yaml/.yml/.service/.sh/.cmd/.conf).  Each file is tied to
its hardware through ``--target``, through the target whose ``manifests:`` list names it, or through a
``# ml4-target: NAME`` comment in the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pytest_ml4.preflight.applied import grouped
from pytest_ml4.preflight.lint import lint_paths
from pytest_ml4.preflight.model import Severity, relpath
from pytest_ml4.preflight.rules import RULES
from pytest_ml4.target.model import TargetError, load_target

_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ml4-preflight", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="*", help="config files or directories")
    p.add_argument("--target", help="target name or YAML path the configs deploy (sets the hardware)")
    p.add_argument("--rule", action="append", default=[], help="run only this rule id (repeatable)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--list-rules", action="store_true", help="print the rules with their sources and exit")
    p.add_argument("--quiet", action="store_true", help="errors only")
    p.add_argument("--verbose", action="store_true", help="also list each document and the hardware it maps to")
    p.add_argument("--access", action="store_true",
                   help="with --target: list each access the suites need (endpoint URL, API key, worker metrics, "
                        "logs, restart rights), set or missing, reachable or not, and what each enables; exit 1 when "
                        "one a suite needs is missing or not reachable")
    p.add_argument("--suites", default=None, metavar="S,S",
                   help="--access: only these suites (markers, comma-separated; default: all)")
    return p


def _access(target_name: str | None, suites: str | None) -> int:
    """``--access``: one line per access, then which suites cannot be judged (pytest_ml4/target/access.py)."""
    from pytest_ml4.target.access import blocking, needs_table, survey

    if not target_name:
        print("ml4-preflight: --access needs --target NAME", file=sys.stderr)
        return 2
    known = list(needs_table().suites)
    chosen = [s.strip() for s in suites.split(",") if s.strip()] if suites else known
    unknown = [s for s in chosen if s not in known]
    if unknown:
        print(f"ml4-preflight: --suites: unknown suite(s) {', '.join(unknown)}; known: {', '.join(known)}",
              file=sys.stderr)
        return 2
    try:
        target = load_target(target_name)
    except TargetError as err:
        print(f"ml4-preflight: {err}", file=sys.stderr)
        return 2
    accesses = survey(target, chosen)
    print(f"ml4-preflight: access of target {target.name} for {', '.join(chosen)} (probes connect within 2 s)")
    for a in accesses:
        print(f"  {a.line()}")
    stuck: dict[str, list[str]] = {}
    for suite in chosen:
        access = blocking(accesses, suite)
        if access is not None:
            stuck.setdefault(access.why_not_judged(), []).append(suite)
    for why, names in stuck.items():
        print(f"ml4-preflight: {', '.join(names)} cannot be judged: {why}")
    if not stuck:
        print(f"ml4-preflight: every access the {len(chosen)} suite(s) need is set and reachable")
    return 1 if stuck else 0


def _list_rules() -> None:
    for r in RULES.values():
        print(f"{r.id} [{r.severity.value}] ({', '.join(r.kinds)})\n    {r.message}\n    fix: {r.fix}\n"
              f"    source: {r.source}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_rules:
        _list_rules()
        return 0
    if args.access:
        return _access(args.target, args.suites)
    if not args.paths:
        print("ml4-preflight: give at least one PATH (or --list-rules)", file=sys.stderr)
        return 2
    unknown = [r for r in args.rule if r not in RULES]
    if unknown:
        print(f"ml4-preflight: unknown rule(s) {', '.join(unknown)}; see --list-rules", file=sys.stderr)
        return 2
    try:
        target = load_target(args.target) if args.target else None
        report = lint_paths(args.paths, target, [RULES[r] for r in args.rule] or None)
    except (TargetError, FileNotFoundError) as err:
        print(f"ml4-preflight: {err}", file=sys.stderr)
        return 2
    seen = {d.path for d in report.documents}
    for raw in args.paths:
        # A file named on the command line that holds nothing lintable is worth a note (a typo'd kind:, say).
        if Path(raw).is_file() and relpath(Path(raw)) not in seen:
            print(f"ml4-preflight: note: no vLLM launch, DGD, LiteLLM config or aiperf run found in {raw}",
                  file=sys.stderr)
    findings = sorted(report.findings, key=lambda f: (_ORDER[f.severity], f.path, f.line or 0, f.rule_id))
    if args.quiet:
        findings = [f for f in findings if f.severity is Severity.ERROR]
    if args.format == "json":
        print(json.dumps({"documents": len(report.documents), "findings": [f.as_dict() for f in findings],
                          "not_applied": [n.as_dict() for n in report.not_applied]}, indent=2))
    else:
        if args.verbose:
            for d in report.documents:
                print(f"{d.path}: {d.kind} on {d.hardware.family or 'unknown hardware'} ({d.hardware.origin})")
        for f in findings:
            print(f.format())
        if not args.quiet:
            # Rules that could not judge (some) files are said so, never silently counted as passes.
            for line in grouped(report.not_applied):
                print(f"ml4-preflight: {line}")
        n_err = len(report.errors())
        n_warn = sum(1 for f in report.findings if f.severity is Severity.WARNING)
        partly = sum(1 for n in report.not_applied if n.judged)
        some = f" ({partly} not to every file)" if partly else ""
        print(f"ml4-preflight: {len(report.documents)} document(s), {len(report.applied())} of {len(report.rules)} "
              f"rule(s) applied{some}: {n_err} error(s), {n_warn} warning(s)")
    return 1 if report.errors() else 0


if __name__ == "__main__":
    sys.exit(main())
