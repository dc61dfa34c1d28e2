"""A small fake Kubernetes API server for the tests and ``--sim`` Dynamo runs (no real API server runs in CI).

It implements exactly the calls the plugin makes through the official ``kubernetes`` client, with Kubernetes
semantics (shared/reference/dynamo.md §11):

* ``GET /api/v1/namespaces/{ns}/pods?labelSelector=`` — real selector grammar: ``k=v``, ``k==v``, ``k!=v``,
  ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``; a malformed selector is a 400 like the real server's;
* ``GET`` / ``DELETE /api/v1/namespaces/{ns}/pods/{name}`` with ``Status`` bodies for 404;
* ``GET /api/v1/namespaces/{ns}/pods/{name}/log`` with ``container``, ``previous``, ``sinceSeconds``, ``tailLines``,
  ``timestamps``: plain text, lines stamped when the "container runtime" read them from the process's log file;
* ``GET /apis/nvidia.com/v1beta1/namespaces/{ns}/dynamographdeployments/{name}`` with ``status``;
* ``POST`` and ``GET`` of ConfigMaps, Roles, RoleBindings and JobSets (``aiperf kube generate`` output): a created
  JobSet is run by ``jobset_runner`` (the test runs aiperf as the pods would), gets a controller pod and the
  ``Completed`` (or ``Failed``) condition; the controller's results API is served through the pod proxy
  (``GET /api/v1/namespaces/{ns}/pods/{pod}:9090/proxy/api/results/files/{name}``).

Behind every pod is a process handle (duck-typed: ``restart()`` blocking until it serves, or ``stop()`` and
``start()``; ``alive()``; ``log_file``). The scripted operator does what Grove + the Dynamo operator do: deleting a pod removes it, creates a
replacement with a new name and uid (``Pending``), restarts the process behind it, and marks the new pod
``Running``/``Ready`` once it serves; meanwhile the DGD shows ``state: pending``, ``Ready=False`` with reason
``some_resources_are_not_ready``, and back ``successful``/``True`` with ``all_resources_are_ready`` when every pod
is ready. A process that dies on its own is restarted in place (``restartCount`` + 1; its old output becomes the
``previous`` log), like the kubelet does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

if TYPE_CHECKING:
    from pytest_ml4_sim.deploy.dynamo import DynamoDeployment

DGD_PATH = "/apis/nvidia.com/v1beta1/namespaces/{ns}/dynamographdeployments"
LABEL_DGD = "nvidia.com/dynamo-graph-deployment-name"
LABEL_COMPONENT = "nvidia.com/dynamo-component"
LABEL_TYPE = "nvidia.com/dynamo-component-type"
COLLECT_EVERY_S = 0.1
#: The kubelet's CrashLoopBackOff: a container that fails to start waits 10 s, doubling up to 5 min, before the
#: next start (kubelet defaults), instead of being restarted in a tight loop.
BACKOFF_FIRST_S, BACKOFF_MAX_S = 10.0, 300.0


class Backend(Protocol):
    log_file: Path

    def restart(self) -> Any: ...

    def alive(self) -> bool: ...


# ------------------------------------------------------------------------------------------------ label selectors
class SelectorError(ValueError):
    pass


_TERM = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<nkey>[\w./-]+)"
    r"|(?P<skey>[\w./-]+)\s+(?P<op>in|notin)\s*\((?P<vals>[^)]*)\)"
    r"|(?P<ekey>[\w./-]+)\s*(?P<eop>==|!=|=)\s*(?P<val>[\w.-]*)"
    r"|(?P<key>[\w./-]+))\s*$")


def _split_terms(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        terms.append(cur)
    return terms


def parse_selector(selector: str) -> list[Callable[[dict[str, str]], bool]]:
    """Compile a label selector into predicates over a label dict (all must hold)."""
    preds: list[Callable[[dict[str, str]], bool]] = []
    for raw in _split_terms(selector or ""):
        m = _TERM.match(raw)
        if not m:
            raise SelectorError(f"unable to parse requirement: {raw.strip()!r}")
        if m["nkey"]:
            k = m["nkey"]
            preds.append(lambda lb, k=k: k not in lb)
        elif m["skey"]:
            k, vals = m["skey"], {v.strip() for v in m["vals"].split(",") if v.strip()}
            if m["op"] == "in":
                preds.append(lambda lb, k=k, vals=vals: lb.get(k) in vals)
            else:
                preds.append(lambda lb, k=k, vals=vals: lb.get(k) not in vals)
        elif m["ekey"]:
            k, v = m["ekey"], m["val"]
            if m["eop"] == "!=":
                preds.append(lambda lb, k=k, v=v: lb.get(k) != v)
            else:
                preds.append(lambda lb, k=k, v=v: lb.get(k) == v)
        else:
            k = m["key"]
            preds.append(lambda lb, k=k: k in lb)
    return preds


def matches(selector: str, labels: dict[str, str]) -> bool:
    return all(p(labels) for p in parse_selector(selector))


# ------------------------------------------------------------------------------------------------ model
def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _iso(t: dt.datetime | None) -> str | None:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ") if t else None


@dataclass
class ContainerLog:
    """One container instance's output: (unix time read, line) pairs, read incrementally from the backend's file."""

    path: Path
    pos: int = 0
    inode: int | None = None
    lines: list[tuple[float, str]] = field(default_factory=list)
    partial: str = ""

    def start_at_end(self) -> None:
        try:
            st = self.path.stat()
            self.pos, self.inode = st.st_size, st.st_ino
        except FileNotFoundError:
            self.pos, self.inode = 0, None

    def collect(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        if self.inode is not None and (st.st_ino != self.inode or st.st_size < self.pos):
            self.pos = 0  # the file was replaced or truncated: a new process writes from the start
        self.inode = st.st_ino
        if st.st_size == self.pos:
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.pos)
            data = fh.read()
        self.pos += len(data)
        text = self.partial + data.decode("utf-8", errors="replace")
        *done, self.partial = text.split("\n")
        stamp = time.time()
        self.lines.extend((stamp, line) for line in done)


@dataclass
class Container:
    name: str
    backend: Backend
    log: ContainerLog
    previous: ContainerLog | None = None
    restart_count: int = 0
    started: dt.datetime = field(default_factory=_now)
    #: CrashLoopBackOff: the current back-off and the monotonic time before which the watchdog does not restart it.
    backoff_s: float = 0.0
    next_start: float = 0.0

    def start_failed(self) -> None:
        self.backoff_s = min(max(2 * self.backoff_s, BACKOFF_FIRST_S), BACKOFF_MAX_S)
        self.next_start = time.monotonic() + self.backoff_s

    def start_succeeded(self) -> None:
        self.backoff_s = self.next_start = 0.0

    @property
    def backing_off(self) -> bool:
        return time.monotonic() < self.next_start


@dataclass
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    containers: list[Container]
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    created: dt.datetime = field(default_factory=_now)
    phase: str = "Running"
    ready: bool = True
    deleting: bool = False
    deletion: dt.datetime | None = None
    busy: bool = False  # a restart in place is running (the watchdog must not start another)
    component: str = ""

    def to_json(self) -> dict[str, Any]:
        statuses = []
        for c in self.containers:
            state = ({"waiting": {"reason": "CrashLoopBackOff"}} if c.backing_off
                     else {"running": {"startedAt": _iso(c.started)}} if self.phase == "Running"
                     else {"waiting": {"reason": "ContainerCreating"}})
            statuses.append({"name": c.name, "ready": self.ready, "restartCount": c.restart_count,
                             "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:sim", "imageID": "sim",
                             "containerID": f"sim://{self.uid}-{c.name}-{c.restart_count}", "state": state,
                             "started": self.phase == "Running"})
        return {
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid,
                         "labels": dict(self.labels), "creationTimestamp": _iso(self.created),
                         "deletionTimestamp": _iso(self.deletion), "resourceVersion": "1"},
            "spec": {"containers": [{"name": c.name, "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:sim"}
                                    for c in self.containers]},
            "status": {"phase": self.phase, "startTime": _iso(self.created),
                       "conditions": [{"type": "Ready", "status": "True" if self.ready else "False"},
                                      {"type": "ContainersReady", "status": "True" if self.ready else "False"}],
                       "containerStatuses": statuses},
        }


def _restart_container(backend: Backend, old_log: ContainerLog | None, new_log: ContainerLog) -> None:
    """Stop the process, give its last lines to the old container, start it again into the new container's log."""
    # The kubelet runs a running container's preStop hook before SIGTERM: the process serves meanwhile.
    if backend.alive():
        time.sleep(float(getattr(backend, "pre_stop_s", 0.0)))
    stop, start = getattr(backend, "stop", None), getattr(backend, "start", None)
    if stop is None or start is None:
        new_log.start_at_end()
        backend.restart()
        return
    stop()
    if old_log is not None:
        old_log.collect()  # shutdown lines belong to the container that is going away
    new_log.start_at_end()
    start()


