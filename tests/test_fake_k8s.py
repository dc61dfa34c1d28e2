"""The fake Kubernetes API server, driven through the official ``kubernetes`` client like the plugin drives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from pytest_ml4_sim.deploy.fake_k8s import (
    LABEL_DGD,
    LABEL_TYPE,
    FakeKubeAPI,
    SelectorError,
    matches,
)

from pytest_ml4.control.k8s_api import api_client, dgd_status, list_pods, pod_ready

NS = "ml4"
DGD = "dgd-a"
# A process that announces its boot (with its pid) in its log, then idles: enough to see restarts and logs.
BOOT = "import os, time; print(f'boot pid={os.getpid()}', flush=True); time.sleep(600)"


class ProcBackend:
    """A real child process writing to a log file, restartable like a pod's container."""

    def __init__(self, log_file: Path, boot_delay: float = 0.0) -> None:
        self.log_file = log_file
        self.boot_delay = boot_delay
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with open(self.log_file, "ab") as fh:
            self.proc = subprocess.Popen([sys.executable, "-c", BOOT], stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while f"pid={self.proc.pid}" not in self.log_file.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)

    def restart(self) -> None:
        self.stop()
        time.sleep(self.boot_delay)
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[tuple[FakeKubeAPI, dict[str, ProcBackend]]]:
    api = FakeKubeAPI()
    backends = {role: ProcBackend(tmp_path / f"{role}.log", boot_delay=0.3) for role in ("frontend", "prefill",
                                                                                        "decode")}
    api.add_dgd(NS, DGD, {"components": [{"name": r, "type": r, "replicas": 1} for r in backends]})
    for role, b in backends.items():
        api.add_pod(NS, role.title(), {LABEL_DGD: DGD, LABEL_TYPE: role}, {"main": b})
    api.add_pod(NS, "Other", {LABEL_DGD: "other", LABEL_TYPE: "decode", "legacy": "x"},
                {"main": ProcBackend(tmp_path / "other.log")})
    api.start()
    try:
        yield api, backends
    finally:
        api.wait_settled()
        api.stop()
        for p in api.pods.values():
            for c in p.containers:
                c.backend.stop()  # type: ignore[attr-defined]


def _core(api: FakeKubeAPI) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(api_client(api.url))


def _names(core: k8s.CoreV1Api, selector: str) -> list[str]:
    return sorted(p.metadata.labels[LABEL_TYPE] + "@" + p.metadata.labels[LABEL_DGD]
                  for p in core.list_namespaced_pod(NS, label_selector=selector).items)


def test_label_selectors_filter_like_kubernetes(cluster: tuple[FakeKubeAPI, dict]) -> None:
    core = _core(cluster[0])
    assert _names(core, f"{LABEL_DGD}={DGD}") == ["decode@dgd-a", "frontend@dgd-a", "prefill@dgd-a"]
    assert _names(core, f"{LABEL_DGD}=={DGD},{LABEL_TYPE}=prefill") == ["prefill@dgd-a"]
    assert _names(core, f"{LABEL_TYPE} in (prefill, decode)") == ["decode@dgd-a", "decode@other", "prefill@dgd-a"]
    assert _names(core, f"{LABEL_TYPE} notin (prefill,decode)") == ["frontend@dgd-a"]
    assert _names(core, f"{LABEL_TYPE}!=decode,{LABEL_DGD}") == ["frontend@dgd-a", "prefill@dgd-a"]
    assert _names(core, "!legacy") == ["decode@dgd-a", "frontend@dgd-a", "prefill@dgd-a"]
    assert _names(core, "legacy") == ["decode@other"]
    assert _names(core, f"{LABEL_DGD}=nothing") == []


def test_bad_selector_is_a_400_status() -> None:
    with pytest.raises(SelectorError):
        matches("a in b", {})
    api = FakeKubeAPI().start()
    try:
        with pytest.raises(ApiException) as err:
            _core(api).list_namespaced_pod(NS, label_selector="a in b")
        assert err.value.status == 400
    finally:
        api.stop()


def test_missing_objects_are_404_status_bodies(cluster: tuple[FakeKubeAPI, dict]) -> None:
    api, _ = cluster
    core = _core(api)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("nope", NS)
    assert err.value.status == 404 and '"reason":"NotFound"' in err.value.body.replace(" ", "")
    with pytest.raises(ApiException) as err:
        k8s.CustomObjectsApi(api_client(api.url)).get_namespaced_custom_object(
            "nvidia.com", "v1beta1", NS, "dynamographdeployments", "nope")
    assert err.value.status == 404


