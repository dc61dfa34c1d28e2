"""``--perf-kube N`` without a cluster: the JobSet the real ``aiperf kube generate --no-operator``
renders for a target (golden), the preflight lint over it, and the submit -> follow -> fetch -> judge loop against
the project's fake Kubernetes API (``harness/pytest_ml4_sim/deploy/fake_k8s.py``), whose JobSet runner runs aiperf against the simulator as
the pods would. The fetched export is judged by the suite's own goodput gate.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from checkout import REPO_ROOT
from pytest_ml4_sim.deploy.fake_k8s import FakeKubeAPI
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.control.k8s_api import api_client
from pytest_ml4.perf import kube
from pytest_ml4.perf.export import ProfileExport
from pytest_ml4.perf.goodput import goodput_gate, goodput_of, workload_spec
from pytest_ml4.perf.runner import run_aiperf
from pytest_ml4.preflight.lint import lint_paths
from pytest_ml4.target.model import load_target

GOLDEN = REPO_ROOT / "fixtures" / "aiperf" / "kube" / "gb300-disagg-chat-4pods.json"
TARGET = "gb300-disagg"
JOB = kube.KubeJob("ml4-perf", "ml4-gb300-disagg-chat", 4, ("ml4-endpoint", "api-key"))
URL = "http://mistral-large-4-disagg-gb300-frontend.ml4.svc:8000/v1"


def spec_for(url: str = URL, **over: Any) -> Any:
    t = load_target(TARGET)
    spec = workload_spec(t, "chat", model=t.serving.served_model_name, url=url, rate=4.0, requests=40)
    return spec if not over else type(spec)(**{**spec.__dict__, **over})


def digest(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the golden pins: objects, worker pods, images, how the key reaches the pods, the run config."""
    js = kube.jobset_of(docs)
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    envs = {}
    for rj in js["spec"]["replicatedJobs"]:
        for c in rj["template"]["spec"]["template"]["spec"]["containers"]:
            for e in c.get("env") or []:
                if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]:
                    envs[e["name"]] = e["valueFrom"]["secretKeyRef"]
    return {"objects": [(d["kind"], d["metadata"]["name"]) for d in docs],
            "worker_pods": kube.worker_pods(js),
            "images": sorted({c["image"] for rj in js["spec"]["replicatedJobs"]
                              for c in rj["template"]["spec"]["template"]["spec"]["containers"]}),
            "secret_env": envs,
            "run_config": json.loads(cm["data"]["run_config.json"])["cfg"]}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("kube") / "chat.yaml"
    return out, kube.render(spec_for(), JOB, out)


