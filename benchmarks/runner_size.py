"""How big is the slim runner (examples/runner/Dockerfile) without building it?  The disk its two installs take.

    python benchmarks/runner_size.py [--aiperf]

Copies what a wheel is built from (``pyproject.toml``, ``setup.py``, ``README.md``, ``pytest_ml4/``, ``suites/``)
into a temporary folder, makes a fresh venv there and ``pip install``s the copy with its dependencies (not
editable: what the image's ``pip install /src`` does), then prints ``du -sm`` of that venv. With ``--aiperf`` it
also runs ``scripts/install.d/10-aiperf.sh`` with ``ML4_TOOLS`` in the same temporary folder (about 2.5 min, 1.2 GB
downloaded from pip's configured index) and prints the size of aiperf's venv and the tiktoken cache; without it,
it prints those of ``$ML4_TOOLS`` (default ``~/.cache/pytest-ml4``) when ``scripts/install.sh`` has put them there.
The base image (python:3.11-slim-bookworm) and the optional Allure step's Java and Chromium are not counted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "setup.py", "README.md", "pytest_ml4", "suites")
AIPERF = ("aiperf-0.13.0", "tiktoken-cache")


def megabytes(path: Path) -> int:
    """``du -sm PATH``: the disk the folder takes, in MiB."""
    return int(subprocess.run(["du", "-sm", str(path)], check=True, capture_output=True, text=True).stdout.split()[0])


def package_venv(where: Path) -> Path:
    """A fresh venv with a copy of the package pip-installed into it, dependencies included."""
    src = where / "src"
    src.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, src / name)
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-cache-dir", str(src)], check=True)
    return venv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aiperf", action="store_true", help="install aiperf too (10-aiperf.sh) instead of reading "
                                                              "the sizes of $ML4_TOOLS")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ml4-runner-size-") as tmp:
        where = Path(tmp)
        sizes = {"package venv (pip install, with dependencies)": megabytes(package_venv(where))}
        tools = where / "tools" if args.aiperf else Path(os.environ.get("ML4_TOOLS") or Path.home() / ".cache" /
                                                            "pytest-ml4")
        if args.aiperf:
            env = dict(os.environ, ML4_TOOLS=str(tools), PYTHON=sys.executable)
            subprocess.run(["bash", str(REPO / "scripts" / "install.d" / "10-aiperf.sh")], env=env, check=True)
        for name in AIPERF:
            if (tools / name).is_dir():
                sizes[f"{name} ({tools / name})"] = megabytes(tools / name)
    for what, mib in sizes.items():
        print(f"{mib:>6} MiB  {what}")
    print(f"{sum(sizes.values()):>6} MiB  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