def test_delete_replaces_pod_restarts_process_and_flips_dgd_readiness(
        cluster: tuple[FakeKubeAPI, dict]) -> None:
    api, backends = cluster
    client = api_client(api.url)
    core, custom = k8s.CoreV1Api(client), k8s.CustomObjectsApi(client)
    assert dgd_status(custom, NS, DGD).serving
    (old,) = list_pods(core, NS, DGD, "prefill")
    old_pid = backends["prefill"].proc.pid
    core.delete_namespaced_pod(old.metadata.name, NS)
    seen_states = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status = dgd_status(custom, NS, DGD)
        seen_states.add((status.state, status.ready))
        pods = list_pods(core, NS, DGD, "prefill")
        if status.serving and pods and pods[0].metadata.uid != old.metadata.uid and pod_ready(pods[0]):
            break
        time.sleep(0.05)
    assert ("pending", "False") in seen_states
    (new,) = list_pods(core, NS, DGD, "prefill")
    assert new.metadata.name != old.metadata.name and new.metadata.uid != old.metadata.uid
    assert dgd_status(custom, NS, DGD).serving
    new_pid = backends["prefill"].proc.pid
    assert new_pid != old_pid
    log = core.read_namespaced_pod_log(new.metadata.name, NS, container="main")
    assert f"boot pid={new_pid}" in log and f"pid={old_pid}" not in log
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod(old.metadata.name, NS)
    assert err.value.status == 404


def test_crashed_container_restarts_in_place_with_previous_log(cluster: tuple[FakeKubeAPI, dict]) -> None:
    api, backends = cluster
    core = _core(api)
    (pod,) = list_pods(core, NS, DGD, "decode")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log(pod.metadata.name, NS, previous=True)
    assert err.value.status == 400 and "previous terminated container" in err.value.body
    old_pid = backends["decode"].proc.pid
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(pod.metadata.name, NS)
        if pod.status.container_statuses[0].restart_count == 1 and pod_ready(pod):
            break
        time.sleep(0.05)
    assert pod.status.container_statuses[0].restart_count == 1
    previous = core.read_namespaced_pod_log(pod.metadata.name, NS, previous=True)
    current = core.read_namespaced_pod_log(pod.metadata.name, NS)
    assert f"pid={old_pid}" in previous and f"pid={old_pid}" not in current
    assert f"pid={backends['decode'].proc.pid}" in current


def test_log_since_seconds_and_tail_lines(cluster: tuple[FakeKubeAPI, dict], tmp_path: Path) -> None:
    api, backends = cluster
    core = _core(api)
    (pod,) = list_pods(core, NS, DGD, "frontend")
    time.sleep(1.2)
    with open(backends["frontend"].log_file, "a") as fh:
        fh.write("late one\nlate two\n")
    time.sleep(0.3)
    recent = core.read_namespaced_pod_log(pod.metadata.name, NS, since_seconds=1)
    assert recent == "late one\nlate two\n"
    assert core.read_namespaced_pod_log(pod.metadata.name, NS, tail_lines=1) == "late two\n"
    assert "boot pid=" in core.read_namespaced_pod_log(pod.metadata.name, NS)
    stamped = core.read_namespaced_pod_log(pod.metadata.name, NS, tail_lines=1, timestamps=True)
    assert stamped.endswith("Z late two\n")


class _StepBackend:
    """Records what the kubelet did to it, in order (no process: only the order of preStop, stop and start)."""

    log_file = Path(os.devnull)
    pre_stop_s = 3.0

    def __init__(self, running: bool, calls: list[str]) -> None:
        self.running, self.calls = running, calls

    def alive(self) -> bool:
        return self.running

    def stop(self) -> None:
        self.calls.append("stop")

    def start(self) -> None:
        self.calls.append("start")

    def restart(self) -> None:
        raise AssertionError("stop and start are used when the backend has them")


@pytest.mark.parametrize(("running", "expected"), [(True, ["preStop 3", "stop", "start"]), (False, ["stop", "start"])])
def test_prestop_delay_only_for_a_running_container(monkeypatch: pytest.MonkeyPatch, running: bool,
                                                    expected: list[str]) -> None:
    """Fault ``delayed_stop`` on Dynamo: a deleted pod's worker serves ``pre_stop_s`` before SIGTERM; a container that
    died on its own has no preStop to run."""
    from pytest_ml4_sim.deploy import fake_k8s

    calls: list[str] = []
    monkeypatch.setattr(fake_k8s.time, "sleep", lambda s: calls.append(f"preStop {s:g}") if s else None)
    fake_k8s._restart_container(_StepBackend(running, calls), None, fake_k8s.ContainerLog(Path(os.devnull)))
    assert calls == expected


