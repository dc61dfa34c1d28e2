"""``--collect-only`` runs nothing, so it leaves no run folder behind: ``ml4-report latest``
would otherwise name an empty run and ``ml4-report generate`` fail on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]


# --sim too: a collect-only run starts no simulator (none would be used), so it makes no folder for its log.
@pytest.mark.parametrize("extra", [["--sim"], ["-n", "2"]], ids=["sim", "xdist"])
def test_collect_only_leaves_no_run_folder(tmp_path: Path, extra: list[str]) -> None:
    reports = tmp_path / "reports"
    proc = subprocess.run([*PYTEST, f"--ml4-reports={reports}", "--target", "rtxpro6000-tp8", "--collect-only",
                           "-q", *extra, "suites/test_smoke.py"], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTEST_ADDOPTS="", LLM_API_KEY="sk-not-used"), timeout=180,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "test_health" in proc.stdout, "the tests were collected"
    assert not reports.exists() or not any(reports.iterdir()), f"run folder left: {list(reports.iterdir())}"


def test_control_a_run_makes_its_folder(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    proc = subprocess.run([*PYTEST, f"--ml4-reports={reports}", "--target", "rtxpro6000-tp8", "-m", "preflight",
                           "suites/test_preflight.py", "-q"], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTEST_ADDOPTS=""), timeout=180, check=False)
    assert [p.name for p in reports.iterdir()], proc.stdout[-3000:]
