"""Shared fixtures for the plugin's own tests: pytester, and paths into the repository."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
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


@pytest.fixture
def smoke_copy(pytester: pytest.Pytester) -> None:
    """``suites/test_smoke.py`` copied into the pytester folder, to run as ``suites/test_smoke.py`` there."""
    (pytester.path / "suites").mkdir()
    (pytester.path / "suites" / "test_smoke.py").write_text((REPO / "suites" / "test_smoke.py").read_text())


@pytest.fixture(scope="module")
def rtx_api_key() -> Iterator[str]:
    """A fresh API key in the RTX PRO target's key variable for one module (restored afterwards)."""
    from pytest_ml4.targets import load_target

    var = load_target("rtxpro6000-tp8").endpoint.api_key_env or "LLM_API_KEY"
    old = os.environ.get(var)
    os.environ[var] = value = "sk-test-" + secrets.token_hex(12)
    yield value
    if old is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = old
