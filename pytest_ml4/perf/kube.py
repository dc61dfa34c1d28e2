"""``--perf-kube N``: load from more than one host through aiperf's Kubernetes mode, no pytest.

* **render**: ``aiperf kube generate --no-operator`` with the same flags as the local run (Namespace/RBAC,
  a ConfigMap holding ``run_config.json``, a JobSet of one controller and ``N`` worker pods of
  ``WORKERS_PER_POD`` aiperf workers each, so concurrency, rate and percentiles stay global). The API key never
  reaches aiperf here: the pods read it from a Secret (``--env-from-secrets AIPERF_INJECTED_API_KEY=SECRET/KEY``,
  aiperf's private key transport, ``aiperf/common/endpoint_credentials.py``); a YAML ``${VAR}`` key would be
  substituted at render time and land in the ConfigMap.
* **submit** with the official ``kubernetes`` client (core and RBAC objects through their typed APIs, the JobSet
  through ``CustomObjectsApi``), **follow** the JobSet's conditions, **fetch** the export from the controller pod's
  results API (``/api/results/files/<name>`` on port ``RESULTS_PORT``, what ``aiperf kube results`` reads) through
  the API server's pod proxy, then the caller judges it with the same gates as a local run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pytest_ml4.perf.export import RECORDS_FILE, SUMMARY_FILE
from pytest_ml4.perf.runner import AiperfSpec, build_argv, child_env
from pytest_ml4.runtime import installed as tools
from pytest_ml4.runtime import processes

#: aiperf's default ``runtime.workersPerPod``; ``--total-workers`` must be a multiple of it above one pod.
WORKERS_PER_POD = 10
JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
#: The controller's API port (``runtime.api_port`` in the rendered run config) and results path.
RESULTS_PORT = 9090
RESULTS_PATH = "api/results/files"
FETCHED = (SUMMARY_FILE, RECORDS_FILE)
#: aiperf's private key variable in the pods (never a literal: a secretKeyRef).
KEY_ENV = "AIPERF_INJECTED_API_KEY"
#: Flags of a local ``aiperf profile`` run that do not apply to a rendered one (value-taking ones drop their value).
_LOCAL_ONLY = {"-f": True, "--output-artifact-dir": True, "--server-metrics": True, "--no-server-metrics": False}


class KubeRunError(RuntimeError):
    """Rendering, submitting, following or fetching a kube run failed; the message names the step and object."""


@dataclass(frozen=True)
class KubeJob:
    """Where a rendered run goes: namespace, job name (DNS label, at most 40 chars), worker pods, key Secret."""

    namespace: str
    name: str
    pods: int
    key_secret: tuple[str, str] | None = None   # (Secret name, key) holding the endpoint's API key

    def __post_init__(self) -> None:
        if self.pods < 1:
            raise ValueError("--perf-kube: N must be at least 1 worker pod")
        if len(self.name) > 40:
            raise ValueError(f"kube job name {self.name!r} is longer than aiperf's 40 characters")

    @property
    def total_workers(self) -> int:
        return self.pods * WORKERS_PER_POD


def generate_argv(spec: AiperfSpec, job: KubeJob, executable: Path | None = None) -> list[str]:
    """``aiperf kube generate --no-operator`` with the local run's load flags (no secret in it)."""
    local = build_argv(spec, Path("unused"), None, executable)
    argv = [local[0], "kube", "generate", "--no-operator"]
    rest = local[2:]
    i = 0
    while i < len(rest):
        flag = rest[i]
        if flag in _LOCAL_ONLY:
            i += 2 if _LOCAL_ONLY[flag] else 1
            continue
        argv.append(flag)
        i += 1
    argv += ["--namespace", job.namespace, "--name", job.name, "--total-workers", str(job.total_workers)]
    if job.key_secret is not None:
        argv += ["--env-from-secrets", f"{KEY_ENV}={job.key_secret[0]}/{job.key_secret[1]}"]
    return argv


