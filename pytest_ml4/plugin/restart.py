"""pytest glue for the restart concern: the restart controller, the LiteLLM proxy in front of the simulator, the
Kubernetes API (a fake one in ``--sim`` Dynamo runs), and the retry options. The core lives in
:mod:`pytest_ml4.control`, :mod:`pytest_ml4_sim.deploy.litellm`, :mod:`pytest_ml4_sim.deploy.dynamo` (reached
through :mod:`pytest_ml4.plugin.embedded`) and :mod:`pytest_ml4.logs.kubernetes`.

Fixtures (session scope):

* ``ml4_proxy`` — the real LiteLLM proxy the plugin starts in front of the simulator for targets with
  ``serving.proxy`` under ``--sim`` (None otherwise); ``--ml4-proxy-retries`` / ``--ml4-proxy-max-retries``
  (defined here) choose its retry settings;
* ``ml4_dynamo_deployment`` — the embedded :class:`~pytest_ml4_sim.deploy.dynamo.DynamoDeployment` of a ``--sim``
  Dynamo target, simulated or real ``dynamo.vllm`` workers (the session's ``ml4_sim`` when it is one, else one
  started here);
* ``ml4_kube_api`` — a ``kubernetes`` ApiClient for Dynamo targets (kubeconfig / ``--ml4-kube-host``; under
  ``--sim`` the fake API server of ``harness/pytest_ml4_sim/deploy/fake_k8s.py`` serving that deployment's processes as pods);
* ``ml4_kube_namespace``, ``ml4_restart_endpoint`` (where the restart suite sends requests),
  ``ml4_restart_controller`` and ``ml4_restart_logs`` (the engine log reader the post-restart checks use);
* ``ml4_restart_progress`` — where a restart scenario's progress lines go (phase, elapsed, what it waits for): the
  terminal as the perf sweep's do, and ``<run dir>/restart/progress.log``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_ml4.plugin.embedded import (
    StartFailed,
    as_dynamo_deployment,
    serve_fake_dynamo_api,
    start_own_dynamo,
)
from pytest_ml4.plugin.option_group import group as ml4_group
from pytest_ml4.plugin.state import get_state as _state
from pytest_ml4.stacks import stack_for
from pytest_ml4.target.model import Target

if TYPE_CHECKING:  # annotations only: the fixtures import what they start lazily
    from pytest_ml4_sim.deploy.dynamo import DynamoDeployment
    from pytest_ml4_sim.deploy.embedded import Proxy
    from pytest_ml4_sim.deploy.launcher import Engine

    from pytest_ml4.client.endpoint import Endpoint


#: Namespace of the simulated DGD when the target names none in the environment.
SIM_NAMESPACE = "ml4-sim"
#: The restart scenarios' progress lines, in the run folder.
PROGRESS_FILE = "restart/progress.log"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = ml4_group(parser)
    group.addoption("--ml4-proxy-retries", dest="ml4_proxy_retries", type=int, default=None, metavar="N",
                    help="litellm_settings.num_retries of the LiteLLM proxy started in front of the simulator "
                         "(default: the target's serving.proxy.num_retries; 0 turns retries off) "
                         "(ini: ml4_proxy_retries)")
    group.addoption("--ml4-proxy-max-retries", dest="ml4_proxy_max_retries", type=int, default=None, metavar="N",
                    help="the deployment's litellm_params.max_retries for that proxy (default: the target's) "
                         "(ini: ml4_proxy_max_retries)")
    group.addoption("--ml4-restart-roles", dest="ml4_restart_roles", default=None, metavar="ROLES",
                    help="Dynamo targets: pods a restart deletes, comma-separated from workers,worker,prefill,decode "
                         "(default: workers) (ini: ml4_restart_roles)")
    group.addoption("--ml4-kube-host", dest="ml4_kube_host", default=None, metavar="URL",
                    help="Kubernetes API server URL (default: kubeconfig or the in-cluster service account)")
    parser.addini("ml4_proxy_retries", "num_retries of the simulator's LiteLLM proxy", default=None)
    parser.addini("ml4_proxy_max_retries", "max_retries of the simulator's LiteLLM proxy", default=None)
    parser.addini("ml4_restart_roles", "Dynamo pods a restart deletes", default="workers")


def _api_key(target: Target) -> str | None:
    var = target.endpoint.api_key_env
    return os.environ.get(var) if var else None


# ----------------------------------------------------------------------------------------------- proxy
@pytest.fixture(scope="session")
def ml4_proxy(pytestconfig: pytest.Config, ml4_sim: Engine | None) -> Proxy | None:
    """The real LiteLLM proxy the plugin started with the simulator (targets with ``serving.proxy``, ``--sim``),
    or None; under xdist a worker's view of the controller's proxy."""
    deployment = _state(pytestconfig).deployment
    return deployment.proxy if ml4_sim is not None and deployment is not None else None


# ----------------------------------------------------------------------------------------------- Dynamo / Kubernetes
@pytest.fixture(scope="session")
def ml4_dynamo_deployment(pytestconfig: pytest.Config, ml4_target: Target, ml4_sim: Engine | None,
                          ml4_run_dir: Path) -> Iterator[DynamoDeployment | None]:
    """The embedded Dynamo deployment of a ``--sim`` Dynamo target, else None."""
    if ml4_sim is None or not stack_for(ml4_target).routes_workers:
        yield None
        return
    session_dynamo = as_dynamo_deployment(ml4_sim)
    if session_dynamo is not None:
        yield session_dynamo
        return
    # An xdist worker sees the controller's deployment: it starts Dynamo frontend + workers of its own to restart.
    log_file = ml4_run_dir / "dynamo" / os.environ.get("PYTEST_XDIST_WORKER", "main") / "engine.log"
    try:
        own = start_own_dynamo(ml4_target, log_file, _state(pytestconfig).settings())
    except StartFailed as err:
        pytest.exit(str(err), returncode=3)
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="session")
def ml4_kube_namespace(ml4_target: Target, ml4_dynamo_deployment: DynamoDeployment | None) -> str | None:
    if not stack_for(ml4_target).routes_workers and ml4_target.control.kind != "kubernetes":
        return None
    from pytest_ml4.control.k8s_api import KubeConfigError, target_namespace

    try:
        return target_namespace(ml4_target)
    except KubeConfigError:
        if ml4_dynamo_deployment is not None:
            return SIM_NAMESPACE
        raise


@pytest.fixture(scope="session")
def ml4_kube_api(pytestconfig: pytest.Config, ml4_target: Target, ml4_dynamo_deployment: DynamoDeployment | None,
                 ml4_kube_namespace: str | None) -> Iterator[Any]:
    """ApiClient for Dynamo targets (the fake API server over the embedded Dynamo deployment under ``--sim``);
    None otherwise."""
    if ml4_kube_namespace is None:
        yield None
        return
    from pytest_ml4.control.k8s_api import api_client

    if ml4_dynamo_deployment is None:
        yield api_client(pytestconfig.getoption("ml4_kube_host"))
        return
    fake = serve_fake_dynamo_api(ml4_dynamo_deployment, ml4_kube_namespace, ml4_target.control.dgd)
    try:
        yield api_client(fake.url)
    finally:
        fake.wait_settled()
        fake.stop()


# ----------------------------------------------------------------------------------------------- restart
@pytest.fixture(scope="session")
def ml4_restart_endpoint(ml4_target: Target, ml4_endpoint: Endpoint, ml4_proxy: Proxy | None,
                         ml4_dynamo_deployment: DynamoDeployment | None) -> Any:
    """Where the restart suite sends requests: the proxy, the simulated Dynamo frontend, or the endpoint."""
    from dataclasses import replace

    if ml4_proxy is not None:
        return replace(ml4_endpoint, base_url=ml4_proxy.base_url, proxy=True,
                       model=ml4_target.serving.proxy.model_alias if ml4_target.serving.proxy else ml4_endpoint.model)
    if ml4_dynamo_deployment is not None:
        return replace(ml4_endpoint, base_url=ml4_dynamo_deployment.base_url,
                       metrics_url=ml4_dynamo_deployment.url + "/metrics")
    return ml4_endpoint


@pytest.fixture(scope="session")
def ml4_restart_controller(pytestconfig: pytest.Config, ml4_target: Target, ml4_sim: Engine | None,
                           ml4_restart_endpoint: Endpoint, ml4_kube_api: Any, ml4_kube_namespace: str | None) -> Any:
    """The restart controller for the target (simulator process, systemd unit, or the DGD's pods)."""
    from pytest_ml4.control import RestartError, controller_for

    roles = tuple(r.strip() for r in (pytestconfig.getoption("ml4_restart_roles")
                                      or pytestconfig.getini("ml4_restart_roles") or "workers").split(",") if r.strip())
    engine_sim = None if stack_for(ml4_target).routes_workers else ml4_sim
    root = ml4_restart_endpoint.root_url
    base = ml4_restart_endpoint.base_url
    if engine_sim is not None:
        # The controller judges the engine itself; the proxy in front is the clients' business.
        root, base = engine_sim.url, engine_sim.base_url
    elif ml4_restart_endpoint.proxy and (ml4_restart_endpoint.metrics_url or "").endswith("/metrics"):
        # Behind a proxy the engine's own /health is where its metrics are (the target's metrics_url_env).
        root = ml4_restart_endpoint.metrics_url[: -len("/metrics")]
    try:
        ctl = controller_for(ml4_target, root_url=root, base_url=base, api_key=_api_key(ml4_target),
                             sim=engine_sim, kube_api=ml4_kube_api, roles=roles, namespace=ml4_kube_namespace)
    except RestartError as err:
        raise pytest.UsageError(f"ml4: cannot restart target {ml4_target.name}: {err} (the restart suite needs the "
                                f"process that owns the simulator: run it without -n)") from None
    if hasattr(ctl, "rolling"):
        # A deployment that must show clients no error is restarted one pod at a time.
        ctl.rolling = not ml4_target.gates.restart_client_errors_allowed
    return ctl


@pytest.fixture(scope="session")
def ml4_restart_logs(pytestconfig: pytest.Config, ml4_target: Target, ml4_sim: Engine | None, ml4_kube_api: Any,
                     ml4_kube_namespace: str | None) -> Any:
    """The engine log reader the post-restart checks judge (worker pods for Dynamo targets); ``--ml4-log-file``
    wins, as for ``ml4_logs``: the user named the log of the deployment under test."""
    from pytest_ml4.logs import FileLogReader, reader_for_target

    path = pytestconfig.getoption("ml4_log_file") or pytestconfig.getini("ml4_log_file")
    if path:
        return FileLogReader(path)
    if ml4_kube_api is not None and ml4_kube_namespace and ml4_target.control.dgd:
        from pytest_ml4.logs.kubernetes import KubernetesLogReader

        return KubernetesLogReader(ml4_kube_api, ml4_kube_namespace, ml4_target.control.dgd, role="workers")
    return reader_for_target(ml4_target, sim=ml4_sim)


@pytest.fixture(scope="session")
def ml4_restart_progress(pytestconfig: pytest.Config) -> Any:
    """Writes a restart scenario's progress line to the terminal (as the perf sweep's) and the run folder."""
    from pytest_ml4.plugin.perf import progress_writer

    return progress_writer(pytestconfig, PROGRESS_FILE)