class _SlowBootBackend:
    """A process handle whose start takes ``boot_s`` (a real dynamo.vllm worker takes minutes) and that records how
    many stop/start sequences ran on it at once."""

    pre_stop_s = 0.0

    def __init__(self, log_file: Path, boot_s: float) -> None:
        self.log_file, self.boot_s = log_file, boot_s
        self.running, self.busy, self.overlaps, self.starts = True, 0, 0, 0
        self._lock = threading.Lock()
        log_file.write_text("")

    def alive(self) -> bool:
        return self.running

    def _enter(self) -> None:
        with self._lock:
            self.busy += 1
            self.overlaps += self.busy > 1

    def stop(self) -> None:
        self._enter()
        self.running = False

    def start(self) -> None:
        time.sleep(self.boot_s)
        self.starts += 1
        self.running = True
        with self._lock:
            self.busy -= 1


def test_pod_deleted_while_its_crashed_process_restarts_in_place_is_replaced_after_that_restart(
        tmp_path: Path) -> None:
    """The kubelet race of ``-m restart`` on real workers: a worker crashes (the kubelet restarts it in place,
    minutes for real dynamo.vllm) and its pod is deleted meanwhile. The replacement's stop/start waits for the
    restart in place; two never run on the same process at once."""
    backend = _SlowBootBackend(tmp_path / "w.log", boot_s=1.0)
    with FakeKubeAPI() as api:
        api.add_dgd(NS, DGD, {"components": [{"name": "w", "type": "worker", "replicas": 1}]})
        pod = api.add_pod(NS, "Worker", {LABEL_DGD: DGD, LABEL_TYPE: "worker"}, {"main": backend})
        backend.running = False   # crashed: the watchdog starts the restart in place
        deadline = time.monotonic() + 10
        while not pod.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pod.busy, "the kubelet did not notice the crash"
        api.delete_pod(NS, pod.name)
        api.wait_settled(timeout=20)
        time.sleep(0.3)   # a watchdog pass after settling must not restart it again
    assert backend.overlaps == 0 and backend.starts == 2 and backend.running


class BootFailingBackend(ProcBackend):
    """A container whose process exits at boot with an error, as a crash-looping pod's does; counts its starts."""

    def __init__(self, log_file: Path) -> None:
        self.starts: list[float] = []
        self.failing = False
        super().__init__(log_file)

    def start(self) -> None:
        self.starts.append(time.monotonic())
        if self.failing:
            raise RuntimeError("exited at boot with status 1")
        super().start()


def test_a_replacement_that_fails_at_boot_backs_off_and_is_not_ready(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A replaced pod whose process dies at boot is not Ready, shows CrashLoopBackOff, and is started again only
    after the kubelet's back-off, not in a tight loop."""
    import pytest_ml4_sim.deploy.fake_k8s as fk

    monkeypatch.setattr(fk, "BACKOFF_FIRST_S", 1.0)
    backend = BootFailingBackend(tmp_path / "prefill.log")
    api = FakeKubeAPI()
    api.add_dgd(NS, DGD, {"components": [{"name": "prefill", "type": "prefill", "replicas": 1}]})
    api.add_pod(NS, "Prefill", {LABEL_DGD: DGD, LABEL_TYPE: "prefill"}, {"main": backend})
    api.start()
    try:
        core = _core(api)
        (pod,) = list_pods(core, NS, DGD, "prefill")
        backend.failing = True
        core.delete_namespaced_pod(pod.metadata.name, NS)
        api.wait_settled()
        (new,) = list_pods(core, NS, DGD, "prefill")
        assert not pod_ready(new)
        assert new.status.container_statuses[0].state.waiting.reason == "CrashLoopBackOff"
        failed = len(backend.starts)
        deadline = time.monotonic() + 20
        while len(backend.starts) < failed + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(backend.starts) >= failed + 2, f"the watchdog did not start it again twice: {backend.starts}"
        # Lower bounds only (a loaded machine makes the gaps longer, never shorter): 1 s, then doubled to 2 s.
        first, second, third = backend.starts[failed - 1:failed + 2]
        assert second - first >= 1.0 and third - second >= 2.0, (second - first, third - second)
    finally:
        backend.failing = False
        api.wait_settled()
        api.stop()
        backend.stop()
