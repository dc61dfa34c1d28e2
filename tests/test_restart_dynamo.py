"""The simulator's Dynamo mode: frontend bodies and metrics, worker-set gating of /v1/models, KV routing with
session affinity, nvext, prefix reuse, and --migration-limit (dynamo.md §3-§6)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_ml4.control.dynamo import SESSION_HEADER
from pytest_ml4.probe import StreamResult, parse_sse_lines
from pytest_ml4.sim.dynamo import DynamoSim
from pytest_ml4.targets import load_target

AGG = load_target("gb300-agg")
DISAGG = load_target("gb300-disagg")
MODEL = AGG.serving.served_model_name
QUESTION = [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}]
SYSTEM = {"role": "system", "content": " ".join(["Keep answers short and cite the metric you rely on."] * 30)}


def _start(target: Any, where: Path, **kw: Any) -> DynamoSim:
    return DynamoSim(target, log_file=where / "engine.log", **kw).start()


@pytest.fixture(scope="module")
def agg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DynamoSim]:
    dsim = _start(AGG, tmp_path_factory.mktemp("agg"))
    yield dsim
    dsim.stop()


def _chat(dsim: DynamoSim, session: str | None = None, messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    headers = {SESSION_HEADER: session} if session else {}
    r = httpx.post(dsim.base_url + "/chat/completions", headers=headers, timeout=60,
                   json={"model": MODEL, "messages": messages or QUESTION, "max_tokens": 256,
                         "nvext": {"extra_fields": ["worker_id", "timing"]}})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_health_live_and_models_bodies(agg: DynamoSim) -> None:
    live = httpx.get(agg.url + "/live", timeout=5)
    assert live.status_code == 200 and live.json() == {"status": "live", "message": "Service is live"}
    health = httpx.get(agg.url + "/health", timeout=5).json()
    assert health["status"] == "healthy"
    assert all(e.startswith("dyn://") for e in health["endpoints"])
    ids = {i["instance_id"] for i in health["instances"]}
    assert ids == {w.instance_id for w in agg.workers}
    assert all({"namespace", "component", "endpoint", "instance_id", "transport"} <= set(i) for i in health["instances"])
    models = httpx.get(agg.base_url + "/models", timeout=5).json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["owned_by"] == "nvidia"


def test_nvext_worker_id_and_frontend_metrics(agg: DynamoSim) -> None:
    data = _chat(agg)
    assert "42" in data["choices"][0]["message"]["content"]
    wid = data["nvext"]["worker_id"]
    assert wid["decode_worker_id"] in {w.instance_id for w in agg.workers}
    assert data["nvext"]["timing"]["ttft_ms"] > 0
    text = httpx.get(agg.url + "/metrics", timeout=5).text
    assert (f'dynamo_frontend_requests_total{{endpoint="chat_completions",error_type="",model="{MODEL}",'
            f'request_type="unary",status="success"}}') in text
    assert f'dynamo_frontend_model_migration_limit{{model="{MODEL}"}} {float(AGG.serving.migration_limit or 0)}' in text
    assert "dynamo_frontend_request_duration_seconds_bucket" in text


def test_session_affinity_pins_and_continuation_reuses_prefix(agg: DynamoSim) -> None:
    first = _chat(agg, "sess-a", [SYSTEM, *QUESTION])
    follow = [SYSTEM, *QUESTION, {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
              {"role": "user", "content": "What is 6 * 7? Answer with the number only."}]
    second = _chat(agg, "sess-a", follow)
    assert first["nvext"]["worker_id"]["decode_worker_id"] == second["nvext"]["worker_id"]["decode_worker_id"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["usage"]["prompt_tokens"]
    # Fresh sessions spread over both workers (round-robin among equal candidates).
    workers = {_chat(agg, f"fresh-{i}")["nvext"]["worker_id"]["decode_worker_id"] for i in range(4)}
    assert len(workers) == 2
    log = agg.frontend_log.read_text()
    assert "session affinity hit: reusing pinned worker session_id=sess-a" in log
    assert "[ROUTING] Best: worker_" in log


def _stream_and_kill(dsim: DynamoSim, session: str, kill_after: int) -> tuple[StreamResult, int]:
    """Stream a long answer pinned to one worker and SIGKILL that worker after ``kill_after`` events."""
    pinned = _chat(dsim, session)["nvext"]["worker_id"]["decode_worker_id"]
    victim = dsim.worker_by_id(pinned)
    assert victim is not None and victim.pid is not None
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 300, "min_tokens": 300, "stream": True,
            "stream_options": {"include_usage": True}}
    lines: list[str] = []
    with httpx.stream("POST", dsim.base_url + "/chat/completions", json=body, headers={SESSION_HEADER: session},
                      timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines.append(line)
            if sum(1 for x in lines if x.startswith("data:")) == kill_after:
                os.kill(victim.pid, signal.SIGKILL)
    victim.restart()  # bring the worker back for the next test (the process is already dead)
    return parse_sse_lines(lines, request=body), victim.instance_id


def _reference(dsim: DynamoSim) -> str:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 300, "min_tokens": 300}
    r = httpx.post(dsim.base_url + "/chat/completions", json=body, timeout=60)
    return str(r.json()["choices"][0]["message"]["content"])


def test_migration_continues_a_stream_whose_worker_died(agg: DynamoSim) -> None:
    expected = _reference(agg)
    result, _ = _stream_and_kill(agg, "migrate-me", kill_after=20)
    assert not result.error_events, result.describe()
    assert result.finish_reason == "length" and result.done, result.describe()
    assert result.content == expected  # nothing lost or repeated across the migration
    text = httpx.get(agg.url + "/metrics", timeout=5).text
    assert f'dynamo_frontend_model_migration_total{{migration_type="ongoing_request",model="{MODEL}"}}' in text


def test_without_migration_the_stream_ends_with_an_in_band_error(tmp_path: Path) -> None:
    dsim = _start(AGG, tmp_path, migration_limit=0)
    try:
        result, _ = _stream_and_kill(dsim, "no-migration", kill_after=20)
    finally:
        dsim.stop()
    assert result.status_code == 200
    assert result.error_events and not result.done and result.finish_reason is None, result.describe()


def test_disagg_model_hidden_while_no_prefill_worker(tmp_path: Path) -> None:
    dsim = _start(DISAGG, tmp_path, prefill_workers=1, decode_workers=1)
    try:
        data = _chat(dsim)
        wid = data["nvext"]["worker_id"]
        (prefill,) = dsim.workers_of("prefill")
        (decode,) = dsim.workers_of("decode")
        assert (wid["prefill_worker_id"], wid["decode_worker_id"]) == (prefill.instance_id, decode.instance_id)
        assert "remote prefill done" in dsim.frontend_log.read_text()
        metrics = httpx.get(dsim.url + "/metrics", timeout=5).text
        for worker, kind in ((prefill, "prefill"), (decode, "decode")):
            assert (f'dynamo_frontend_worker_last_input_sequence_tokens{{dp_rank="0",worker_id="{worker.instance_id}",'
                    f'worker_type="{kind}"}}') in metrics
        prefill.stop()
        deadline = time.monotonic() + 10
        listed = True
        while time.monotonic() < deadline and listed:
            listed = bool(httpx.get(dsim.base_url + "/models", timeout=5).json()["data"])
            time.sleep(0.05)
        assert not listed, "the model stayed listed without a prefill worker"
        r = httpx.post(dsim.base_url + "/chat/completions", json={"model": MODEL, "messages": QUESTION}, timeout=30)
        assert r.status_code == 503 and json.loads(r.text)["error"]["type"] == "unavailable"
        assert httpx.get(dsim.url + "/health", timeout=5).status_code == 200  # empty instances do not flip /health
        prefill.start()
        dsim.wait_serving(30)
    finally:
        dsim.stop()


def test_frontend_without_workers_is_not_ready(tmp_path: Path) -> None:
    from pytest_ml4.sim.dynamo import FrontendProcess

    discovery = tmp_path / "discovery.json"
    discovery.write_text(json.dumps({"instances": []}))
    fe = FrontendProcess(AGG, discovery, tmp_path / "frontend.log")
    fe.start()
    try:
        health = httpx.get(fe.url + "/health", timeout=5)
        assert health.status_code == 503
        assert health.json() == {"status": "not_ready", "stage": "discovery", "message": "Service is not ready"}
        assert httpx.get(fe.url + "/live", timeout=5).status_code == 200
        assert httpx.get(fe.url + "/v1/models", timeout=5).json() == {"object": "list", "data": []}
    finally:
        fe.stop()
