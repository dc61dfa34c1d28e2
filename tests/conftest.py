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


def pytest_configure(config: pytest.Config) -> None:
    # `.ci/run` deselects these (`-m "not nightly"`): proofs too heavy for CI's 2 cores and 30 minutes, run by
    # `scripts/nightly.sh`. Each such test says in its docstring why it is nightly.
    config.addinivalue_line("markers", "nightly: a heavy proof run nightly (scripts/nightly.sh), not in .ci/run")


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


# ---------------------------------------------------------------------------------------- kill-matrix tally
# tests/test_kill_matrix.py records its results as user properties; they reach the xdist controller with each
# report, so the tally is printed once for the whole session (and shows in .ci/run's output).
_KILL_RECORDS: list[dict] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    import json

    for name, value in report.user_properties:
        if str(name).startswith("ml4_killmatrix"):
            _KILL_RECORDS.append(json.loads(value))


def kill_tally(records: list[dict]) -> str | None:
    """``suite checks killed by a fault: N/M (measurements: K)`` over every target the matrix test looked at."""
    kinds = {(r["target"], key): kind for r in records if "checks" in r for key, kind in r["checks"].items()}
    if not kinds:
        return None
    kills: dict[tuple[str, str], list[bool]] = {}
    healthy: dict[tuple[str, str], bool] = {}
    for r in records:
        if "kill" in r:
            kills.setdefault((r["target"], r["check"]), []).append(r["ok"])
        elif "healthy" in r:
            healthy[(r["target"], r["check"])] = r["healthy"]
    gating = [k for k, kind in kinds.items() if kind in ("killed_by", "pending")]
    killed = [k for k in gating if kinds[k] == "killed_by" and kills.get(k) and all(kills[k]) and healthy.get(k)]
    measurements = sum(1 for kind in kinds.values() if kind == "measurement")
    per_target = ", ".join(
        f"{t} {sum(1 for k in killed if k[0] == t)}/{sum(1 for k in gating if k[0] == t)}"
        f" (pending {sum(1 for k in gating if k[0] == t and kinds[k] == 'pending')})"
        for t in sorted({k[0] for k in kinds}))
    return f"suite checks killed by a fault: {len(killed)}/{len(gating)} (measurements: {measurements}) [{per_target}]"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    line = kill_tally(_KILL_RECORDS)
    if line:
        terminalreporter.write_line(line)
