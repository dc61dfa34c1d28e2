"""Where the report's external tools are: the Allure 2 CLI, Java and Chromium (``scripts/install.d/30-allure.sh``).

Paths only; nothing here installs anything. A missing tool raises :class:`pytest_ml4.tools.ToolMissing` whose
message says which install step provides it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pytest_ml4.tools import ToolMissing, tools_dir

ALLURE_VERSION = os.environ.get("ML4_ALLURE_VERSION", "2.46.1")
_INSTALL_HINT = "run scripts/install.sh (or bash scripts/install.d/30-allure.sh)"


def allure_home() -> Path:
    """Folder the install step gave to ``npm install --prefix`` for ``allure-commandline``."""
    return tools_dir() / f"allure-{ALLURE_VERSION}"


def allure_executable(required: bool = True) -> Path:
    """The Allure 2 CLI launcher (a shell script that starts the bundled jars with ``java``)."""
    exe = allure_home() / "node_modules" / ".bin" / "allure"
    if required and not exe.exists():
        raise ToolMissing(f"Allure {ALLURE_VERSION} CLI not found at {exe}; {_INSTALL_HINT}")
    return exe


def java_executable(required: bool = True) -> Path | None:
    """``java`` from ``JAVA_HOME`` or ``PATH`` (the Allure 2 CLI needs it; 17 is known to work)."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home and (Path(home) / "bin" / "java").exists() else None
    found = found or (Path(p) if (p := shutil.which("java")) else None)
    if found is None and required:
        raise ToolMissing(f"java not found (the Allure 2 CLI needs it); {_INSTALL_HINT}")
    return found


def chromium_executable(required: bool = True) -> Path | None:
    """Debian's ``chromium`` (or ``ML4_CHROMIUM``), used headless to render and screenshot reports."""
    override = os.environ.get("ML4_CHROMIUM")
    candidates = [override] if override else ["chromium", "chromium-browser", "google-chrome"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return Path(path)
    if required:
        raise ToolMissing(f"chromium not found; {_INSTALL_HINT}")
    return None
