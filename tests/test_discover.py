"""``ml4-target new`` (``python -m pytest_ml4.discover``) against running deployments, over real HTTP.

The vLLM deployment is the embedded simulator process serving a bundled target: what it serves is that target's
YAML, which the tests read as the oracle (never the discovery code). The Dynamo deployment is a local server
answering with a real Dynamo 1.6.1 frontend's recorded pages (fixtures/discover/README.md).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from checkout import FIXTURES_DIR, REPO_ROOT
from ml4_http_stub import Scripted, StubServer
from pytest_ml4_sim.deploy.fake_k8s import FakeKubeAPI
from pytest_ml4_sim.deploy.launcher import free_port
from pytest_ml4_sim.deploy.litellm import LiteLLMProxy
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.logs import EngineArgsLogged, FileLogReader, LogView
from pytest_ml4.stacks.litellm import ProxySettings
from pytest_ml4.target.model import Target, load_target

SIM_TARGET = "rtxpro6000-tp8"
KEY_VAR = "ML4_DISCOVER_TEST_KEY"
KEY = "sk-discover-" + secrets.token_hex(8)
HARDWARE = ["--hardware", "h200", "--gpus", "8"]
DISCOVER = FIXTURES_DIR / "discover"


@pytest.fixture(scope="module")
def oracle() -> Target:
    return load_target(SIM_TARGET)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """The simulator (``python -m pytest_ml4_sim.deploy.sim_cli``) serving the RTX PRO target, its key from KEY_VAR's
    twin: the target names LLM_API_KEY, set for the child only."""
    var = load_target(SIM_TARGET).endpoint.api_key_env or "LLM_API_KEY"
    with SimServer(SIM_TARGET, log_file=tmp_path_factory.mktemp("sim") / "engine.log", env={var: KEY}) as server:
        yield server


def run_new(team: Path, *args: str, key: str | None = KEY,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # No kubeconfig of the machine's: only a test's own fake API server is ever asked.
    env = {**{k: v for k, v in os.environ.items() if k != KEY_VAR}, "KUBECONFIG": str(team / "no-kubeconfig"),
           **(env or {})}
    if key is not None:
        env[KEY_VAR] = key
    return subprocess.run([sys.executable, "-m", "pytest_ml4.discover", "new", *args], cwd=team, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def text_of(path: Path) -> str:
    return path.read_text()


def line_of(text: str, key: str) -> str:
    """The first line of the YAML text that sets ``key`` (with its provenance comment)."""
    return next(ln for ln in text.splitlines() if ln.strip().startswith(f"{key}:"))


def test_new_target_from_the_simulator(sim: SimServer, oracle: Target, tmp_path: Path) -> None:
    r = run_new(tmp_path, "mine", "--endpoint", sim.base_url, "--api-key-env", KEY_VAR, *HARDWARE,
                "--gpu", "NVIDIA H200 NVL")
    assert r.returncode == 0, r.stderr
    path = tmp_path / "targets" / "mine.yaml"
    target = load_target(path)
    served = oracle.serving.engine_served_model_name or oracle.serving.served_model_name
    assert target.serving.served_model_name == served
    assert target.engine.max_model_len == oracle.engine.max_model_len
    assert target.engine.version == oracle.engine.version
    assert (target.engine.block_size, target.engine.kv_cache_dtype, target.engine.gpu_memory_utilization) == (
        oracle.engine.block_size, oracle.engine.kv_cache_dtype, oracle.engine.gpu_memory_utilization)
    assert target.engine.model_path == oracle.engine.model_path
    assert (target.serving.stack, target.topology.kind) == ("vllm", "single_node")
    assert target.endpoint.api_key_env == KEY_VAR and target.endpoint.requires_api_key is True
    assert (target.hardware.family, target.hardware.count, target.hardware.gpu) == ("h200", 8, "NVIDIA H200 NVL")
    assert target.hardware.memory_bandwidth_tb_s is None  # a spec sheet's figure would feed the roofline

    text = path.read_text()
    assert f"# discovered: {sim.base_url}/models" in line_of(text, "served_model_name")
    assert "# discovered:" in line_of(text, "block_size") and "vllm:cache_config_info" in line_of(text, "block_size")
    assert "# flag --gpus" in line_of(text, "count")
    assert "# estimate:" in line_of(text, "max_num_seqs")
    header = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert any("engine.max_num_seqs" in ln for ln in header), header
    assert "engine.max_num_seqs" in r.stdout and "not discovered" in r.stdout
    assert "gates.knee_not_before: not set" in r.stdout and "hardware.memory_bandwidth_tb_s: not set" in r.stdout
    assert "# flag --gpu" in line_of(text, "gpu") and "# estimate:" in line_of(text, "memory_per_gpu_gib")
    assert KEY not in text + r.stdout + r.stderr


def test_the_engine_log_gives_the_flags(sim: SimServer, oracle: Target, tmp_path: Path) -> None:
    r = run_new(tmp_path, "mine", "--endpoint", sim.base_url, "--api-key-env", KEY_VAR, *HARDWARE,
                "--log-file", str(sim.log_file))
    assert r.returncode == 0, r.stderr
    path = tmp_path / "targets" / "mine.yaml"
    target = load_target(path)
    want = oracle.engine
    assert (target.engine.max_num_seqs, target.engine.max_num_batched_tokens) == (want.max_num_seqs,
                                                                                  want.max_num_batched_tokens)
    assert (target.engine.reasoning_parser, target.engine.tool_call_parser) == (want.reasoning_parser,
                                                                                want.tool_call_parser)
    assert target.engine.speculative == want.speculative
    assert target.topology.tensor_parallel == oracle.topology.tensor_parallel
    assert (target.logs.kind, target.logs.path) == ("file", str(sim.log_file))
    text = path.read_text()
    assert "non-default args (max_num_seqs)" in line_of(text, "max_num_seqs")
    assert "engine.max_num_seqs" not in r.stdout
    assert KEY not in text + r.stdout


def test_an_argument_the_log_leaves_out_has_vllms_default(sim: SimServer, tmp_path: Path) -> None:
    """Real vLLM 0.32's line (fixtures/logs) names no speculative_config: the engine runs none."""
    log = FIXTURES_DIR / "logs" / "real-vllm-0.32-startup.log"
    r = run_new(tmp_path, "mine", "--endpoint", sim.base_url, "--api-key-env", KEY_VAR, *HARDWARE, "--log-file", str(log))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "targets" / "mine.yaml").read_text()
    assert load_target(tmp_path / "targets" / "mine.yaml").engine.speculative is None
    assert "no speculative_config, vLLM's default" in line_of(text, "speculative")


