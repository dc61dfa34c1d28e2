"""Restart controller for a Dynamo deployment (DGD) on Kubernetes, through the official ``kubernetes`` client.

Grove-managed DGDs are restarted by deleting their pods ("delete the pods directly and let Grove recreate them",
dynamo.md §2). A restart deletes the pods of the chosen roles (``workers``, ``worker``, ``prefill``, ``decode``)
and waits for: replacement pods Running and Ready, the DGD ``Ready`` condition True **and** ``state: successful``
(dynamo.md §1.3), the frontend ``/health`` 200, and the model back in ``/v1/models``.

``rolling=True`` deletes one pod at a time and waits for its replacement to be Ready before the next, so a
deployment with several replicas per role keeps a complete worker set (and its clients see no error) throughout.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import httpx
from kubernetes import client as k8s_client

from pytest_ml4.control.base import (
    Check,
    Controller,
    Progress,
    RestartError,
    health_check,
    model_listed_check,
    wait_for,
)
from pytest_ml4.control.budget import LEAVE, REGISTER
from pytest_ml4.control.k8s_api import dgd_status, list_pods, pod_ready

#: Why Dynamo answers that succeed can lack ``nvext`` (worker ids, timing): said whenever a check cannot see the
#: workers (affinity, prefix reuse, the prefill -> decode handoff, restart identity).
NVEXT_ABSENT_CAUSES = ("the frontend runs with DYN_DISABLE_FRONTEND_NVEXT=1 (a documented hardening), or an ingress "
                       "or API gateway in front of it drops the nvext field and the x-dynamo-* headers")


class KubernetesController(Controller):
    """Delete the engine pods of one DGD and wait until the deployment serves again."""

    kind = "kubernetes"

    def __init__(self, api: k8s_client.ApiClient, namespace: str, dgd: str, *, frontend_url: str, base_url: str,
                 model: str, roles: Sequence[str] = ("workers",), api_key: str | None = None,
                 timeout_s: float = 2400.0, rolling: bool = False) -> None:
        super().__init__(timeout_s)
        self.core = k8s_client.CoreV1Api(api)
        self.custom = k8s_client.CustomObjectsApi(api)
        self.namespace = namespace
        self.dgd = dgd
        self.roles = tuple(roles)
        self.frontend_url = frontend_url
        self.base_url = base_url
        self.model = model
        self._api_key = api_key
        self.rolling = rolling
        # role -> uids of the pods deleted by the last trigger, and how many pods the role had before it
        self._deleted: dict[str, set[str]] = {}
        self._expected: dict[str, int] = {}
        #: The worker instances the frontend listed before the last deletion (the leave phase waits them out).
        self._listed_before: frozenset[str] = frozenset()

    def describe(self) -> str:
        how = "rolling, one pod at a time" if self.rolling else "all at once"
        return f"DGD {self.namespace}/{self.dgd} ({', '.join(self.roles)} pods, {how})"

    def pods(self, role: str = "all") -> list[Any]:
        return list_pods(self.core, self.namespace, self.dgd, role)

    def delete_pods(self, role: str) -> list[str]:
        """Delete every pod of ``role``; returns their names. Nothing matched is an error, not a silent pass."""
        self._deleted, self._expected = {}, {}
        self._listed_before = self.engines()
        return self._delete_role(role)

    def _delete_role(self, role: str) -> list[str]:
        pods = self.pods(role)
        if not pods:
            raise RestartError(f"no {role} pods found for DGD {self.namespace}/{self.dgd}")
        self._deleted[role] = {p.metadata.uid for p in pods}
        self._expected[role] = len(pods)
        for pod in pods:
            self.core.delete_namespaced_pod(pod.metadata.name, self.namespace)
        return [p.metadata.name for p in pods]

    def trigger(self, progress: Progress | None = None) -> dict[str, Any]:
        self._deleted, self._expected = {}, {}
        self._listed_before = self.engines()
        if not self.rolling:
            return {"deleted_pods": {role: self._delete_role(role) for role in self.roles}}
        deadline = self.restart_deadline or time.monotonic() + self.timeout_s
        deleted: dict[str, list[str]] = {}
        instances = self.frontend_instances()
        for role in self.roles:
            pods = self.pods(role)
            if not pods:
                raise RestartError(f"no {role} pods found for DGD {self.namespace}/{self.dgd}")
            self._deleted[role] = set()
            self._expected[role] = len(pods)
            for pod in pods:
                listed = self.engines()
                self._deleted[role].add(pod.metadata.uid)
                self.core.delete_namespaced_pod(pod.metadata.name, self.namespace)
                deleted.setdefault(role, []).append(pod.metadata.name)
                # Each pod's leave and register phases share the workers' declared start time.
                pod_deadline = min(deadline, time.monotonic() + self.worker_start_s) if self.worker_start_s \
                    else deadline
                wait_for(f"{pod.metadata.name} gone and its worker unlisted by the frontend",
                         self._old_workers_left(listed, pods=1), pod_deadline, progress, phase=LEAVE)
                wait_for(f"replacement of {pod.metadata.name} Running and Ready", self._replacements_ready,
                         pod_deadline, progress, phase=REGISTER)
                # Ready is not yet discovered: the next deletion waits until the frontend routes to the new worker.
                wait_for(f"frontend /health listing {instances} worker instances", self._instances_at_least(instances),
                         pod_deadline, progress, phase=REGISTER)
        return {"deleted_pods": deleted}

    def _old_workers_left(self, listed: frozenset[str], pods: int | None = None) -> Check:
        """The deleted pods are gone and as many of the worker instances ``listed`` before as pods were deleted
        (``pods``, default all the restart deleted) are unlisted by the frontend: a worker is one instance id, and
        it deregisters on SIGTERM once drained. The workers of roles not restarted stay listed."""

        def check() -> str | None:
            lingering = [p.metadata.name for role, old in self._deleted.items() for p in self.pods(role)
                         if p.metadata.uid in old]
            if lingering:
                return f"old pods still present {lingering}"
            want = sum(len(old) for old in self._deleted.values()) if pods is None else pods
            gone = listed - self.engines()
            if listed and len(gone) < min(want, len(listed)):
                return (f"{len(gone)} of the {want} deleted workers unlisted by the frontend; still listed: "
                        f"{sorted(listed & self.engines())}")
            return None
        return check

    def _replacements_ready(self) -> str | None:
        problems: list[str] = []
        for role, old in self._deleted.items():
            pods = self.pods(role)
            lingering = [p.metadata.name for p in pods if p.metadata.uid in old]
            fresh = [p for p in pods if p.metadata.uid not in old]
            ready = [p for p in fresh if pod_ready(p)]
            if lingering:
                problems.append(f"{role}: old pods still present {lingering}")
            elif len(ready) < self._expected[role]:
                problems.append(f"{role}: {len(ready)}/{self._expected[role]} pods ready "
                                f"({', '.join(f'{p.metadata.name}={p.status.phase}' for p in fresh) or 'none yet'})")
        return "; ".join(problems) or None

    def frontend_instances(self) -> int:
        """How many worker instances the frontend's ``/health`` lists (0 when it does not answer 200)."""
        try:
            r = httpx.get(self.frontend_url.rstrip("/") + "/health", timeout=2.0)
            return len(r.json().get("instances") or []) if r.status_code == 200 else 0
        except (httpx.HTTPError, ValueError, AttributeError):
            return 0

    def engines(self) -> frozenset[str]:
        """The worker instance ids the frontend's ``/health`` lists (the ids ``nvext.worker_id`` names)."""
        try:
            r = httpx.get(self.frontend_url.rstrip("/") + "/health", timeout=2.0)
            instances = (r.json().get("instances") or []) if r.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            return frozenset()
        return frozenset(str(i["instance_id"]) for i in instances if isinstance(i, dict) and "instance_id" in i)

    evidence_absent_cause = NVEXT_ABSENT_CAUSES

    def probe_extras(self) -> dict[str, Any]:
        # Dynamo's frontend names the worker that decoded each answer (nvext.worker_id, real-dynamo.md): a new
        # pod's worker registers under a new instance id, so a rolling restart's recovery is seen per request.
        return {"nvext": {"extra_fields": ["worker_id"]}}

    def _instances_at_least(self, n: int) -> Check:
        def check() -> str | None:
            seen = self.frontend_instances()
            return None if seen >= n else f"/health lists {seen} instances"
        return check

    def _dgd_serving(self) -> str | None:
        status = dgd_status(self.custom, self.namespace, self.dgd)
        return None if status.serving else status.describe()

    #: The readiness condition of the leave phase (the others are the new workers registering).
    LEAVE_CHECK = "old pods gone and their workers unlisted by the frontend"

    def phase_of(self, what: str) -> str:
        return LEAVE if what == self.LEAVE_CHECK else REGISTER

    def _leave_check(self) -> str | None:
        return self._old_workers_left(self._listed_before)()

    def ready_checks(self) -> list[tuple[str, Check]]:
        return [(self.LEAVE_CHECK, self._leave_check),
                ("replacement pods Running and Ready", self._replacements_ready),
                (f"DGD {self.dgd} Ready=True and state successful", self._dgd_serving),
                ("frontend /health 200", health_check(self.frontend_url)),
                (f"{self.model} in /v1/models", model_listed_check(self.base_url, self.model, self._api_key))]
