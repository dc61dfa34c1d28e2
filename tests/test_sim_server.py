"""Simulator process, API key middleware, /metrics against the reference exposition, and the vLLM log lines."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pytest_ml4_sim.deploy.simulator import SimServer, SimServerError
from test_sim_support import FAST, stream_lines

from pytest_ml4.locations import data_file
from pytest_ml4.target.model import load_target

CHAT = {"messages": [{"role": "user", "content": "What is 17 + 25?"}]}
LOG_LINE = re.compile(r"^\((APIServer|EngineCore) pid=\d+\) (INFO|DEBUG|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d "
                      r"\[[\w.]+:\d+\] ")


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """rtxpro6000-tp8 needs an API key (LLM_API_KEY) and runs dspark speculative decoding (k=3)."""
    log = tmp_path_factory.mktemp("sim") / "sub" / "engine.log"
    overrides = {"sim": {**FAST["sim"], "extra": {"stats_interval_s": 0.3}}}
    with SimServer(load_target("rtxpro6000-tp8"), overrides=overrides, log_file=log,
                   env={"LLM_API_KEY": "sk-test-123"}) as s:
        yield s


def _auth(key: str = "sk-test-123", scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {key}"}


# --------------------------------------------------------------------------- API key middleware
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "sk-test-123"},
                                     {"Authorization": "Basic sk-test-123"}])
def test_missing_or_wrong_key_is_401(keyed: SimServer, headers: dict[str, str]) -> None:
    r = httpx.post(keyed.base_url + "/chat/completions", json=CHAT, headers=headers)
    assert (r.status_code, r.text) == (401, '{"error":"Unauthorized"}')
    assert httpx.get(keyed.base_url + "/models", headers=headers).status_code == 401


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_key_accepted_case_insensitive_scheme(keyed: SimServer, scheme: str) -> None:
    r = httpx.post(keyed.base_url + "/chat/completions", json={**CHAT, "model": "ml4"}, headers=_auth(scheme=scheme))
    assert r.status_code == 200 and "42" in r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("path", ["/health", "/ping", "/version", "/metrics", "/load"])
def test_unguarded_paths_stay_open(keyed: SimServer, path: str) -> None:
    assert httpx.get(keyed.url + path).status_code == 200


def test_key_never_in_argv_or_log(keyed: SimServer) -> None:
    # Refused requests first (the key in a wrong scheme, a wrong key, the key in the query): none is logged.
    for headers, query in (({"Authorization": "Basic sk-test-123"}, ""), (_auth("sk-wrong-456"), ""),
                           ({}, "?api_key=sk-test-123")):
        r = httpx.post(keyed.base_url + "/chat/completions" + query, json=CHAT, headers=headers)
        assert r.status_code == 401
    assert httpx.post(keyed.base_url + "/chat/completions", json={**CHAT, "model": "ml4"},
                      headers=_auth()).status_code == 200
    assert not any("sk-test-123" in a for a in keyed.argv())
    log = keyed.log_file.read_text()
    assert "sk-test-123" not in log and "sk-wrong-456" not in log
    assert '"POST /v1/chat/completions' in log and " 401 " in log  # the refusals are logged, without the key


# --------------------------------------------------------------------------- metrics
def _families(text: str) -> dict[str, tuple[str, str]]:
    return {f.name: (f.type, f.documentation) for f in text_string_to_metric_families(text)
            if f.name.startswith("vllm:")}


def test_metrics_families_match_reference(keyed: SimServer) -> None:
    httpx.post(keyed.base_url + "/chat/completions", json=CHAT, headers=_auth())
    r = httpx.get(keyed.url + "/metrics")
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    ref = _families(data_file("vllm", "metrics-0.33.txt").read_text())
    assert _families(r.text) == ref
    ref_order = [l for l in data_file("vllm", "metrics-0.33.txt").read_text().splitlines() if l.startswith("# TYPE vllm:")]
    assert [l for l in r.text.splitlines() if l.startswith("# TYPE vllm:")] == ref_order


def test_metric_labels_and_values_follow_traffic(keyed: SimServer) -> None:
    before = httpx.get(keyed.url + "/metrics").text
    for _ in range(2):
        httpx.post(keyed.base_url + "/chat/completions", json=CHAT, headers=_auth())
    text = httpx.get(keyed.url + "/metrics").text

    def value(t: str, name: str) -> float:
        m = re.search(rf'^{re.escape(name)}{{engine="0",model_name="ml4"}} (\S+)$', t, re.MULTILINE)
        assert m, name
        return float(m.group(1))

    assert value(text, "vllm:generation_tokens_total") > value(before, "vllm:generation_tokens_total")
    assert value(text, "vllm:prompt_tokens_total") >= value(before, "vllm:prompt_tokens_total") + 2
    assert value(text, "vllm:time_to_first_token_seconds_count") >= 2
    assert re.search(r'^vllm:request_success_total\{engine="0",finished_reason="stop",model_name="ml4"\} [1-9]',
                     text, re.MULTILINE)
    positions = re.findall(r'vllm:spec_decode_num_accepted_tokens_per_pos_total\{.*position="(\d)"\}', text)
    assert positions == ["0", "1", "2"]
    drafts = value(text, "vllm:spec_decode_num_drafts_total")
    accepted = value(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and 1.0 <= 1 + accepted / drafts <= 4.0
    info = re.search(r"^vllm:cache_config_info\{(.*)\} 1\.0$", text, re.MULTILINE)
    assert info and 'cache_dtype="fp8_ds_mla"' in info.group(1) and 'block_size="64"' in info.group(1)
    assert 'gpu_memory_utilization="0.97"' in info.group(1)


# --------------------------------------------------------------------------- log lines
def test_log_has_boot_server_and_uvicorn_lines(keyed: SimServer) -> None:
    httpx.post(keyed.base_url + "/chat/completions", json=CHAT, headers=_auth())
    text = keyed.log_file.read_text()
    assert "Using fp8 data type to store kv cache." in text
    assert re.search(r"Available KV cache memory: [\d.]+ GiB", text)
    assert re.search(r"GPU KV cache size: [\d,]+ tokens, Maximum concurrency for 256,000 tokens per request: "
                     r"[\d.]+x", text)
    assert re.search(r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ s", text)
    assert "INFO:     Application startup complete." in text
    assert re.search(r'INFO:     127\.0\.0\.1:\d+ - "POST /v1/chat/completions HTTP/1\.1" 200 OK', text)
    vllm_lines = [l for l in text.splitlines() if l.startswith("(")]
    assert vllm_lines and all(LOG_LINE.match(l) for l in vllm_lines)


def test_periodic_stats_and_spec_decode_lines(keyed: SimServer) -> None:
    httpx.post(keyed.base_url + "/chat/completions", json={**CHAT, "min_tokens": 200, "max_tokens": 300},
               headers=_auth())
    deadline = time.monotonic() + 5
    stats = spec = None
    while time.monotonic() < deadline and not (stats and spec):
        text = keyed.log_file.read_text()
        stats = re.search(r"\[loggers\.py:\d+\] Engine 000: Avg prompt throughput: [\d.]+ tokens/s, Avg generation "
                          r"throughput: [\d.]+ tokens/s, Running: \d+ reqs, Waiting: \d+ reqs, GPU KV cache usage: "
                          r"[\d.]+%, Prefix cache hit rate: [\d.]+%", text)
        spec = re.search(r"SpecDecoding metrics: Mean acceptance length: ([\d.]+), Accepted throughput: [\d.]+ "
                         r"tokens/s, Drafted throughput: [\d.]+ tokens/s, Accepted: \d+ tokens, Drafted: \d+ tokens, "
                         r"Per-position acceptance rate: \d\.\d{3}, \d\.\d{3}, \d\.\d{3}, Avg Draft acceptance rate: "
                         r"[\d.]+%", text)
        time.sleep(0.1)
    assert stats and spec
    assert 1.0 <= float(spec.group(1)) <= 4.0


# --------------------------------------------------------------------------- process handling
def test_restart_keeps_port_and_changes_pid(tmp_path: Path) -> None:
    with SimServer("gb300-disagg", overrides=FAST, log_file=tmp_path / "e.log") as s:
        url, pid = s.url, s.pid
        assert httpx.get(s.base_url + "/models").json()["data"][0]["id"] == "mistral-large-4"
        s.restart()
        assert s.url == url and s.pid != pid and httpx.get(s.url + "/health").status_code == 200
        pid = s.pid
    assert s.pid is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health")


def test_start_fails_fast_with_log_tail(tmp_path: Path) -> None:
    # With almost no memory budget the engine cannot place weights + KV cache and refuses to start.
    s = SimServer("rtxpro6000-tp8", overrides={"engine": {"gpu_memory_utilization": 0.05}},
                  env={"LLM_API_KEY": "x"}, log_file=tmp_path / "e.log")
    t0 = time.monotonic()
    with pytest.raises(SimServerError) as e:
        s.start(timeout=30)
    assert time.monotonic() - t0 < 20
    assert "exited with code 1" in str(e.value) and "Engine core initialization failed" in str(e.value)


def test_missing_api_key_is_one_clear_line(tmp_path: Path) -> None:
    s = SimServer("rtxpro6000-tp8", env={"LLM_API_KEY": ""}, log_file=tmp_path / "e.log")
    with pytest.raises(SimServerError) as e:
        s.start(timeout=30)
    assert "requires an API key: set the environment variable LLM_API_KEY" in str(e.value)


# --------------------------------------------------------------------------- engine death on the first large step
def test_crash_on_first_large_step(tmp_path: Path) -> None:
    """BootResult.crash_on_first_step: small steps are served, the first large one kills the engine."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer
    from pytest_ml4_sim.sim.boot import BootResult
    from pytest_ml4_sim.sim.server import LogWriter, SimApp, SimConfig

    from pytest_ml4.evidence.tokenizer import get_tokenizer

    target = load_target("gb300-agg", overrides=FAST)
    boot = BootResult(lines=[], crash_on_first_step=True, crash_min_step_tokens=500,
                      crash_lines=["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 792.00 MiB."],
                      kv_pool_tokens=100000, num_gpu_blocks=1000)
    log_path = tmp_path / "crash.log"
    app = SimApp(SimConfig(target=target), boot, LogWriter(str(log_path), 4242), get_tokenizer(15))
    exits: list[int] = []
    app._exit = exits.append

    async def scenario() -> tuple[int, list[int]]:
        async with TestClient(TestServer(app.app())) as c:
            small = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 50})
            assert exits == []
            big = {"messages": [{"role": "user", "content": "word " * 800}], "max_tokens": 5}
            task = asyncio.ensure_future(c.post("/v1/chat/completions", json=big))
            for _ in range(100):
                if exits:
                    break
                await asyncio.sleep(0.02)
            task.cancel()
            return small.status, list(exits)

    status, codes = asyncio.run(scenario())
    assert status == 200 and codes == [1]
    text = log_path.read_text()
    assert "CUDA out of memory" in text and "EngineCore encountered a fatal error." in text