def test_the_real_non_default_args_line_is_parsed() -> None:
    log = FIXTURES_DIR / "logs" / "real-vllm-0.32-startup.log"
    event = LogView(FileLogReader(log).read(), str(log)).last(EngineArgsLogged)
    assert event is not None
    assert (event.args["tool_call_parser"], event.args["max_model_len"]) == ("mistral", 2048)
    assert event.args["served_model_name"] == ["tiny-mistral"]


def test_refuses_to_overwrite_without_force(sim: SimServer, tmp_path: Path) -> None:
    path = tmp_path / "targets" / "mine.yaml"
    path.parent.mkdir()
    path.write_text("# mine, by hand\n")
    args = ("mine", "--endpoint", sim.base_url, "--api-key-env", KEY_VAR, *HARDWARE)
    r = run_new(tmp_path, *args)
    assert r.returncode == 2 and path.read_text() == "# mine, by hand\n"
    refusal = f"ml4-target: error: {Path('targets') / 'mine.yaml'} exists: pass --force to overwrite it"
    assert r.stderr.strip().splitlines() == [refusal]
    assert run_new(tmp_path, *args, "--force").returncode == 0
    assert load_target(path).name == "mine"


@pytest.mark.parametrize("case", ["wrong key", "unset variable", "unreachable"])
def test_bad_input_fails_in_one_line(case: str, sim: SimServer, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1" if case == "unreachable" else sim.base_url
    key = {"wrong key": "sk-wrong-" + secrets.token_hex(4), "unset variable": None}.get(case, KEY)
    r = run_new(tmp_path, "mine", "--endpoint", url, "--api-key-env", KEY_VAR, *HARDWARE, key=key)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ml4-target: error:"), r.stderr
    named = {"wrong key": [f"{url}/models", KEY_VAR, "refused"], "unset variable": [KEY_VAR, "not set"],
             "unreachable": [f"{url}/models", "unreachable"]}[case]
    assert all(n in lines[0] for n in named), lines[0]
    assert not (tmp_path / "targets" / "mine.yaml").exists()
    assert KEY not in r.stderr + r.stdout


def test_an_unknown_family_needs_its_figures(sim: SimServer, tmp_path: Path) -> None:
    r = run_new(tmp_path, "mine", "--endpoint", sim.base_url, "--api-key-env", KEY_VAR, "--hardware", "x9000",
                "--gpus", "8")
    assert r.returncode == 2
    assert "--hardware x9000" in r.stderr and "--gpu-memory-gib" in r.stderr and len(r.stderr.splitlines()) == 1


@pytest.fixture
def dynamo_frontend() -> Iterator[StubServer]:
    """A frontend answering with a real Dynamo 1.6.1 frontend's recorded /health, /v1/models and /metrics."""
    routes = {"/health": Scripted(200, "application/json",
                                  [(DISCOVER / "dynamo-1.6.1-health-2workers.json").read_bytes()]),
              "/v1/models": Scripted(200, "application/json", [(DISCOVER / "dynamo-1.6.1-models.json").read_bytes()]),
              "/metrics": Scripted(200, "text/plain; charset=utf-8",
                                   [(DISCOVER / "dynamo-1.6.1-frontend-metrics.txt").read_bytes()])}
    with StubServer(routes) as server:
        yield server


def test_a_dynamo_frontend_gives_stack_topology_and_engine_config(dynamo_frontend: StubServer,
                                                                   tmp_path: Path) -> None:
    r = run_new(tmp_path, "dyn", "--endpoint", dynamo_frontend.base_url, *HARDWARE)
    assert r.returncode == 0, r.stderr
    path = tmp_path / "targets" / "dyn.yaml"
    target = load_target(path)
    # The recording: two workers on `generate` (health-2workers.json); context_window 16384 (models.json);
    # dynamo_frontend_model_max_num_seqs 16, _kv_cache_block_size 128, _max_num_batched_tokens 4096 (metrics).
    assert (target.serving.stack, target.topology.kind, target.topology.workers) == ("dynamo+vllm", "agg", 2)
    assert target.topology.tensor_parallel == 4  # 8 GPUs over 2 workers, an estimate
    assert target.serving.served_model_name == "tiny-mistral"
    assert target.engine.max_model_len == 16384
    assert (target.engine.max_num_seqs, target.engine.block_size, target.engine.max_num_batched_tokens) == (
        16, 128, 4096)
    assert target.logs.kind == "kubernetes"
    assert (target.control.kind, target.control.dgd, target.control.namespace_env) == ("kubernetes", "dyn",
                                                                                        "ML4_NAMESPACE")
    assert "# estimate:" in line_of(text_of(path), "dgd")
    assert target.endpoint.requires_api_key is False
    text = path.read_text()
    assert "/health" in line_of(text, "workers") and "# discovered:" in line_of(text, "workers")
    assert "dynamo_frontend_model_max_num_seqs" in line_of(text, "max_num_seqs")
    assert "(context_window)" in line_of(text, "max_model_len")
    assert "# estimate:" in line_of(text, "dynamo_version") and "serving.dynamo_version" in r.stdout
    assert "/version: HTTP 404" in r.stdout  # the frontend has no /version: listed, not guessed silently


@contextmanager
def fake_cluster(folder: Path, target: str, manifest_text: str | None = None
                 ) -> Iterator[tuple[FakeKubeAPI, dict[str, str]]]:
    """A fake Kubernetes API holding a bundled target's DGD (its manifest, or ``manifest_text``) in namespace llm,
    and a kubeconfig naming it."""
    text = manifest_text or (BUNDLED_TARGETS_DIR / target / "deploy.yaml").read_text()
    dgd = next(d for d in yaml.safe_load_all(text) if d.get("kind") == "DynamoGraphDeployment")
    api = FakeKubeAPI()
    api.add_dgd("llm", dgd["metadata"]["name"], dgd["spec"])
    api.start()
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": api.url}}], "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}))
    try:
        yield api, {"KUBECONFIG": str(kubeconfig)}
    finally:
        api.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeKubeAPI, dict[str, str]]]:
    with fake_cluster(tmp_path, "gb300-agg") as made:
        yield made


