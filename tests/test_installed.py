"""The suite installed by pip (not editable, not this checkout) runs a platform team's own target from its own
repository: the package finds its data, its bundled suites and the team's ``targets/`` without a checkout.

Nothing is downloaded: the checkout's package sources (without ``fixtures/``, ``tests/`` or ``.git``: what a
wheel may need is there or nowhere) are installed with ``--no-deps`` (its build backend from pip's configured
index, as ``scripts/install.sh`` gets it) and the dependencies are this venv's, made visible by a ``.pth`` file.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from checkout import REPO_ROOT

from pytest_ml4.locations import BUNDLED_TARGETS_DIR

TEAM_TARGET = "team-rtx"


def _fresh_venv(where: Path) -> Path:
    """A venv of its own (no system site-packages) whose only pytest_ml4 is the one pip installs into it."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    # Appended after the venv's own site-packages: the installed pytest_ml4 wins over this venv's editable one
    # (whose finder a plain path line does not activate).
    Path(purelib, "ml4-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def _package_sources(where: Path) -> Path:
    """A copy of what building the package reads, so the build writes nothing into the checkout."""
    src = where / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("pytest_ml4", "suites"):
        shutil.copytree(REPO_ROOT / folder, src / folder, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    return src


def _team_repository(where: Path) -> Path:
    """A team's repository: one target of its own (the RTX PRO seed's, renamed), nothing else."""
    team = where / "team"
    (team / "targets").mkdir(parents=True)
    data = yaml.safe_load((BUNDLED_TARGETS_DIR / "rtxpro6000-tp8.yaml").read_text())
    data["name"] = TEAM_TARGET
    (team / "targets" / f"{TEAM_TARGET}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return team


@pytest.mark.nightly
def test_the_pip_installed_suite_runs_a_teams_own_target_from_its_repository(tmp_path: Path) -> None:
    """Caught: the package found its tables, targets and suites only through the checkout (``REPO_ROOT``).
    Nightly: it takes about two minutes on two busy cores (a wheel build, an install, LiteLLM and the simulator
    starting), over CI's budget for one test."""
    python = _fresh_venv(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "ML4_TARGET")}
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--quiet",
                              str(_package_sources(tmp_path))],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    where = subprocess.run([str(python), "-c", "import pytest_ml4.locations as l; print(l.PACKAGE_DIR)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    package = Path(where.stdout.strip())
    assert package.is_relative_to(tmp_path / "venv") and (package / "suites" / "test_smoke.py").is_file(), package

    team = _team_repository(tmp_path)
    run = subprocess.run([str(python), "-m", "pytest", "--target", TEAM_TARGET, "--sim", "-m", "smoke", "-p",
                          "no:cacheprovider", "-v"], env=env, cwd=team, capture_output=True, text=True,
                         timeout=900, check=False)
    out = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, out
    # The team's folder holds no tests: what ran are the suites the installed copy carries.
    assert "test_smoke.py::test_health PASSED" in run.stdout and " failed" not in run.stdout, out
    (summary,) = (team / "reports").glob(f"*-{TEAM_TARGET}-*/summary.json")
    assert json.loads(summary.read_text())["target"] == TEAM_TARGET
