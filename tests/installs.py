"""A fresh venv outside the checkout with the package installed into it, as a platform team installs it.

Nothing is downloaded: a copy of the checkout's package sources (without ``fixtures/``, ``tests/`` or ``.git``: what
a wheel may need is there or nowhere) is installed with ``--no-deps`` (its build backend from pip's configured
index, as ``scripts/install.sh`` gets it) into a fresh venv, and the dependencies are this venv's, made visible by a
``.pth`` file. An install takes a few seconds.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from checkout import REPO_ROOT


def fresh_venv(where: Path) -> Path:
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


def package_sources(where: Path) -> Path:
    """A copy of what building the package reads, so the build writes nothing into the checkout."""
    src = where / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("pytest_ml4", "suites"):
        shutil.copytree(REPO_ROOT / folder, src / folder, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    return src


def _harness_sources(where: Path) -> Path:
    src = where / "harness-src"
    shutil.copytree(REPO_ROOT / "harness", src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return src


def clean_env() -> dict[str, str]:
    """This process's environment without what would point the child at this checkout or preset a target."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "ML4_TARGET", "PYTEST_ADDOPTS")
    return {k: v for k, v in os.environ.items() if k not in drop}


def install(where: Path, *, editable: bool, with_harness: bool = False) -> Path:
    """A fresh venv under ``where`` with the package sources' copy installed into it (and, ``with_harness``, a copy
    of the embedded deployment's distribution ``harness/``); returns its python."""
    python = fresh_venv(where)
    harness = [str(_harness_sources(where))] if with_harness else []
    argv = [str(python), "-m", "pip", "install", "--no-deps", "--quiet",
            *(["-e"] if editable else []), str(package_sources(where)), *harness]
    install = subprocess.run(argv, env=clean_env(), cwd=where, capture_output=True, text=True, timeout=600,
                             check=False)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return python


class Installed:
    """One install: its python, where the package and its suites landed, and how to run pytest with it."""

    def __init__(self, where: Path, kind: str) -> None:
        self.where = where
        self.kind = kind
        self.python = install(where, editable=kind == "editable")
        code = "import pytest_ml4.locations as l; print(l.PACKAGE_DIR); print(l.suites_dir())"
        probe = subprocess.run([str(self.python), "-c", code],
                               env=clean_env(), cwd=where, capture_output=True, text=True, timeout=60, check=True)
        package, suites = probe.stdout.split()
        self.package, self.suites = Path(package), Path(suites)

    def pytest(self, *args: str, cwd: Path, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.command("python", "-m", "pytest", "-p", "no:cacheprovider", *args, cwd=cwd, env=env,
                            timeout=timeout)

    def command(self, script: str, *args: str, cwd: Path, env: dict[str, str] | None = None,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """One of the install's console scripts (``ml4-target``, ``ml4-report``, ...) or its ``python``."""
        return subprocess.run([str(self.python.parent / script), *args], env={**clean_env(), **(env or {})},
                              cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
