"""The Kubernetes restart controller and pod-log reader against the fake API server over a simulated Dynamo
deployment (gb300-agg: a frontend and two worker processes, each a pod)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pytest_ml4_sim.deploy.dynamo import DynamoSim
from pytest_ml4_sim.deploy.fake_k8s import FakeKubeAPI, serve_dynamo

from pytest_ml4.control import RestartError, RestartTimeout
from pytest_ml4.control.k8s_api import (
    api_client,
    dgd_status,
    list_pods,
    pod_ready,
    selectors,
)
from pytest_ml4.control.k8s_restart import KubernetesController
from pytest_ml4.logs import LogView, ServerStart
from pytest_ml4.logs.kubernetes import KubernetesLogReader
from pytest_ml4.target.model import load_target

TARGET = load_target("gb300-agg")
NS = "ml4-test"
DGD = TARGET.control.dgd or "dgd"
MODEL = TARGET.serving.served_model_name


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DynamoSim, FakeKubeAPI]]:
    dsim = DynamoSim(TARGET, log_file=tmp_path_factory.mktemp("dyn") / "engine.log").start()
    api = serve_dynamo(dsim, NS, DGD)
    try:
        yield dsim, api
    finally:
        api.wait_settled()
        api.stop()
        dsim.stop()


def _ctl(deployment: tuple[DynamoSim, FakeKubeAPI], **kw: Any) -> KubernetesController:
    dsim, api = deployment
    return KubernetesController(api_client(api.url), NS, DGD, frontend_url=dsim.url, base_url=dsim.base_url,
                                model=MODEL, **{"timeout_s": 60.0, **kw})


def test_role_selectors_cover_native_and_legacy_labels() -> None:
    assert selectors("d", "prefill") == ["nvidia.com/dynamo-graph-deployment-name=d,nvidia.com/dynamo-component-type=prefill",
                                         "nvidia.com/dynamo-graph-deployment-name=d,nvidia.com/dynamo-component-type="
                                         "worker,nvidia.com/dynamo-sub-component-type=prefill"]
    with pytest.raises(ValueError, match="unknown role"):
        selectors("d", "gpu")


def test_rolling_restart_replaces_every_worker_pod(deployment: tuple[DynamoSim, FakeKubeAPI]) -> None:
    ctl = _ctl(deployment, rolling=True)
    before = {p.metadata.name for p in ctl.pods("workers")}
    assert len(before) == 2
    said: list[str] = []
    result = ctl.restart(progress=said.append)
    after = {p.metadata.name for p in ctl.pods("workers")}
    assert not before & after and len(after) == 2
    assert sorted(result.details["deleted_pods"]["workers"]) == sorted(before)
    assert [s.what for s in result.steps][-2:] == ["frontend /health 200", f"{MODEL} in /v1/models"]
    assert any("waiting for replacement of" in m for m in said)
    assert dgd_status(ctl.custom, NS, DGD).serving


def test_deleting_all_workers_hides_the_model_until_they_serve(deployment: tuple[DynamoSim, FakeKubeAPI]) -> None:
    dsim, _ = deployment
    ctl = _ctl(deployment)
    ctl.delete_pods("worker")
    seen = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ids = [m["id"] for m in httpx.get(dsim.base_url + "/models", timeout=5).json()["data"]]
        seen.add(MODEL in ids)
        status = dgd_status(ctl.custom, NS, DGD)
        seen.add(status.state)
        if False in seen and MODEL in ids:
            break
        time.sleep(0.05)
    assert False in seen and "pending" in seen, seen
    steps = ctl.wait_ready()
    # The old workers leave (unlisted by the frontend), then their replacements register.
    assert [s.what for s in steps][:2] == [ctl.LEAVE_CHECK, "replacement pods Running and Ready"]


def test_nothing_to_delete_and_timeouts_are_errors(deployment: tuple[DynamoSim, FakeKubeAPI]) -> None:
    with pytest.raises(RestartError, match="no prefill pods found"):
        _ctl(deployment, roles=("prefill",)).restart()
    ctl = _ctl(deployment, timeout_s=0.3)
    with pytest.raises(RestartTimeout, match="(old pods gone and their workers unlisted by the frontend|replacement "
                                             "pods Running and Ready); last seen: .* \\(phase: waiting for the "):
        ctl.restart()
    deployment[1].wait_settled()
    ctl.wait_ready(60)


def test_log_reader_reads_every_pod_since_boot(deployment: tuple[DynamoSim, FakeKubeAPI]) -> None:
    dsim, api = deployment
    reader = KubernetesLogReader(api_client(api.url), NS, DGD, role="workers")
    records = reader.read()
    sources = {r.source.split("/")[0] for r in records}
    assert sources == {p.metadata.name for p in reader.pods()}
    assert all(r.time is not None for r in records)
    view = LogView(reader.since_last_boot(), reader.describe())
    assert len(view.all(ServerStart)) >= len(dsim.workers)  # one boot per worker pod
    current = "\n".join(r.text for r in view.records)
    for w in dsim.workers:
        assert f"pid={w.pid}" in current


def test_log_reader_returns_the_previous_container_after_a_crash(deployment: tuple[DynamoSim, FakeKubeAPI]) -> None:
    dsim, api = deployment
    client = api_client(api.url)
    reader = KubernetesLogReader(client, NS, DGD, role="worker")
    worker = dsim.workers[0]
    old_pid = worker.pid
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)  # the engine dies on its own: the kubelet restarts the container in place
    deadline = time.monotonic() + 30
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(client)
    while time.monotonic() < deadline:
        pods = list_pods(core, NS, DGD, "worker")
        crashed = [p for p in pods if p.status.container_statuses[0].restart_count > 0]
        if crashed and pod_ready(crashed[0]) and worker.pid not in (None, old_pid):
            break
        time.sleep(0.1)
    assert worker.pid not in (None, old_pid), "the fake kubelet did not restart the crashed worker"
    text = "\n".join(r.text for r in reader.read())
    assert f"pid={old_pid}" in text and f"pid={worker.pid}" in text
    current = "\n".join(r.text for r in reader.since_last_boot())
    assert f"pid={old_pid}" not in current and f"pid={worker.pid}" in current
    api.wait_settled()


def test_fake_api_saw_only_the_calls_the_plugin_makes(deployment: tuple[DynamoSim, FakeKubeAPI]) -> None:
    import re

    allowed = [("GET", rf"/api/v1/namespaces/{NS}/pods"), ("GET", rf"/api/v1/namespaces/{NS}/pods/[^/]+"),
               ("DELETE", rf"/api/v1/namespaces/{NS}/pods/[^/]+"), ("GET", rf"/api/v1/namespaces/{NS}/pods/[^/]+/log"),
               ("GET", rf"/apis/nvidia.com/v1beta1/namespaces/{NS}/dynamographdeployments/{DGD}")]
    for method, path in deployment[1].calls:
        assert any(m == method and re.fullmatch(rx, path) for m, rx in allowed), (method, path)


def test_reader_for_target_needs_a_namespace() -> None:
    # The reader for a target needs a namespace: one clear error, not a traceback from the client.
    from pytest_ml4.logs import LogReadError

    with pytest.raises(LogReadError, match="namespace"):
        KubernetesLogReader.for_target(TARGET, env={}, api=api_client("http://127.0.0.1:9"))
