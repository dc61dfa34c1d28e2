"""Kubernetes helpers shared by the Dynamo restart controller and the pod-log reader.

Label keys, selectors and readiness rules are Dynamo's (shared/reference/dynamo.md §1.3, §2); all API access goes
through the official ``kubernetes`` client.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from pytest_ml4.target.model import Target

LABEL_DGD = "nvidia.com/dynamo-graph-deployment-name"
LABEL_COMPONENT = "nvidia.com/dynamo-component"
LABEL_TYPE = "nvidia.com/dynamo-component-type"
LABEL_SUBTYPE = "nvidia.com/dynamo-sub-component-type"
DGD_GROUP, DGD_VERSION, DGD_PLURAL = "nvidia.com", "v1beta1", "dynamographdeployments"

#: Selector terms per role. Legacy (alpha-era) worker pods carry ``component-type=worker`` plus a sub-type, so a
#: role is the union of several selectors (dynamo.md §2 "Legacy caveat").
ROLE_SELECTORS: dict[str, tuple[str, ...]] = {
    "frontend": (f"{LABEL_TYPE}=frontend",),
    "worker": (f"{LABEL_TYPE}=worker,!{LABEL_SUBTYPE}",),
    "prefill": (f"{LABEL_TYPE}=prefill", f"{LABEL_TYPE}=worker,{LABEL_SUBTYPE}=prefill"),
    "decode": (f"{LABEL_TYPE}=decode", f"{LABEL_TYPE}=worker,{LABEL_SUBTYPE}=decode"),
    "workers": (f"{LABEL_TYPE} in (worker,prefill,decode)",),
    "all": ("",),
}


class KubeConfigError(RuntimeError):
    """No way to reach the Kubernetes API (no kubeconfig, not in a cluster) or no namespace."""


def api_client(host: str | None = None) -> k8s_client.ApiClient:
    """An ApiClient for ``host`` (e.g. a local API server) or from kubeconfig / the in-cluster service account."""
    if host:
        cfg = k8s_client.Configuration()
        cfg.host = host
        return k8s_client.ApiClient(cfg)
    try:
        k8s_config.load_kube_config()
    except Exception as kube_err:  # noqa: BLE001 - the client raises several types; try in-cluster next
        try:
            k8s_config.load_incluster_config()
        except Exception as in_err:  # noqa: BLE001
            raise KubeConfigError(f"no Kubernetes access: kubeconfig: {kube_err}; in-cluster: {in_err}") from None
    return k8s_client.ApiClient()


def target_namespace(target: Target, env: dict[str, str] | None = None) -> str:
    """The namespace of the target's DGD: ``control.namespace`` or the variable ``control.namespace_env`` names."""
    env = dict(os.environ) if env is None else env
    ctl = target.control
    ns = ctl.namespace or (env.get(ctl.namespace_env) if ctl.namespace_env else None)
    if not ns:
        raise KubeConfigError(f"target {target.name}: no namespace (set {ctl.namespace_env or 'control.namespace'})")
    return ns


def selectors(dgd: str, role: str) -> list[str]:
    """Label selectors (all must be queried, results united) for the pods of ``role`` in DGD ``dgd``."""
    if role not in ROLE_SELECTORS:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLE_SELECTORS)}")
    return [",".join(x for x in (f"{LABEL_DGD}={dgd}", term) if x) for term in ROLE_SELECTORS[role]]


def list_pods(core: k8s_client.CoreV1Api, namespace: str, dgd: str, role: str = "all") -> list[Any]:
    """Pods of one role of the DGD, de-duplicated by uid, sorted by name."""
    found: dict[str, Any] = {}
    for sel in selectors(dgd, role):
        for pod in core.list_namespaced_pod(namespace, label_selector=sel).items:
            found[pod.metadata.uid] = pod
    return sorted(found.values(), key=lambda p: p.metadata.name)


def pod_ready(pod: Any) -> bool:
    if pod.metadata.deletion_timestamp is not None or (pod.status is None) or pod.status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


@dataclass(frozen=True)
class DgdStatus:
    """The DGD's readiness as Dynamo defines it: Ready condition True **and** state successful (dynamo.md §1.3)."""

    state: str
    ready: str
    reason: str
    message: str

    @property
    def serving(self) -> bool:
        return self.ready == "True" and self.state == "successful"

    def describe(self) -> str:
        return f"state={self.state} Ready={self.ready} reason={self.reason} message={self.message!r}"


def dgd_status(custom: k8s_client.CustomObjectsApi, namespace: str, dgd: str) -> DgdStatus:
    obj = custom.get_namespaced_custom_object(DGD_GROUP, DGD_VERSION, namespace, DGD_PLURAL, dgd)
    status = obj.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    return DgdStatus(state=str(status.get("state", "")), ready=str(ready.get("status", "Unknown")),
                     reason=str(ready.get("reason", "")), message=str(ready.get("message", "")))
