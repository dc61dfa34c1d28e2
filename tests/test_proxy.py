"""The LiteLLM proxy runner: the generated config, and a real proxy in front of the simulator."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from pytest_ml4_sim.deploy.litellm import LiteLLMProxy, litellm_executable
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.stacks.litellm import (
    ATTEMPTED_RETRIES_HEADER,
    ProxyConfigError,
    ProxySettings,
    attempted_retries,
    render_config,
)
from pytest_ml4.target.model import load_target

TARGET = load_target("rtxpro6000-tp8")
KEY_ENV = TARGET.endpoint.api_key_env or "LLM_API_KEY"


def test_config_points_alias_at_backend_with_chosen_retries() -> None:
    settings = ProxySettings.from_target(TARGET, "http://127.0.0.1:9/v1", num_retries=0, max_retries=1)
    cfg = render_config(settings)
    (entry,) = [m for m in cfg["model_list"] if m["model_name"] == "ml4"]
    params = entry["litellm_params"]
    assert params["api_base"] == "http://127.0.0.1:9/v1"
    assert params["model"] == "hosted_vllm/ml4"
    assert params["max_retries"] == 1
    assert cfg["litellm_settings"]["num_retries"] == 0
    # The seed's settings survive (drop_params true, max_input_tokens 360448).
    assert cfg["litellm_settings"]["drop_params"] is True
    assert entry["model_info"]["max_input_tokens"] == 360448
    # Keys are references LiteLLM resolves itself, never values.
    assert params["api_key"] == f"os.environ/{KEY_ENV}"
    assert cfg["general_settings"]["master_key"] == f"os.environ/{KEY_ENV}"


def test_every_route_to_the_alias_engine_follows_it_to_the_backend(tmp_path: Path) -> None:
    """A second route to the same engine (the kill matrix's catch-all "*" config) is pointed at the backend started
    here too; a route to another engine keeps its own address."""
    cfg_file = tmp_path / "c.yaml"
    engine = {"model": "hosted_vllm/ml4", "api_base": "http://127.0.0.1:8000/v1"}
    cfg_file.write_text(yaml.safe_dump({"model_list": [
        {"model_name": "ml4", "litellm_params": dict(engine)},
        {"model_name": "*", "litellm_params": dict(engine)},
        {"model_name": "other", "litellm_params": {"model": "hosted_vllm/x", "api_base": "http://10.0.0.9/v1"}}]}))
    settings = ProxySettings(base_config=cfg_file, backend_base_url="http://127.0.0.1:9/v1", alias="ml4",
                             backend_model="served", key_env=KEY_ENV)
    routes = {m["model_name"]: m["litellm_params"] for m in render_config(settings)["model_list"]}
    for name in ("ml4", "*"):
        assert routes[name]["api_base"] == "http://127.0.0.1:9/v1", name
        assert routes[name]["model"] == "hosted_vllm/served", name
        assert routes[name]["api_key"] == f"os.environ/{KEY_ENV}", name
    assert routes["other"] == {"model": "hosted_vllm/x", "api_base": "http://10.0.0.9/v1"}


def test_target_retry_values_are_the_default() -> None:
    settings = ProxySettings.from_target(TARGET, "http://127.0.0.1:9/v1")
    proxy = TARGET.serving.proxy
    assert proxy is not None
    assert (settings.num_retries, settings.max_retries) == (proxy.num_retries, proxy.max_retries)
    assert settings.with_retries(0).num_retries == 0


def test_unknown_alias_and_missing_file_are_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model_list": [{"model_name": "other", "litellm_params": {}}]}))
    settings = ProxySettings(base_config=cfg, backend_base_url="http://x/v1", alias="ml4", backend_model="ml4",
                             key_env=KEY_ENV)
    with pytest.raises(ProxyConfigError, match="no model_list entry named 'ml4'"):
        render_config(settings)
    with pytest.raises(ProxyConfigError, match="not found"):
        render_config(ProxySettings(base_config=tmp_path / "nope.yaml", backend_base_url="http://x/v1", alias="ml4",
                                    backend_model="ml4", key_env=KEY_ENV))


def test_attempted_retries_header() -> None:
    assert attempted_retries({ATTEMPTED_RETRIES_HEADER: "2"}) == 2
    assert attempted_retries({}) is None
    assert attempted_retries({ATTEMPTED_RETRIES_HEADER: "x"}) is None


@pytest.fixture(scope="module")
def key(rtx_api_key: str) -> str:
    return rtx_api_key


@pytest.fixture(scope="module")
def proxy(key: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiteLLMProxy]:
    litellm_executable()  # a missing install is an error with the install command, not a skip
    work = tmp_path_factory.mktemp("proxy")
    with SimServer(TARGET, log_file=work / "engine.log") as sim:
        with LiteLLMProxy(ProxySettings.from_target(TARGET, sim.base_url), work / "proxy") as px:
            yield px


def test_real_proxy_serves_the_alias_and_keeps_keys_out(proxy: LiteLLMProxy, key: str) -> None:
    body = {"model": "ml4", "messages": [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}],
            "max_tokens": 256, "min_tokens": 8}
    r = httpx.post(proxy.base_url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert "42" in r.json()["choices"][0]["message"]["content"]
    assert r.json()["usage"]["completion_tokens"] >= 8  # min_tokens passed through (drop_params keeps vLLM extras)
    assert attempted_retries(r.headers) == 0
    assert key not in proxy.config_file.read_text()
    assert key not in proxy.log_file.read_text(errors="replace")
    assert key not in repr(proxy)
    assert proxy.pid is not None and str(proxy.pid) in repr(proxy)


def test_wrong_key_is_refused(proxy: LiteLLMProxy) -> None:
    r = httpx.post(proxy.base_url + "/chat/completions", json={"model": "ml4", "messages": []},
                   headers={"Authorization": "Bearer sk-wrong"}, timeout=30)
    assert r.status_code in (400, 401), r.text


def test_stop_ends_the_process(key: str, tmp_path: Path) -> None:
    settings = ProxySettings.from_target(TARGET, "http://127.0.0.1:9/v1", num_retries=0)
    px = LiteLLMProxy(settings, tmp_path).start()
    pid = px.pid
    assert pid is not None and px.alive()
    px.stop()
    assert not px.alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