def test_rendered_jobset_matches_the_golden(rendered: tuple[Path, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    got = json.loads(json.dumps(digest(docs)))
    if os.environ.get("ML4_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(GOLDEN.read_text()), "rendered JobSet differs from the golden (ML4_UPDATE_GOLDEN=1)"
    assert got["worker_pods"] == 4 and got["secret_env"]["AIPERF_INJECTED_API_KEY"] == {
        "name": "ml4-endpoint", "key": "api-key"}
    phase = got["run_config"]["phases"][0]
    assert (phase["type"], phase["rate"], got["run_config"]["slos"]["inter_token_latency"]) == ("poisson", 4.0, 30.0)


def test_the_key_is_only_a_secret_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-kube-" + os.urandom(6).hex()
    for name in ("OPENAI_API_KEY", "ML4_AIPERF_API_KEY", "AIPERF_INJECTED_API_KEY"):
        monkeypatch.setenv(name, key)   # an ambient key must not be picked up by the render either
    out = tmp_path / "chat.yaml"
    kube.render(spec_for(), JOB, out)
    text = out.read_text()
    assert key not in text and "secretKeyRef" in text


def test_preflight_lint_judges_the_rendered_run_and_finds_nothing(rendered: tuple[Path, list[dict[str, Any]]],
                                                                  tmp_path: Path) -> None:
    path, _ = rendered
    report = lint_paths([path], load_target(TARGET))
    assert [(d.kind, d.name) for d in report.documents] == [("perf-job", "aiperf-ml4-gb300-disagg-chat-config")]
    assert report.findings == []
    # Control: the same render with ignore_eos is caught, so the lint reads the rendered run config.
    bad = tmp_path / "bad.yaml"
    kube.render(spec_for(extra_inputs={"ignore_eos": True}, min_tokens=None), JOB, bad)
    assert {f.rule_id for f in lint_paths([bad], load_target(TARGET)).findings} >= {"aiperf-ignore-eos"}


def test_submit_follow_fetch_and_judge_on_the_fake_api(rendered: tuple[Path, list[dict[str, Any]]],
                                                       tmp_path: Path) -> None:
    _, docs = rendered
    target = load_target(TARGET)
    w = target.perf.workloads["chat"]
    seen: dict[str, Any] = {}
    with SimServer(target, log_file=tmp_path / "engine.log", env=dict(os.environ)) as sim:

        def run_pods(jobset: dict[str, Any], maps: dict[str, dict[str, Any]]) -> Path:
            # What the pods do: the run config of the ConfigMap they mount, against the deployment.
            [cfg] = [json.loads(m["data"]["run_config.json"])["cfg"] for m in maps.values()]
            seen["cfg"], seen["pods"] = cfg, kube.worker_pods(jobset)
            result = run_aiperf(spec_for(url=sim.base_url), tmp_path / "pods")
            assert result.ok, result.describe()
            return tmp_path / "pods"

        with FakeKubeAPI() as fake:
            fake.jobset_runner = run_pods
            api = api_client(fake.url)
            name = kube.submit(api, docs)
            assert kube.follow(api, JOB.namespace, name, timeout_s=300, poll_s=0.5) == "Completed"
            out = kube.fetch(api, JOB.namespace, name, tmp_path / "fetched")
            calls = list(fake.calls)
    assert seen["pods"] == 4 and seen["cfg"]["phases"][0]["rate"] == 4.0
    assert ("POST", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml4-perf/jobsets") in calls
    assert any(p.endswith("proxy/api/results/files/profile_export_aiperf.json") for _, p in calls)
    fetched = ProfileExport.load(out)
    assert fetched.raw == ProfileExport.load(tmp_path / "pods").raw, "the fetched export is the pods' export"
    gate = goodput_gate(goodput_of(fetched, "chat", 4.0, w.slo, target.perf.goodput_floor), w.slo)
    assert gate.passed, str(gate)


def test_failed_jobset_is_reported_with_its_name(rendered: tuple[Path, list[dict[str, Any]]]) -> None:
    _, docs = rendered

    def broken(jobset: dict[str, Any], maps: dict[str, dict[str, Any]]) -> Path:
        raise RuntimeError("image pull back-off")

    with FakeKubeAPI() as fake:
        fake.jobset_runner = broken
        api = api_client(fake.url)
        name = kube.submit(api, docs)
        with pytest.raises(kube.KubeRunError, match="JobSet ml4-perf/aiperf-ml4-gb300-disagg-chat failed:.*image pull"):
            kube.follow(api, JOB.namespace, name, timeout_s=30, poll_s=0.2)


def _counters(url: str) -> dict[str, float]:
    from pytest_ml4.evidence.metrics import scrape

    snap = scrape(url)
    return {n: snap.sum(n) for n in ("vllm:request_success_total", "vllm:generation_tokens_total")}


@pytest.mark.nightly
def test_multi_worker_run_agrees_with_single_worker(tmp_path: Path) -> None:
    """What the JobSet's N worker pods do, on one host: the same Poisson run with 4 aiperf workers and with 1.
    Both count every request and token the simulator's own counters count, and their latencies agree.
    Nightly: two extra aiperf runs (~1 min on 2 cores); the submit/fetch loop above runs in CI."""
    target = load_target(TARGET)
    figures = {}
    with SimServer(target, log_file=tmp_path / "engine.log", env=dict(os.environ)) as sim:
        for workers in (1, 4):
            before = _counters(sim.url + "/metrics")
            spec = spec_for(url=sim.base_url, extra_args=("--workers-max", str(workers)))
            run = run_aiperf(spec, tmp_path / f"w{workers}")
            after = _counters(sim.url + "/metrics")
            ex = run.require()
            served = {k: after[k] - before[k] for k in after}
            assert served["vllm:request_success_total"] == ex.request_count == 40, (workers, served)
            assert served["vllm:generation_tokens_total"] == ex.scalar("total_usage_completion_tokens"), (workers, served)
            figures[workers] = ex
    one, four = figures[1], figures[4]
    assert one.scalar("good_request_count") == four.scalar("good_request_count") == 40
    for metric in ("time_to_first_token", "inter_token_latency"):
        a, b = one.stat(metric, "p50"), four.stat(metric, "p50")
        assert abs(a - b) <= 0.25 * a, f"{metric} p50: 1 worker {a:.1f} ms, 4 workers {b:.1f} ms"