def test_the_dgd_gives_replicas_worker_flags_and_release(dynamo_frontend: StubServer, cluster: tuple[FakeKubeAPI,
                                                         dict[str, str]], tmp_path: Path) -> None:
    api, env = cluster
    oracle = load_target("gb300-agg")
    r = run_new(tmp_path, "dyn", "--endpoint", dynamo_frontend.base_url, *HARDWARE, "--dgd", "mistral-large-4-agg-gb300",
                "--namespace", "llm", env=env)
    assert r.returncode == 0, r.stderr
    assert ("GET", "/apis/nvidia.com/v1beta1/namespaces/llm/dynamographdeployments/mistral-large-4-agg-gb300") in \
        api.calls
    path = tmp_path / "targets" / "dyn.yaml"
    target = load_target(path)
    assert (target.topology.kind, target.topology.workers) == (oracle.topology.kind, oracle.topology.workers)
    assert target.topology.tensor_parallel == oracle.topology.tensor_parallel
    assert target.serving.dynamo_version == oracle.serving.dynamo_version
    assert target.engine.speculative == oracle.engine.speculative
    assert (target.engine.gpu_memory_utilization, target.engine.kv_offloading_size_gib) == (
        oracle.engine.gpu_memory_utilization, oracle.engine.kv_offloading_size_gib)
    assert target.engine.disable_hybrid_kv_cache_manager is True
    assert (target.logs.kind, target.control.dgd, target.control.namespace) == (
        "kubernetes", "mistral-large-4-agg-gb300", "llm")
    text = path.read_text()
    assert "# discovered: DGD llm/mistral-large-4-agg-gb300" in line_of(text, "tensor_parallel")
    assert "worker image tag" in line_of(text, "dynamo_version")
    assert "serving.dynamo_version" not in r.stdout


