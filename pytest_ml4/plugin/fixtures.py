"""The core fixtures: the target, the run folder, the faults, the ``--sim`` engine and the endpoint with its clients,
and ``ml4``, the one bundle of them the suites ask for (:class:`pytest_ml4.client.deployment.Deployment`).

The deployment itself is ``deploy/``'s (:mod:`pytest_ml4_sim.deploy.embedded`): these fixtures ask the session state
for it and know none of its kinds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_ml4.evidence.worker_engine import WorkerEngine
from pytest_ml4.plugin.state import get_state
from pytest_ml4.target.model import Target, known_targets

if TYPE_CHECKING:  # openai and httpx load only when a test asks for an endpoint (collection stays fast)
    import httpx
    from pytest_ml4_sim.deploy.launcher import (
        Engine,  # the harness: imported only under --sim
    )

    from pytest_ml4.client.deployment import Deployment
    from pytest_ml4.client.endpoint import Endpoint


@pytest.fixture(scope="session")
def ml4_target(pytestconfig: pytest.Config) -> Target:
    state = get_state(pytestconfig)
    if state.target is None:
        raise pytest.UsageError(f"this test needs --target; known targets: "
                                f"{', '.join(known_targets(state.targets_dir))}")
    return state.target


@pytest.fixture(scope="session")
def ml4_run_dir(pytestconfig: pytest.Config) -> Path:
    return get_state(pytestconfig).ensure_run_dir()


@pytest.fixture(scope="session")
def ml4_faults(pytestconfig: pytest.Config) -> tuple[str, ...]:
    return get_state(pytestconfig).faults


@pytest.fixture(scope="session")
def ml4_sim(pytestconfig: pytest.Config, ml4_target: Target) -> Engine | None:
    """The running engine under --sim (controller: the process handle; xdist worker: where it is), else None."""
    state = get_state(pytestconfig)
    if not state.use_sim:
        return None
    return state.start_deployment().engine


@pytest.fixture(scope="session")
def ml4_worker_engine(pytestconfig: pytest.Config, ml4_sim: Engine | None) -> WorkerEngine | None:
    """What real ``dynamo.vllm`` workers serve the run (``--sim-engine vllm`` on a Dynamo target: their releases,
    the declared version's emulation; ``RealDynamoDeployment.info()``), or None (simulated worker, live target)."""
    info = get_state(pytestconfig).description
    return WorkerEngine.of(info.dynamo if info is not None else None)


@pytest.fixture(scope="session")
def ml4_endpoint(pytestconfig: pytest.Config, ml4_target: Target, ml4_sim: Engine | None) -> Endpoint:
    """Where the suites send requests; stops the session in seconds when it is unreachable."""
    return get_state(pytestconfig).endpoint()


@pytest.fixture(scope="session")
def openai_client(ml4_endpoint: Endpoint) -> Iterator[Any]:
    from pytest_ml4.client.endpoint import make_openai

    client = make_openai(ml4_endpoint)
    yield client
    client.close()


@pytest.fixture
def async_openai_client(ml4_endpoint: Endpoint) -> Any:
    """Function-scoped: an async client's connections belong to the event loop of the one test using it."""
    from pytest_ml4.client.endpoint import make_async_openai

    return make_async_openai(ml4_endpoint)


@pytest.fixture(scope="session")
def ml4_token_counter(ml4_target: Target, ml4_endpoint: Endpoint) -> Any:
    """Token re-counter for usage checks: the deployment's ``POST /tokenize`` where the stack has one, else the
    local Tekken (``pytest_ml4.evidence.recount``)."""
    from pytest_ml4.evidence.recount import counter_for

    return counter_for(ml4_target, ml4_endpoint)


@pytest.fixture(scope="session")
def http_client(ml4_endpoint: Endpoint) -> Iterator[httpx.Client]:
    from pytest_ml4.client.endpoint import make_httpx

    client = make_httpx(ml4_endpoint)
    yield client
    client.close()


@pytest.fixture(scope="session")
def ml4(request: pytest.FixtureRequest, ml4_target: Target, ml4_endpoint: Endpoint, http_client: httpx.Client,
        openai_client: Any, ml4_run_dir: Path, ml4_worker_engine: WorkerEngine | None) -> Deployment:
    """The deployment under test: target, endpoint and the session's clients in one object (session-scoped, so
    module fixtures use it too; ``ml4.async_openai()`` makes each check its own async client). The token
    re-counter and the engine log are session fixtures of their own, fetched only when a check reads them (a run
    without a log configured must not fail the checks that never read it)."""
    from pytest_ml4.client.deployment import Deployment
    from pytest_ml4.plugin.logs import log_reader_if_any
    from pytest_ml4.plugin.report import RECORDER

    # The session clients are recorded as the fixtures they are; the async clients made per check are too.
    return Deployment(ml4_target, ml4_endpoint, http_client, openai_client, ml4_run_dir, ml4_worker_engine,
                      _token_counter=lambda: request.getfixturevalue("ml4_token_counter"),
                      _logs=lambda: log_reader_if_any(request), _on_new_client=RECORDER.install)
