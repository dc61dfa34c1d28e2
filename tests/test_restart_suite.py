"""suites/test_restart.py end to end: through a real LiteLLM proxy with retries it passes; with the proxy's retries
off the no-client-error test fails and quotes the proxy's error body."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkout import REPO_ROOT

SUITE = REPO_ROOT / "suites" / "test_restart.py"


def run_suite(pytester: pytest.Pytester, tmp_path: Path, *extra: str, target: str = "rtxpro6000-tp8",
              timeout: float = 400) -> pytest.RunResult:
    # ML4_TOOLS (the LiteLLM venv) reaches the child through tests/conftest.py, set before pytester moves HOME.
    return pytester.runpytest_subprocess(
        str(SUITE), "--target", target, "--sim", "-m", "restart", "--ml4-reports", str(tmp_path / "r"),
        "-p", "no:randomly", "-rA", *extra, timeout=timeout)


def test_rtxpro_suite_passes_through_the_proxy_with_retries(pytester: pytest.Pytester, tmp_path: Path) -> None:
    # The target's own 3 retries: the simulated outage is the target's modelled figure (sim.restart_outage_s), not
    # the machine's speed, so they bridge it on a busy CI box too.
    result = run_suite(pytester, tmp_path)
    out = result.stdout.str()
    result.assert_outcomes(passed=6, skipped=5)   # 5: the Dynamo-only and disagg-only checks
    # The requests crossed the outage and the proxy retried them.
    assert "x-litellm-attempted-retries total 0" not in out, out[-3000:]
    assert "in-flight streams during the restart:" in out


def test_proxy_without_retries_fails_the_no_client_error_check(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result = run_suite(pytester, tmp_path, "--ml4-proxy-retries", "0", "-k", "new_requests")
    out = result.stdout.str()
    result.assert_outcomes(failed=1, deselected=10)
    assert "FAILED" in out and "test_new_requests_during_restart" in out
    assert "allows no client-visible error during a restart" in out
    assert "litellm.InternalServerError" in out and "Cannot connect to host" in out
    assert "exceeded the proxy's retry window of 0.0 s" in out and "num_retries=0" in out


def test_gb300_disagg_suite_passes_against_the_fake_api_server(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result = run_suite(pytester, tmp_path, target="gb300-disagg", timeout=600)
    out = result.stdout.str()
    result.assert_outcomes(passed=11)   # with the worker crash under a stream
    assert "rolling, one pod at a time" in out  # restarted through the Kubernetes API (fake server), pod by pod
    assert "session pinned to worker" in out and "prefilled on instance" in out
    assert "model left /v1/models after" in out