def test_prefix_cache_hits_on_repeated_prompt(keyed: SimServer) -> None:
    body = {"messages": [{"role": "user", "content": "Summarise this text: " + "alpha beta gamma " * 120}],
            "max_tokens": 8, "model": "ml4"}

    def hits() -> float:
        m = re.search(r'^vllm:prefix_cache_hits_total\{engine="0",model_name="ml4"\} (\S+)$',
                      httpx.get(keyed.url + "/metrics").text, re.MULTILINE)
        assert m
        return float(m.group(1))

    httpx.post(keyed.base_url + "/chat/completions", json=body, headers=_auth())
    before = hits()
    httpx.post(keyed.base_url + "/chat/completions", json=body, headers=_auth())
    # Block size 64 on this target: the repeated ~370-token prompt hits whole blocks.
    assert hits() - before >= 256


def test_client_disconnect_aborts_request(keyed: SimServer) -> None:
    body = {"messages": [{"role": "user", "content": "Hello"}], "stream": True, "model": "ml4",
            "min_tokens": 3000, "max_tokens": 3000}
    with httpx.Client(base_url=keyed.url, timeout=30) as c, \
            c.stream("POST", "/v1/chat/completions", json=body, headers=_auth()) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 4:
                break
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = httpx.get(keyed.url + "/metrics").text
        aborted = re.search(r'^vllm:request_success_total\{engine="0",finished_reason="abort",model_name="ml4"\} '
                            r'(\S+)$', text, re.MULTILINE)
        if aborted and float(aborted.group(1)) >= 1 and httpx.get(keyed.url + "/load").json()["server_load"] == 0:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the engine kept generating for a disconnected client")


