"""Restart controllers: one interface (restart, wait until ready, time it, bounded, saying what it waits for).

* :class:`SimController` — the embedded simulator process;
* :class:`SystemdController` — ``systemctl restart UNIT``, locally or over ssh;
* :class:`KubernetesController` — delete a Dynamo DGD's worker/prefill/decode pods, wait for the DGD to be Ready.

:func:`controller_for` builds the one a target's ``control`` section asks for.
"""

from __future__ import annotations

import os
from typing import Any

from pytest_ml4.control.base import (
    Controller,
    RestartError,
    RestartResult,
    RestartTimeout,
    WaitStep,
    health_check,
    model_listed_check,
    models_listed,
    wait_for,
)
from pytest_ml4.control.sim import SimController
from pytest_ml4.control.systemd import SystemdController
from pytest_ml4.target.model import Target

__all__ = ["Controller", "KubernetesController", "RestartError", "RestartResult", "RestartTimeout", "SimController",
           "SystemdController", "WaitStep", "controller_for", "health_check", "model_listed_check", "models_listed",
           "wait_for"]


def __getattr__(name: str) -> Any:
    # The kubernetes client is a heavy import; only Dynamo targets need it.
    if name == "KubernetesController":
        from pytest_ml4.control.k8s_restart import KubernetesController
        return KubernetesController
    raise AttributeError(name)


def controller_for(target: Target, *, root_url: str, base_url: str, api_key: str | None = None,
                   sim: Any = None, kube_api: Any = None, roles: tuple[str, ...] = ("workers",),
                   namespace: str | None = None, env: dict[str, str] | None = None) -> Controller:
    """The controller for ``target``: the simulator when ``sim`` is given (non-Dynamo), else systemd or Kubernetes.

    Dynamo targets always restart through the Kubernetes API (``kube_api``: an ``ApiClient``, pointed at the fake
    API server in ``--sim`` runs), so the same code path is exercised in CI and against a cluster.
    """
    ctl = _controller(target, root_url=root_url, base_url=base_url, api_key=api_key, sim=sim, kube_api=kube_api,
                      roles=roles, namespace=namespace, env=dict(os.environ) if env is None else env)
    ctl.worker_start_s = target.control.worker_start_s
    return ctl


def _controller(target: Target, *, root_url: str, base_url: str, api_key: str | None, sim: Any, kube_api: Any,
                roles: tuple[str, ...], namespace: str | None, env: dict[str, str]) -> Controller:
    model = target.serving.engine_served_model_name or target.serving.served_model_name
    timeout = target.control.restart_timeout_s
    if target.control.kind == "kubernetes":
        from pytest_ml4.control.k8s_api import api_client, target_namespace
        from pytest_ml4.control.k8s_restart import KubernetesController

        if not target.control.dgd:
            raise RestartError(f"target {target.name}: control.dgd is not set")
        ns = namespace or target_namespace(target, env)
        return KubernetesController(kube_api or api_client(), ns, target.control.dgd,
                                    frontend_url=root_url, base_url=base_url,
                                    model=target.serving.served_model_name, roles=roles, api_key=api_key,
                                    timeout_s=timeout)
    if sim is not None:
        return SimController(sim, model, api_key=api_key, timeout_s=timeout)
    unit = target.control.unit
    if not unit:
        raise RestartError(f"target {target.name}: control.unit is not set")
    ssh_host = env.get(target.control.ssh_host_env) if target.control.ssh_host_env else None
    return SystemdController(unit, root_url=root_url, base_url=base_url, model=model, ssh_host=ssh_host,
                             api_key=api_key, timeout_s=timeout)
