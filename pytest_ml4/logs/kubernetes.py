"""Log reader over Kubernetes pod logs (a Dynamo DGD's pods), through the official ``kubernetes`` client.

Reads every container of every pod of one DynamoGraphDeployment, selected by its labels (dynamo.md §2), from the
start of each container (the kubelet keeps a container's log since it started), and the *previous* container's
log where a container restarted in place (``restartCount`` > 0). Lines are read with ``timestamps=true`` so each
record carries the time the container runtime stamped it; the stamp is removed from the text.

``since_last_boot()`` judges the engines running now: for each pod, its current container's lines from the last
boot marker on (a deleted-and-recreated pod is a new pod, so old pods' lines are simply gone).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from pytest_ml4.control.k8s_api import KubeConfigError, api_client, list_pods
from pytest_ml4.logs.journald import LogReadError
from pytest_ml4.logs.reader import LogReader
from pytest_ml4.logs.records import (
    LogRecord,
    Since,
    filter_since,
    records_from_text,
    since_epoch,
)
from pytest_ml4.target.model import Target


def _split_stamp(line: str) -> tuple[float | None, str]:
    """``2026-11-30T07:31:27.429588123Z text`` -> (epoch, text); lines without a stamp keep their text."""
    head, sep, rest = line.partition(" ")
    if not sep or not head[:4].isdigit() or "T" not in head:
        return None, line
    iso = head.rstrip("Z")
    if "." in iso:  # RFC 3339 with nanoseconds: Python parses at most microseconds
        main, frac = iso.split(".", 1)
        iso = f"{main}.{frac[:6]}"
    try:
        when = _dt.datetime.fromisoformat(iso).replace(tzinfo=_dt.UTC)
    except ValueError:
        return None, line
    return when.timestamp(), rest


class KubernetesLogReader(LogReader):
    """All containers of the pods of one DGD (optionally one role: ``workers``, ``prefill``, ``decode``, ...)."""

    def __init__(self, api: k8s_client.ApiClient, namespace: str, dgd: str, *, role: str = "all",
                 containers: Sequence[str] | None = None) -> None:
        self.core = k8s_client.CoreV1Api(api)
        self.namespace = namespace
        self.dgd = dgd
        self.role = role
        self.containers = tuple(containers) if containers else None

    @classmethod
    def for_target(cls, target: Target, env: Mapping[str, str] | None = None, *,
                   api: k8s_client.ApiClient | None = None, role: str = "all") -> KubernetesLogReader:
        """The reader for a target whose ``logs.kind`` is ``kubernetes``: the pods of ``control.dgd`` (kubeconfig unless
        ``api`` is given)."""
        env = os.environ if env is None else env
        where = target.control  # the DGD and its namespace are given once, under control
        ns = where.namespace or (env.get(where.namespace_env) if where.namespace_env else None)
        if not ns or not where.dgd:
            raise LogReadError(f"target {target.name}: Kubernetes logs need a namespace "
                               f"({where.namespace_env or 'control.namespace'}) and control.dgd")
        try:
            return cls(api or api_client(), ns, where.dgd, role=role)
        except KubeConfigError as err:
            raise LogReadError(str(err)) from None

    def describe(self) -> str:
        return f"kubernetes pods of DGD {self.namespace}/{self.dgd} (role {self.role})"

    # -- reading
    def pods(self) -> list[Any]:
        try:
            return list_pods(self.core, self.namespace, self.dgd, self.role)
        except ApiException as err:
            raise LogReadError(f"listing pods of {self.describe()} failed: HTTP {err.status} {err.reason}") from None

    def _container_names(self, pod: Any) -> list[str]:
        names = [c.name for c in pod.spec.containers]
        return [n for n in names if self.containers is None or n in self.containers]

    @staticmethod
    def _restarts(pod: Any, container: str) -> int:
        for st in pod.status.container_statuses or []:
            if st.name == container:
                return int(st.restart_count or 0)
        return 0

    def _fetch(self, pod: str, container: str, *, previous: bool, since_seconds: int | None) -> str:
        kwargs: dict[str, Any] = {"container": container, "timestamps": True}
        if previous:
            kwargs["previous"] = True
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        try:
            return str(self.core.read_namespaced_pod_log(pod, self.namespace, **kwargs))
        except ApiException as err:
            if err.status == 404:
                return ""  # the pod went away between listing and reading (it is being replaced)
            raise LogReadError(f"reading log of {pod}/{container} (previous={previous}) failed: HTTP {err.status} "
                               f"{(err.body or err.reason or '')[:200]}") from None

    def _records(self, text: str, source: str, boot_id: str) -> list[LogRecord]:
        stamped = [_split_stamp(line) for line in text.splitlines()]
        base = records_from_text([t for _, t in stamped], source=source, boot_id=boot_id)
        # The runtime's stamp is authoritative (vLLM's own has no year and local time).
        return [LogRecord(text=r.text, time=s if s is not None else r.time, source=r.source, index=r.index,
                          pid=r.pid, boot_id=r.boot_id) for r, (s, _) in zip(base, stamped)]

    def read_pod(self, pod: Any, since: Since = None, *, current_only: bool = False) -> list[LogRecord]:
        """One pod's lines, previous container instance first, oldest first."""
        t = since_epoch(since)
        since_seconds = max(1, math.ceil(time.time() - t)) if t is not None else None
        out: list[LogRecord] = []
        name = pod.metadata.name
        for container in self._container_names(pod):
            restarts = self._restarts(pod, container)
            if restarts and not current_only:
                prev = self._fetch(name, container, previous=True, since_seconds=since_seconds)
                out += self._records(prev, f"{name}/{container}", f"{pod.metadata.uid}/{container}#{restarts - 1}")
            cur = self._fetch(name, container, previous=False, since_seconds=since_seconds)
            out += self._records(cur, f"{name}/{container}", f"{pod.metadata.uid}/{container}#{restarts}")
        return filter_since(out, since)

    def read(self, since: Since = None) -> list[LogRecord]:
        records: list[LogRecord] = []
        for pod in self.pods():
            records += self.read_pod(pod, since)
        # Oldest first across pods; a stable sort keeps each pod's own order for lines with equal stamps.
        return sorted(records, key=lambda r: r.time if r.time is not None else 0.0)

    def since_last_boot(self, since: Since = None) -> list[LogRecord]:
        """Each pod's current container from its last boot marker on (several engines run side by side)."""
        from pytest_ml4.logs.signatures import last_boot_start

        out: list[LogRecord] = []
        for pod in self.pods():
            records = self.read_pod(pod, since, current_only=True)
            for group in self.boot_groups(records):
                out += group[last_boot_start(group):]
        return sorted(out, key=lambda r: r.time if r.time is not None else 0.0)
