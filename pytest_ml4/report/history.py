"""Allure history across runs, so the report's Trend widget and each test's History tab span nightly runs.

Allure 2 reads ``<results>/history/*.json`` (written by the previous report) when generating. A single-file
report has no ``history/`` folder; its files are embedded as ``d('history/NAME','BASE64')`` calls in
``index.html``, so :func:`extract_history` reads either form.

Run folders sit side by side under one reports root (``<root>/<stamp>-<target>-<hex>/``, chosen by the plugin;
:func:`pytest_ml4.report.summary.runs_in` lists them); :func:`previous_run` finds the newest earlier run of the same
target that has a report.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

from pytest_ml4.report.summary import run_order, run_target, runs_in

REPORT_DIRNAME = "allure-report"
RESULTS_DIRNAME = "allure-results"

_EMBEDDED_RE = re.compile(r"d\('history/([A-Za-z0-9_.-]+\.json)','([A-Za-z0-9+/=]*)'\)")


def extract_history(report_dir: Path) -> dict[str, bytes]:
    """History files of a generated report (folder form or single-file form); empty when there are none."""
    folder = report_dir / "history"
    if folder.is_dir():
        return {p.name: p.read_bytes() for p in sorted(folder.glob("*.json"))}
    index = report_dir / "index.html"
    if not index.is_file():
        return {}
    html = index.read_text(encoding="utf-8", errors="replace")
    return {name: base64.b64decode(data) for name, data in _EMBEDDED_RE.findall(html)}


def seed_history(results_dir: Path, previous_report: Path | None) -> list[str]:
    """Copy the previous report's history into ``results_dir/history``; returns the file names copied."""
    if previous_report is None:
        return []
    files = extract_history(previous_report)
    if not files:
        return []
    dest = results_dir / "history"
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (dest / name).write_bytes(data)
    return sorted(files)


def previous_run(run_dir: Path, *, with_report: bool = True) -> Path | None:
    """The newest run before ``run_dir`` of the same target (having a generated report when ``with_report``)."""
    run_dir = run_dir.resolve()
    target = run_target(run_dir)
    me = run_order(run_dir)
    earlier = [p for p in runs_in(run_dir.parent) if run_order(p) < me and p.resolve() != run_dir]
    for cand in reversed(earlier):
        if target is not None and run_target(cand) != target:
            continue
        if with_report and not (cand / REPORT_DIRNAME / "index.html").is_file():
            continue
        return cand
    return None