def _restart_or_back_off(container: Container, old_log: ContainerLog | None) -> None:
    """Restart the container's process (:func:`_restart_container`); a process that fails to come up (it exits at
    boot, or its start wait gives up) puts the container into back-off for the watchdog, as the kubelet does,
    instead of failing the thread that started it."""
    try:
        _restart_container(container.backend, old_log, container.log)
    except Exception:  # noqa: BLE001 - any start failure of the backend is a container that did not start
        container.start_failed()
    else:
        container.start_succeeded()


def _status(code: int, reason: str, message: str, **details: Any) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": details, "code": code}
    return web.json_response(body, status=code)


# ------------------------------------------------------------------------------------------------ server
class FakeKubeAPI:
    """The fake API server: pods, pod logs, one kind of custom object, and a scripted operator."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Pod] = {}
        self.dgds: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []  # (method, path) of every request: tests assert what was used
        self._lock = threading.RLock()
        #: One restart at a time per process: a pod deleted while the kubelet restarts its crashed process in place
        #: (a real dynamo.vllm worker takes minutes) is replaced only after that restart, never by a second
        #: stop/start racing the first on the same process handle.
        self._restarting: dict[int, threading.Lock] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stop = threading.Event()
        self._collector: threading.Thread | None = None
        self.port: int | None = None
        #: Objects created through the API (``(plural, namespace, name)`` -> body): ConfigMaps, RBAC, JobSets.
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        #: Runs a submitted JobSet: ``(jobset, configmaps of its namespace)`` -> the controller's results folder
        #: (the test runs aiperf as the pods would). None: JobSets stay pending.
        self.jobset_runner: Callable[[dict[str, Any], dict[str, dict[str, Any]]], Path] | None = None
        #: Results folders served by the controller pods' API (``/api/results/files/<name>``) through the pod proxy.
        self.results: dict[tuple[str, str], Path] = {}

    # -- setup
    def add_dgd(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        with self._lock:
            self.dgds[(namespace, name)] = {
                "apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
                "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "generation": 1},
                "spec": spec, "status": {"state": "initializing", "conditions": []}}
            self._refresh_dgd(namespace, name)

    def add_pod(self, namespace: str, component: str, labels: dict[str, str],
                containers: dict[str, Backend]) -> Pod:
        with self._lock:
            pod = Pod(name=self._pod_name(labels.get(LABEL_DGD, "pod"), component), namespace=namespace,
                      labels=dict(labels), component=component,
                      containers=[Container(n, b, ContainerLog(Path(b.log_file))) for n, b in containers.items()])
            for c in pod.containers:
                c.log.collect()  # the pod's process is already running: its boot output is this container's log
            self.pods[(namespace, pod.name)] = pod
            self._refresh_all()
            return pod

    @staticmethod
    def _pod_name(dgd: str, component: str) -> str:
        # Grove pattern <pcs>-<index>-<pclq>-<random> (dynamo.md §2)
        return f"{dgd}-0-{component.lower()}-{secrets.token_hex(3)[:5]}"

    # -- the scripted operator
    def _refresh_dgd(self, namespace: str, name: str) -> None:
        obj = self.dgds[(namespace, name)]
        mine = [p for p in self.pods.values() if p.namespace == namespace and p.labels.get(LABEL_DGD) == name]
        not_ready = sorted(p.name for p in mine if not p.ready or p.deleting)
        expected = sum(int(c.get("replicas", 1)) for c in obj["spec"].get("components", []))
        live = [p for p in mine if not p.deleting]
        if mine and not not_ready and len(live) >= expected:
            state, cond = "successful", {"type": "Ready", "status": "True", "reason": "all_resources_are_ready",
                                         "message": "All resources are ready"}
        else:
            what = "; ".join(f"{n}: pods_not_ready" for n in not_ready) or f"{len(live)}/{expected} pods"
            state, cond = "pending", {"type": "Ready", "status": "False", "reason": "some_resources_are_not_ready",
                                      "message": f"Resources not ready: {what}"}
        cond["lastTransitionTime"] = _iso(_now())
        comps: dict[str, Any] = {}
        for p in live:
            c = comps.setdefault(p.component, {"componentKind": "PodClique", "replicas": 0, "readyReplicas": 0})
            c["replicas"] += 1
            c["readyReplicas"] += int(p.ready)
        obj["status"] = {"observedGeneration": 1, "state": state, "conditions": [cond], "components": comps}

    def _refresh_all(self) -> None:
        for ns, name in list(self.dgds):
            self._refresh_dgd(ns, name)

    def delete_pod(self, namespace: str, name: str) -> Pod:
        with self._lock:
            pod = self.pods[(namespace, name)]
            pod.deleting, pod.ready, pod.deletion = True, False, _now()
            self._refresh_all()
        threading.Thread(target=self._replace, args=(pod,), name=f"fake-k8s-replace-{name}", daemon=True).start()
        return pod

    def _replace(self, old: Pod) -> None:
        """Grove recreates the pod: new name and uid, Pending while the process restarts, then Running/Ready."""
        with self._lock:
            self.pods.pop((old.namespace, old.name), None)
            new = Pod(name=self._pod_name(old.labels.get(LABEL_DGD, "pod"), old.component), namespace=old.namespace,
                      labels=dict(old.labels), component=old.component, phase="Pending", ready=False, busy=True,
                      containers=[Container(c.name, c.backend, ContainerLog(c.log.path)) for c in old.containers])
            self.pods[(new.namespace, new.name)] = new
            self._refresh_all()
        try:
            for c, old_c in zip(new.containers, old.containers):
                with self._restart_lock(c.backend):
                    _restart_or_back_off(c, old_c.log)
                c.started = _now()
        finally:
            with self._lock:
                # A container that died at boot is not ready; the watchdog restarts it (CrashLoopBackOff).
                new.phase, new.ready, new.busy = "Running", all(c.backend.alive() for c in new.containers), False
                self._refresh_all()

    def _restart_lock(self, backend: Backend) -> threading.Lock:
        with self._lock:
            return self._restarting.setdefault(id(backend), threading.Lock())

    def _restart_in_place(self, pod: Pod, container: Container) -> None:
        try:
            with self._restart_lock(container.backend):
                if not container.backend.alive():  # a replacement may have restarted it meanwhile
                    _restart_or_back_off(container, None)
        finally:
            with self._lock:
                container.started = _now()
                pod.phase, pod.ready, pod.busy = "Running", container.backend.alive(), False
                self._refresh_all()

    def _watchdog(self) -> None:
        """Collect every container's new output; restart a process that died on its own (kubelet behaviour)."""
        while not self._stop.wait(COLLECT_EVERY_S):
            with self._lock:
                pods = list(self.pods.values())
            for pod in pods:
                for c in pod.containers:
                    c.log.collect()
                    if pod.busy or pod.deleting or c.backing_off or c.backend.alive():
                        continue
                    with self._lock:
                        # Checked again under the lock: a deletion or another restart may have claimed the pod
                        # since the unlocked look above.
                        if pod.busy or pod.deleting or (pod.namespace, pod.name) not in self.pods:
                            continue
                        pod.busy, pod.ready = True, False
                        c.previous, c.log = c.log, ContainerLog(c.log.path)
                        c.restart_count += 1
                        self._refresh_all()
                    threading.Thread(target=self._restart_in_place, args=(pod, c), daemon=True).start()

    # -- HTTP handlers
    async def _list_pods(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        try:
            preds = parse_selector(request.query.get("labelSelector", ""))
        except SelectorError as err:
            return _status(400, "BadRequest", str(err))
        with self._lock:
            items = [p.to_json() for p in self.pods.values()
                     if p.namespace == ns and all(f(p.labels) for f in preds)]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                  "items": sorted(items, key=lambda i: i["metadata"]["name"])})

    def _pod_or_404(self, request: web.Request) -> Pod | web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.pods.get((ns, name))
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        return pod

    async def _get_pod(self, request: web.Request) -> web.Response:
        with self._lock:
            pod = self._pod_or_404(request)
            return pod if isinstance(pod, web.Response) else web.json_response(pod.to_json())

    async def _delete_pod(self, request: web.Request) -> web.Response:
        with self._lock:
            pod = self._pod_or_404(request)
            if isinstance(pod, web.Response):
                return pod
        body = self.delete_pod(pod.namespace, pod.name).to_json()
        return web.json_response(body)

    async def _pod_log(self, request: web.Request) -> web.Response:
        q = request.query
        with self._lock:
            pod = self._pod_or_404(request)
            if isinstance(pod, web.Response):
                return pod
            names = [c.name for c in pod.containers]
            cname = q.get("container")
            if cname is None:
                if len(names) > 1:
                    return _status(400, "BadRequest", f"a container name must be specified for pod {pod.name}, "
                                                      f"choose one of: [{' '.join(names)}]")
                cname = names[0]
            container = next((c for c in pod.containers if c.name == cname), None)
            if container is None:
                return _status(400, "BadRequest", f"container {cname} is not valid for pod {pod.name}")
            container.log.collect()
            source = container.log
            if q.get("previous") in ("true", "1", "True"):
                if container.previous is None:
                    return _status(400, "BadRequest", f'previous terminated container "{cname}" in pod '
                                                      f'"{pod.name}" not found')
                source = container.previous
            lines = list(source.lines)
        if "sinceSeconds" in q:
            cutoff = time.time() - int(q["sinceSeconds"])
            lines = [(t, s) for t, s in lines if t >= cutoff]
        if "tailLines" in q:
            n = int(q["tailLines"])
            lines = lines[-n:] if n > 0 else []
        stamp = q.get("timestamps") in ("true", "1", "True")
        text = "".join((dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z") + " "
                        if stamp else "") + s + "\n" for t, s in lines)
        return web.Response(text=text, content_type="text/plain")

    async def _get_dgd(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        with self._lock:
            obj = self.dgds.get((ns, name))
            if obj is None:
                return _status(404, "NotFound", f'dynamographdeployments.nvidia.com "{name}" not found',
                               name=name, group="nvidia.com", kind="dynamographdeployments")
            return web.json_response(obj)

    @web.middleware
    async def _record(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        self.calls.append((request.method, request.path))
        return await handler(request)

    # -- created objects (aiperf kube: RBAC, ConfigMap, JobSet), the JobSet "controller", the pod proxy
    async def _create(self, request: web.Request) -> web.Response:
        ns, plural = request.match_info["ns"], request.match_info["plural"]
        body = await request.json()
        name = str((body.get("metadata") or {}).get("name", ""))
        with self._lock:
            if (plural, ns, name) in self.objects:
                return _status(409, "AlreadyExists", f'{plural} "{name}" already exists', name=name, kind=plural)
            body.setdefault("metadata", {}).update({"namespace": ns, "uid": str(uuid.uuid4())})
            self.objects[(plural, ns, name)] = body
        if plural == "jobsets":
            threading.Thread(target=self._run_jobset, args=(ns, name), name=f"fake-jobset-{name}",
                             daemon=True).start()
        return web.json_response(body, status=201)

    def _run_jobset(self, ns: str, name: str) -> None:
        if self.jobset_runner is None:
            return
        with self._lock:
            jobset = self.objects[("jobsets", ns, name)]
            maps = {k[2]: v for k, v in self.objects.items() if k[0] == "configmaps" and k[1] == ns}
        labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "controller"}
        pod = Pod(name=f"{name}-controller-0-0-{secrets.token_hex(2)}", namespace=ns, labels=labels, containers=[],
                  phase="Running")
        with self._lock:
            self.pods[(ns, pod.name)] = pod
        try:
            results = self.jobset_runner(jobset, maps)
            state, message = "Completed", "jobset completed successfully"
        except Exception as err:  # noqa: BLE001 - a failed run is a Failed JobSet, as on a cluster
            results, state, message = None, "Failed", f"{type(err).__name__}: {err}"
        with self._lock:
            if results is not None:
                self.results[(ns, pod.name)] = results
            pod.phase = "Succeeded" if state == "Completed" else "Failed"
            jobset["status"] = {"conditions": [{"type": state, "status": "True", "reason": state,
                                                "message": message, "lastTransitionTime": _iso(_now())}]}

    async def _get_object(self, request: web.Request) -> web.Response:
        key = (request.match_info["plural"], request.match_info["ns"], request.match_info["name"])
        with self._lock:
            obj = self.objects.get(key)
        if obj is None:
            return _status(404, "NotFound", f'{key[0]} "{key[2]}" not found', name=key[2], kind=key[0])
        return web.json_response(obj)

    async def _pod_proxy(self, request: web.Request) -> web.StreamResponse:
        ns, target, rest = request.match_info["ns"], request.match_info["pod"], request.match_info["path"]
        pod, _, port = target.partition(":")
        with self._lock:
            folder = self.results.get((ns, pod))
        prefix = "api/results/files/"
        if folder is None or port != "9090" or not rest.startswith(prefix):
            return _status(404, "NotFound", f"no results API at {target}/{rest}")
        path = folder / rest[len(prefix):]
        if not path.is_file() or path.parent != folder:
            return _status(404, "NotFound", f"{rest} not found")
        return web.Response(body=path.read_bytes(), content_type="application/octet-stream")

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        pods = "/api/v1/namespaces/{ns}/pods"
        dgd = DGD_PATH
        app.router.add_get(pods, self._list_pods)
        app.router.add_get(pods + "/{name}", self._get_pod)
        app.router.add_delete(pods + "/{name}", self._delete_pod)
        app.router.add_get(pods + "/{name}/log", self._pod_log)
        app.router.add_get(pods + "/{pod}/proxy/{path:.*}", self._pod_proxy)
        app.router.add_get(dgd + "/{name}", self._get_dgd)
        # After the pod routes (aiohttp matches in order): ConfigMaps, RBAC and JobSets, created and read back.
        for prefix in ("/api/v1", "/apis/rbac.authorization.k8s.io/v1", "/apis/jobset.x-k8s.io/v1alpha2"):
            app.router.add_post(prefix + "/namespaces/{ns}/{plural}", self._create)
            app.router.add_get(prefix + "/namespaces/{ns}/{plural}/{name}", self._get_object)
        return app

    # -- life cycle
    def start(self) -> FakeKubeAPI:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._runner = web.AppRunner(self._app(), access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fake-k8s", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake Kubernetes API server did not start")
        self._collector = threading.Thread(target=self._watchdog, name="fake-k8s-kubelet", daemon=True)
        self._collector.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._stop.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def wait_settled(self, timeout: float = 60.0) -> None:
        """Block until no pod is being replaced or restarted (tests use it before tearing down)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not any(p.busy or p.deleting for p in self.pods.values()):
                    return
            time.sleep(0.05)

    def __enter__(self) -> FakeKubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------ Dynamo wiring
COMPONENT_NAMES = {"frontend": "Frontend", "worker": "VllmWorker", "prefill": "VllmPrefillWorker",
                   "decode": "VllmDecodeWorker"}


def serve_dynamo(deployment: DynamoDeployment, namespace: str, dgd: str) -> FakeKubeAPI:
    """Start a fake API server whose DGD ``dgd`` is the running Dynamo deployment (either kind of worker): one pod per process, labelled as the
    Dynamo operator labels them (dynamo.md §2), one container ``main`` each. Each worker pod is a real Dynamo worker
    process behind the real ``dynamo.frontend``: deleting the pod SIGTERMs it (Dynamo deregisters and drains) and
    starts a replacement under a new instance id, so migration and the stale-instance window are Dynamo's own."""
    api = FakeKubeAPI()
    roles: dict[str, int] = {}
    for w in deployment.workers:
        roles[w.role] = roles.get(w.role, 0) + 1
    components = [{"name": COMPONENT_NAMES["frontend"], "type": "frontend", "replicas": 1}]
    components += [{"name": COMPONENT_NAMES[r], "type": r, "replicas": n} for r, n in roles.items()]
    api.add_dgd(namespace, dgd, {"backendFramework": "vllm", "components": components})

    def labels(role: str) -> dict[str, str]:
        comp = COMPONENT_NAMES[role]
        return {LABEL_DGD: dgd, LABEL_COMPONENT: comp, LABEL_TYPE: role,
                "nvidia.com/selector": f"{dgd}-{comp.lower()}",
                "nvidia.com/dynamo-namespace": f"{namespace}-{dgd.replace('.', '-')}"}

    deployment.supervised = True  # the watchdog restarts a worker that dies (DynamoDeployment.recover waits for it)
    api.add_pod(namespace, COMPONENT_NAMES["frontend"], labels("frontend"), {"main": deployment.frontend})
    for w in deployment.workers:
        api.add_pod(namespace, COMPONENT_NAMES[w.role], labels(w.role), {"main": w})
    return api.start()