def test_an_unknown_dgd_fails_in_one_line(dynamo_frontend: StubServer, cluster: tuple[FakeKubeAPI, dict[str, str]],
                                          tmp_path: Path) -> None:
    r = run_new(tmp_path, "dyn", "--endpoint", dynamo_frontend.base_url, *HARDWARE, "--dgd", "nope", "--namespace",
                "llm", env=cluster[1])
    assert r.returncode == 2
    refusal = "ml4-target: error: --dgd nope --namespace llm: the Kubernetes API answered HTTP 404 Not Found"
    assert r.stderr.strip().splitlines() == [refusal]


def test_a_disaggregated_dgd_sets_both_roles(dynamo_frontend: StubServer, tmp_path: Path) -> None:
    """gb300-disagg's DGD (2 prefill + 2 decode) behind the recorded frontend that lists two workers: the DGD's
    replicas are written, the difference is listed."""
    oracle = load_target("gb300-disagg")
    assert oracle.prefill_engine is not None
    with fake_cluster(tmp_path, "gb300-disagg") as (_api, env):
        r = run_new(tmp_path, "dis", "--endpoint", dynamo_frontend.base_url, "--hardware", "gb300", "--gpus", "16",
                    "--dgd", "mistral-large-4-disagg-gb300", "--namespace", "llm", env=env)
    assert r.returncode == 0, r.stderr
    target = load_target(tmp_path / "targets" / "dis.yaml")
    assert (target.topology.kind, target.topology.prefill_workers, target.topology.decode_workers) == (
        "disagg", oracle.topology.prefill_workers, oracle.topology.decode_workers)
    assert target.prefill_engine is not None
    assert target.prefill_engine.max_num_batched_tokens == oracle.prefill_engine.max_num_batched_tokens
    assert target.prefill_engine.speculative == oracle.prefill_engine.speculative
    assert set(target.endpoint.worker_metrics_url_env) == {"prefill", "decode"}
    assert "lists 2 worker instance(s) now, the DGD declares 4" in r.stdout


