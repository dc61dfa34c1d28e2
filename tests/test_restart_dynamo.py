"""The embedded Dynamo deployment: the REAL dynamo.frontend 1.6.1 in front of the project's Dynamo workers.

What is checked here is what the workers (and the handle) must do for Dynamo to behave as it does in front of a
real engine (shared/reference/real-dynamo.md): instances in /health, the worker's own cut at ``max_tokens``,
``min_tokens``/``ignore_eos``, the published token budget (400 ``context_length``), ``vllm:*`` metrics on the
worker's system port (never on the frontend's), the bridge's tool/reasoning output, migration of a stream whose
worker was killed, SIGTERM = deregister + drain, and the disaggregated prefill -> decode handoff.
One agg and one disagg deployment are started for the whole module (CI cost).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_ml4_sim.deploy.dynamo import DynamoSim

from pytest_ml4.checks.restart import assert_stream_survives_worker_crash
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.client.stream_probe import parse_sse_lines
from pytest_ml4.control.crash import run_crash
from pytest_ml4.control.dynamo import SESSION_HEADER
from pytest_ml4.control.scenario import load_requests
from pytest_ml4.evidence.metrics import scrape
from pytest_ml4.runtime.installed import ToolMissing, dynamo_python
from pytest_ml4.target.model import load_target

try:
    dynamo_python()
except ToolMissing as err:  # the install step is part of scripts/install.sh; CI always has it
    pytest.skip(str(err), allow_module_level=True)

#: A small context so an over-long prompt is cheap to send (the frontend refuses it before any worker sees it).
CONTEXT = 4096
AGG = load_target("gb300-agg", overrides={"engine": {"max_model_len": CONTEXT}})
DISAGG = load_target("gb300-disagg")
MODEL = AGG.serving.served_model_name
CRASH = load_requests().crash
QUESTION = [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


@pytest.fixture(scope="module")
def agg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DynamoSim]:
    dsim = DynamoSim(AGG, log_file=tmp_path_factory.mktemp("agg") / "engine.log").start()
    yield dsim
    dsim.stop()


def _chat(dsim: DynamoSim, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    return httpx.post(dsim.base_url + "/chat/completions", headers=headers or {}, timeout=60,
                      json={"model": MODEL, "messages": QUESTION, **body})


def _ok(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_a_real_frontend_lists_every_worker_instance(agg: DynamoSim) -> None:
    assert agg.frontend.command[1:3] == ["-m", "dynamo.frontend"]
    health = httpx.get(agg.url + "/health", timeout=5).json()
    assert {i["instance_id"] for i in health["instances"]} == {w.instance_id for w in agg.workers}
    (card,) = httpx.get(agg.base_url + "/models", timeout=5).json()["data"]
    assert card["id"] == MODEL and card["context_window"] == CONTEXT  # the worker's published context length


def test_worker_cuts_at_max_tokens_and_honours_min_tokens_and_ignore_eos(agg: DynamoSim) -> None:
    natural = _ok(_chat(agg, max_tokens=200))
    again = _ok(_chat(agg, max_tokens=200))  # the engine's prefix cache, reported as Dynamo's vLLM worker does
    assert "cached_tokens" in again["usage"]["prompt_tokens_details"]
    assert natural["choices"][0]["finish_reason"] == "stop" and "42" in natural["choices"][0]["message"]["content"]
    n = natural["usage"]["completion_tokens"]
    cut = _ok(_chat(agg, max_tokens=5))
    assert (cut["usage"]["completion_tokens"], cut["choices"][0]["finish_reason"]) == (5, "length")
    padded = _ok(_chat(agg, max_tokens=300, min_tokens=n + 40))
    assert padded["usage"]["completion_tokens"] >= n + 40 and padded["choices"][0]["finish_reason"] == "stop"
    endless = _ok(_chat(agg, max_tokens=60, ignore_eos=True))
    assert (endless["usage"]["completion_tokens"], endless["choices"][0]["finish_reason"]) == (60, "length")


def test_over_long_prompt_is_refused_by_the_frontend_with_context_length(agg: DynamoSim) -> None:
    long = [{"role": "user", "content": "word " * (CONTEXT + 500)}]
    r = _chat(agg, messages=long, max_tokens=10)
    assert r.status_code == 400, r.text
    details = r.json()["details"]
    assert details["type"] == "context_length" and details["limit"] == CONTEXT and details["actual"] > CONTEXT


def test_vllm_metrics_live_on_the_workers_not_on_the_frontend(agg: DynamoSim) -> None:
    before = sum(scrape(u).value("vllm:generation_tokens_total") or 0 for u in agg.worker_metrics_urls["worker"])
    used = _ok(_chat(agg, max_tokens=50))["usage"]["completion_tokens"]
    after = sum(scrape(u).value("vllm:generation_tokens_total") or 0 for u in agg.worker_metrics_urls["worker"])
    assert after - before == used
    frontend = httpx.get(agg.url + "/metrics", timeout=5).text
    assert "dynamo_frontend_requests_total" in frontend and "vllm:" not in frontend


def test_bridge_gives_parsed_tool_calls_and_split_reasoning(agg: DynamoSim) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    calls = _ok(_chat(agg, messages=ask, tools=[WEATHER]))["choices"][0]
    assert calls["finish_reason"] == "tool_calls", calls
    (call,) = calls["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and "Paris" in call["function"]["arguments"]
    thought = _ok(_chat(agg, reasoning_effort="high", max_tokens=300))["choices"][0]["message"]
    assert thought["reasoning_content"] and "[THINK]" not in thought["content"] and "42" in thought["content"]


def _stream(dsim: DynamoSim, session: str | None, on_event: Any) -> Any:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 300, "min_tokens": 300, "stream": True,
            "stream_options": {"include_usage": True}}
    lines: list[str] = []
    headers = {SESSION_HEADER: session} if session else {}
    with httpx.stream("POST", dsim.base_url + "/chat/completions", json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines.append(line)
            on_event(sum(1 for x in lines if x.startswith("data:")))
    return parse_sse_lines(lines, request=body)


def test_migration_continues_a_stream_whose_worker_was_killed(agg: DynamoSim) -> None:
    # No session header: with hard session affinity Dynamo 1.6.1 refuses to migrate a pinned stream ("Pinned
    # worker ... is not eligible"), which is Dynamo's behaviour, not the simulator's.
    run = run_crash(_endpoint(agg), agg, CRASH, agg.frontend.migration_limit)
    assert agg.frontend.migration_limit == 3
    assert assert_stream_survives_worker_crash(run).startswith("stream migrated after its worker's SIGKILL"), run.report()
    assert run.crash is not None and run.crash.leftovers == []  # a simulated worker spawns no engine processes


def test_without_migration_a_killed_workers_stream_ends_with_dynamos_error_event(tmp_path: Path) -> None:
    dsim = DynamoSim(AGG, log_file=tmp_path / "engine.log", migration_limit=0, agg_workers=1).start()
    try:
        run = run_crash(_endpoint(dsim), dsim, CRASH, dsim.frontend.migration_limit)
        assert "Service temporarily unavailable" in assert_stream_survives_worker_crash(run), run.report()
        assert run.stream.finish_reason is None and run.stream.usage is None, run.report()
    finally:
        dsim.stop()


def _endpoint(dsim: DynamoSim) -> Endpoint:
    return Endpoint(base_url=dsim.base_url, model=MODEL)


def test_sigterm_deregisters_the_worker_and_drains_its_stream(agg: DynamoSim) -> None:
    victims: list[Any] = []

    def term(n: int) -> None:
        if n == 10 and not victims:
            victims.append(agg.busy_worker())
            victims[0].signal(signal.SIGTERM)

    result = _stream(agg, None, term)
    victim = victims[0]
    old_id = victim.instance_id
    assert not result.error_events and result.done and result.finish_reason == "length", result.describe()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and victim.alive():
        time.sleep(0.05)
    listed = {i["instance_id"] for i in httpx.get(agg.url + "/health", timeout=5).json()["instances"]}
    assert not victim.alive() and old_id not in listed
    victim.start()
    agg.wait_serving(60)
    assert victim.instance_id != old_id


def test_disagg_prefill_then_decode_on_their_own_workers(tmp_path: Path) -> None:
    dsim = DynamoSim(DISAGG, log_file=tmp_path / "engine.log", prefill_workers=1, decode_workers=1).start()
    try:
        (prefill,) = dsim.workers_of("prefill")
        (decode,) = dsim.workers_of("decode")
        data = _ok(_chat(dsim, max_tokens=100, nvext={"extra_fields": ["worker_id"]}))
        wid = data["nvext"]["worker_id"]
        assert (wid["prefill_worker_id"], wid["decode_worker_id"]) == (prefill.instance_id, decode.instance_id)
        assert "42" in data["choices"][0]["message"]["content"]
        prompt = data["usage"]["prompt_tokens"]
        assert scrape(prefill.metrics_url).value("vllm:prompt_tokens_total") == prompt
        assert scrape(decode.metrics_url).value("vllm:generation_tokens_total") == data["usage"]["completion_tokens"]
        assert set(dsim.worker_metrics_urls) == {"prefill", "decode"}
    finally:
        dsim.stop()
