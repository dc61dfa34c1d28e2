"""Where the suites send requests: the embedded deployment's front (its proxy when it has one) or a live one's URL.

:func:`endpoint_for` checks what a run needs before any test (a URL, the API key, an answer) and raises
:class:`EndpointUnusable` with one line and the exit code the plugin stops the session with.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pytest_ml4.client.endpoint import (
    Endpoint,
    check_reachable,
    worker_metrics_urls_from_env,
)
from pytest_ml4.client.transport import Deadlines
from pytest_ml4.report.redact import register_secret_env
from pytest_ml4.target.model import Target

if TYPE_CHECKING:  # the embedded deployment's types: the plugin imports the harness only under --sim
    from pytest_ml4_sim.deploy.embedded import Deployment
    from pytest_ml4_sim.deploy.launcher import Engine

#: Exit codes: nothing to talk to (no URL, no key), and an endpoint that does not answer as it must.
NOT_CONFIGURED = 4
UNREACHABLE = 3


class EndpointUnusable(Exception):
    """The session cannot start: ``str(err)`` is the one line to print, ``returncode`` the exit code."""

    def __init__(self, message: str, returncode: int) -> None:
        super().__init__(message)
        self.returncode = returncode


def endpoint_for(target: Target, deployment: Deployment | None, *, endpoint_url: str | None, key_var: str | None,
                 deadlines: Deadlines) -> Endpoint:
    """The session's Endpoint: the deployment's (``--sim``) or the live one the options and environment name."""
    engine = deployment.engine if deployment is not None else None
    via_proxy = deployment is not None and deployment.proxy is not None
    if deployment is not None:
        # The suites see the deployment as clients do: through the proxy when there is one.
        base_url = deployment.proxy.base_url if via_proxy else engine.base_url
    else:
        base_url = endpoint_url or os.environ.get(target.endpoint.url_env) or target.endpoint.default_url
        if not base_url:
            raise EndpointUnusable(f"ml4: target {target.name} has no endpoint: export {target.endpoint.url_env}="
                                   f"https://HOST/v1, pass --endpoint URL, or use --sim", NOT_CONFIGURED)
    api_key = os.environ.get(key_var) if key_var else None
    register_secret_env(key_var)  # before any line below could quote it (an endpoint echoing a refused key)
    if target.endpoint.requires_api_key and not api_key:
        raise EndpointUnusable(f"ml4: target {target.name} needs an API key: environment variable {key_var} is not "
                               f"set (or name another with --api-key-env)", NOT_CONFIGURED)
    ep = Endpoint(base_url=base_url, api_key=api_key or "", model=target.serving.served_model_name,
                  metrics_url=_metrics_url(target, engine), simulated=deployment is not None,
                  proxy=via_proxy or (deployment is None and target.has_proxy),
                  worker_metrics_urls=_worker_metrics(target, deployment), deadlines=deadlines)
    problem = check_reachable(ep, key_source=key_var)
    if problem:
        raise EndpointUnusable(f"ml4: {problem}", UNREACHABLE)
    return ep


def _metrics_url(target: Target, engine: Engine | None) -> str | None:
    var = target.endpoint.metrics_url_env
    if var and os.environ.get(var):
        return os.environ[var]
    return None if engine is None else engine.url + "/metrics"


def _worker_metrics(target: Target, deployment: Deployment | None) -> dict[str, tuple[str, ...]]:
    """Live runs: the workers' /metrics from the variables the target names; --sim: the deployment's own."""
    if deployment is None:
        return dict(worker_metrics_urls_from_env(target.endpoint.worker_metrics_url_env))
    return dict(deployment.describe().worker_metrics_urls)