def test_busy_requested_port_fails_with_reason(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SimServerError) as e:
            SimServer("gb300-agg", port=port, log_file=tmp_path / "e.log").start(timeout=30)
    assert "address already in use" in str(e.value).lower()


def test_prompt_tokens_details_with_flag(tmp_path: Path) -> None:
    """--enable-prompt-tokens-details: usage reports the prefix-cache hit as cached_tokens."""
    overrides = {**FAST, "engine": {"extra_args": ["--enable-prompt-tokens-details"]}}
    body = {"messages": [{"role": "user", "content": "Summarise: " + "alpha beta gamma " * 100}], "max_tokens": 4}
    with SimServer("gb300-agg", overrides=overrides, log_file=tmp_path / "e.log") as s:
        first = httpx.post(s.base_url + "/chat/completions", json=body).json()["usage"]
        second = httpx.post(s.base_url + "/chat/completions", json=body).json()["usage"]
        with httpx.Client(base_url=s.url) as c:
            lines = stream_lines(c, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert first["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": None,
                                              "multimodal_tokens": None}
    assert second["prompt_tokens_details"]["cached_tokens"] >= 256
    usage = json.loads(lines[-2])["usage"]
    assert list(usage) == ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
                           "completion_tokens_details"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 256


def test_stop_during_the_restart_stop_delay_ends_the_standby(tmp_path: Path) -> None:
    """A stop() while restart() waits out the stop delay (the standby already prepared) ends the standby too:
    no engine process outlives stop(), and the restart says it was stopped instead of bringing the port back."""

    class StopInTheDelay(SimServer):
        standby: Any = None

        def prepare_restart(self, timeout: float = 60.0) -> None:
            super().prepare_restart(timeout)
            assert self._standby is not None
            self.standby = self._standby[0]

        def _stop_delay(self, seconds: float) -> None:
            self.stop()  # what another thread's stop() does in this window, without depending on timing

    s = StopInTheDelay("gb300-agg", overrides=FAST, log_file=tmp_path / "e.log")
    s.start()
    try:
        with pytest.raises(SimServerError, match="stopped during the restart"):
            s.restart()
        assert s.standby is not None and s.standby.poll() is not None, "the standby engine outlived stop()"
        assert not s.alive()
    finally:
        s.stop()
        if s.standby is not None and s.standby.poll() is None:  # the leak this test exists for: end it anyway
            s.standby.kill()
            s.standby.wait(10)