def render(spec: AiperfSpec, job: KubeJob, out_file: Path, executable: Path | None = None) -> list[dict[str, Any]]:
    """Render the manifests into ``out_file`` and return them. aiperf runs with no key in its environment."""
    argv = generate_argv(spec, job, executable or tools.aiperf_executable())
    proc = processes.run(argv, env=child_env(None, extra=spec.aiperf_env), capture_output=True, text=True, check=False,
                          timeout=120)
    if proc.returncode != 0:
        raise KubeRunError(f"aiperf kube generate failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(proc.stdout)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if isinstance(d, dict)]
    if not any(d.get("kind") == "JobSet" for d in docs):
        raise KubeRunError(f"aiperf kube generate wrote no JobSet ({out_file})")
    return docs


def jobset_of(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d.get("kind") == "JobSet")


def worker_pods(jobset: dict[str, Any]) -> int:
    """Worker pods the JobSet runs (replicated job ``workers``: replicas x parallelism)."""
    for rj in jobset["spec"]["replicatedJobs"]:
        if rj["name"] == "workers":
            return int(rj.get("replicas", 1)) * int(rj["template"]["spec"].get("parallelism", 1))
    return 0


# --------------------------------------------------------------------------------------- submit, follow, fetch
_CREATORS: dict[str, tuple[str, str]] = {
    "Namespace": ("CoreV1Api", "create_namespace"),
    "ServiceAccount": ("CoreV1Api", "create_namespaced_service_account"),
    "ConfigMap": ("CoreV1Api", "create_namespaced_config_map"),
    "Role": ("RbacAuthorizationV1Api", "create_namespaced_role"),
    "RoleBinding": ("RbacAuthorizationV1Api", "create_namespaced_role_binding"),
}


def submit(api: Any, docs: Sequence[dict[str, Any]]) -> str:
    """Create every rendered object; returns the JobSet's name. ``api``: a ``kubernetes.client.ApiClient``."""
    from kubernetes import client as k8s
    from kubernetes.client.rest import ApiException

    for doc in docs:
        kind, meta = doc.get("kind"), doc.get("metadata") or {}
        ns = meta.get("namespace")
        try:
            if kind == "JobSet":
                k8s.CustomObjectsApi(api).create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, ns,
                                                                          JOBSET_PLURAL, doc)
                continue
            if kind not in _CREATORS:
                raise KubeRunError(f"rendered manifest has a {kind} ({meta.get('name')}) this submitter does not know")
            cls, method = _CREATORS[kind]
            fn = getattr(getattr(k8s, cls)(api), method)
            fn(doc) if kind == "Namespace" else fn(ns, doc)
        except ApiException as err:
            if err.status == 409 and kind == "Namespace":
                continue  # the namespace exists already: fine
            raise KubeRunError(f"creating {kind} {ns}/{meta.get('name')} failed: HTTP {err.status} {err.reason}") \
                from None
    js = jobset_of(docs)["metadata"]
    return str(js["name"])


def jobset_state(obj: dict[str, Any]) -> str | None:
    """``Completed`` / ``Failed`` once the JobSet finished (its true condition), else None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Completed", "Failed") and str(cond.get("status")) == "True":
            return str(cond["type"])
    return None


def follow(api: Any, namespace: str, name: str, *, timeout_s: float, poll_s: float = 1.0,
           on_poll: Callable[[float], None] | None = None) -> str:
    """Poll the JobSet until it completes; :class:`KubeRunError` when it failed or ran past ``timeout_s``."""
    from kubernetes import client as k8s

    custom = k8s.CustomObjectsApi(api)
    t0 = time.monotonic()
    while True:
        obj = custom.get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name)
        state = jobset_state(obj)
        if state == "Completed":
            return state
        if state == "Failed":
            raise KubeRunError(f"JobSet {namespace}/{name} failed: {(obj.get('status') or {}).get('conditions')}")
        elapsed = time.monotonic() - t0
        if elapsed > timeout_s:
            raise KubeRunError(f"JobSet {namespace}/{name} did not complete within {timeout_s:.0f} s")
        if on_poll is not None:
            on_poll(elapsed)
        time.sleep(poll_s)


def controller_pod(api: Any, namespace: str, name: str) -> str:
    from kubernetes import client as k8s

    selector = f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name=controller"
    pods = k8s.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    if not pods:
        raise KubeRunError(f"no controller pod of JobSet {namespace}/{name} ({selector})")
    return str(pods[0].metadata.name)


def fetch(api: Any, namespace: str, name: str, out_dir: Path, files: Sequence[str] = FETCHED) -> Path:
    """Download the export files from the controller pod's results API into ``out_dir`` (pod proxy)."""
    from kubernetes import client as k8s
    from kubernetes.client.rest import ApiException

    pod = controller_pod(api, namespace, name)
    core = k8s.CoreV1Api(api)
    out_dir.mkdir(parents=True, exist_ok=True)
    for fname in files:
        try:
            resp = core.connect_get_namespaced_pod_proxy_with_path(f"{pod}:{RESULTS_PORT}", namespace,
                                                                   f"{RESULTS_PATH}/{fname}", _preload_content=False)
        except ApiException as err:
            raise KubeRunError(f"fetching {fname} from pod {namespace}/{pod} failed: HTTP {err.status} "
                               f"{err.reason}") from None
        (out_dir / fname).write_bytes(resp.data)
    return out_dir


# --------------------------------------------------------------------------------------- one run, end to end
def job_name(label: str) -> str:
    """A DNS label of at most ``MAX_NAME`` characters, unique per run (aiperf prefixes ``aiperf-``)."""
    import re
    import secrets

    base = re.sub(r"[^a-z0-9-]+", "-", label.lower()).strip("-")[: MAX_NAME - 10]
    return f"ml4-{base}-{secrets.token_hex(2)}"


MAX_NAME = 33  # aiperf allows 40 and adds "aiperf-"


@dataclass
class KubeLoad:
    """Runs a workload as a JobSet of ``pods`` worker pods instead of a local aiperf (``--perf-kube N``)."""

    api: Any
    namespace: str
    pods: int
    key_secret: tuple[str, str] | None = None
    timeout_s: float = 7200.0
    #: The spec being run (read by a fake API's JobSet runner under ``--sim``).
    current: AiperfSpec | None = None

    def run(self, spec: AiperfSpec, out: Path, label: str) -> Path:
        """Render, submit, follow and fetch into ``out``; returns ``out`` holding the export."""
        job = KubeJob(self.namespace, job_name(label), self.pods, self.key_secret)
        out.mkdir(parents=True, exist_ok=True)
        docs = render(spec, job, out / "kube-manifests.yaml")
        self.current = spec
        name = submit(self.api, docs)
        follow(self.api, self.namespace, name, timeout_s=self.timeout_s)
        return fetch(self.api, self.namespace, name, out)
