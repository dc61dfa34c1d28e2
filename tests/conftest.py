"""Shared fixtures for the plugin's own tests: pytester, and paths into the repository."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from pytest_ml4.tools import tools_dir

pytest_plugins = ["pytester"]

# pytester restores sys.modules after each test; httpx imports httpcore lazily on first use, so a first use
# inside a pytester test would leave later tests with a second copy whose exceptions httpx no longer maps.
httpx.HTTPTransport().close()

# Resolved before pytester moves HOME, so installed tools (aiperf, LiteLLM, the tokenizer cache) stay found in
# every pytester run and subprocess.
os.environ.setdefault("ML4_TOOLS", str(tools_dir()))

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return REPO
