"""Restart through a real LiteLLM proxy: with retries clients see no error; without, the check fails quoting the
proxy's error body (tooling.md §3.5-3.6; seed 000 open item 2)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.litellm import LiteLLMProxy
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.checks.restart import assert_client_errors_as_allowed
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.control import SimController
from pytest_ml4.control.scenario import RestartRun, retries_seen, run_restart_scenario
from pytest_ml4.stacks.litellm import ProxySettings, RetryWindow
from pytest_ml4.target.model import load_target

TARGET = load_target("rtxpro6000-tp8")
KEY_ENV = TARGET.endpoint.api_key_env or "LLM_API_KEY"


@pytest.fixture(scope="module")
def key(rtx_api_key: str) -> str:
    return rtx_api_key


@pytest.fixture(scope="module")
def sim(key: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    with SimServer(TARGET, log_file=tmp_path_factory.mktemp("sim") / "engine.log") as server:
        yield server


def _restart_through(sim: SimServer, key: str, num_retries: int | None, work: Path) -> tuple[RestartRun, RetryWindow]:
    settings = ProxySettings.from_target(TARGET, sim.base_url, num_retries=num_retries)
    with LiteLLMProxy(settings, work) as proxy:
        ep = Endpoint(base_url=proxy.base_url, api_key=key, model="ml4", proxy=True)
        ctl = SimController(sim, "ml4", api_key=key, timeout_s=60)
        run = run_restart_scenario(ctl, ep, with_streams=False, recovery_limit_s=60)
    return run, RetryWindow.from_settings(settings)


def test_without_retries_the_no_client_error_check_fails_with_the_proxy_error(sim: SimServer, key: str,
                                                                              tmp_path: Path) -> None:
    run, window = _restart_through(sim, key, 0, tmp_path)
    assert run.restart is not None, run.report()
    with pytest.raises(AssertionError) as err:
        assert_client_errors_as_allowed(run, allowed=False, retry_window=window)
    message = str(err.value)
    # The outage as the engines lived it, beside what no retries bridge.
    assert "measured outage" in message and "exceeded the proxy's retry window of 0.0 s" in message
    # LiteLLM's own body for a dead backend (tooling.md §3.6): HTTP 500, internal_server_error, no retry header.
    assert "first failure: HTTP 500" in message
    assert "litellm.InternalServerError" in message and "Cannot connect to host" in message
    assert "restart_client_errors_allowed" in message
    assert all(r.retries is None for r in run.requests if not r.ok)
    assert key not in message
    # A target that tolerates client errors during a restart accepts the same run.
    assert assert_client_errors_as_allowed(run, allowed=True, retry_window=window)


def test_with_the_targets_retries_every_request_succeeds_and_retries_are_counted(sim: SimServer, key: str,
                                                                                 tmp_path: Path) -> None:
    # The target's own 3 retries (attempts at +0, +0.5, +1.5, +3.5 s) bridge its modelled outage
    # (sim.restart_outage_s) however busy the machine is: the simulator prepares the next engine before the port
    # closes (3 of 21 requests once failed when the box's speed set the outage).
    run, window = _restart_through(sim, key, None, tmp_path)
    assert run.restart is not None, run.report()
    assert window.num_retries == TARGET.serving.proxy.num_retries  # type: ignore[union-attr]
    assert TARGET.sim.restart_outage_s < window.bridged_s
    assert assert_client_errors_as_allowed(run, allowed=False, retry_window=window) == []
    assert retries_seen(run) > 0, run.report()