def test_behind_a_litellm_proxy(sim: SimServer, oracle: Target, tmp_path: Path) -> None:
    """The real LiteLLM proxy (the RTX PRO target's config) in front of the simulator: the alias from the proxy,
    the engine's served name and context from the engine's server, the retries from the config file."""
    assert oracle.serving.proxy is not None
    settings = ProxySettings.from_target(oracle, sim.base_url)
    with LiteLLMProxy(settings, tmp_path / "proxy", env={**os.environ, settings.key_env: KEY}) as proxy:
        r = run_new(tmp_path, "mine", "--endpoint", proxy.base_url, "--api-key-env", KEY_VAR, *HARDWARE,
                    "--metrics-url", f"{sim.url}/metrics", "--litellm-config", str(proxy.config_file))
    assert r.returncode == 0, r.stderr
    target = load_target(tmp_path / "targets" / "mine.yaml")
    assert target.serving.stack == "vllm+litellm" and target.serving.proxy is not None
    assert target.serving.proxy.model_alias == oracle.serving.proxy.model_alias == target.serving.served_model_name
    assert target.serving.engine_served_model_name == oracle.serving.engine_served_model_name
    assert (target.serving.proxy.num_retries, target.serving.proxy.max_retries) == (
        oracle.serving.proxy.num_retries, oracle.serving.proxy.max_retries)
    assert target.engine.max_model_len == oracle.engine.max_model_len
    assert target.engine.version == oracle.engine.version
    assert target.endpoint.metrics_url_env == "ML4_MINE_METRICS_URL"
    text = (tmp_path / "targets" / "mine.yaml").read_text()
    assert f"# discovered: {sim.url}/v1/models" in line_of(text, "max_model_len")
    assert KEY not in text + r.stdout + r.stderr


def test_credentials_in_the_url_never_reach_the_file(dynamo_frontend: StubServer, tmp_path: Path) -> None:
    secret = "pw-" + secrets.token_hex(6)
    url = dynamo_frontend.base_url.replace("http://", f"http://ops:{secret}@")
    r = run_new(tmp_path, "dyn", "--endpoint", url, *HARDWARE)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "targets" / "dyn.yaml").read_text()
    assert secret not in text + r.stdout + r.stderr
    assert load_target(tmp_path / "targets" / "dyn.yaml").endpoint.default_url == dynamo_frontend.base_url
    assert "set ML4_DYN_URL to the full URL" in line_of(text, "default_url")


def test_the_written_target_runs_the_smoke_gate(sim: SimServer, tmp_path: Path) -> None:
    """What `ml4-target new` writes is a target the suites run with: the smoke gate against the same simulator."""
    assert run_new(tmp_path, "mine", "--endpoint", sim.base_url, "--api-key-env", KEY_VAR, *HARDWARE,
                   "--log-file", str(sim.log_file)).returncode == 0
    env = {**os.environ, KEY_VAR: KEY}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--target", "mine",
                        f"--target-dir={tmp_path / 'targets'}", f"--ml4-reports={tmp_path / 'reports'}",
                        str(REPO_ROOT / "suites"), "-m", "smoke"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", r.stdout) and not re.search(r"\b\d+ failed\b", r.stdout), r.stdout[-3000:]


def test_a_dgd_image_of_an_unknown_release_is_written_and_listed(dynamo_frontend: StubServer, tmp_path: Path) -> None:
    text = (BUNDLED_TARGETS_DIR / "gb300-agg" / "deploy.yaml").read_text()
    known = load_target("gb300-agg").serving.dynamo_version
    assert known and f":{known}" in text
    with fake_cluster(tmp_path, "gb300-agg", text.replace(f":{known}", ":9.9.0")) as (_api, env):
        r = run_new(tmp_path, "dyn", "--endpoint", dynamo_frontend.base_url, *HARDWARE, "--dgd",
                    "mistral-large-4-agg-gb300", "--namespace", "llm", env=env)
    assert r.returncode == 0, r.stderr
    assert load_target(tmp_path / "targets" / "dyn.yaml").serving.dynamo_version == "9.9.0"
    assert "serving.dynamo_version 9.9.0: in no versions table" in r.stdout
