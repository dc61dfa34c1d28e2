"""Gates that once could not fail: each case here passed on the old code.

Item 5: the latency-knee gate passed whenever there was no baseline (every Dynamo target). Item 6: below
``max_num_seqs`` the saturation gate only required ``p50 <= concurrency``, which no engine can violate, so on the
Dynamo targets (cap 64 > every sweep concurrency) it could not fail. Item 9: the simulator never wrote the grammar
kill the OSL suite looks for.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.logs import FileLogReader, GrammarKill, LogView
from pytest_ml4.perf import gates
from pytest_ml4.perf.evaluate import knee_bound
from pytest_ml4.perf.figures import PointFigures
from pytest_ml4.target.model import load_target


def point(c: int, p50: float, ttft_p99: float = 0.5) -> PointFigures:
    return PointFigures(concurrency=c, requests=10, errors=0, error_rate_pct=0.0, out_tok_s=100.0, tok_s_user=60.0,
                        tok_s_user_p50=60.0, ttft_p50_s=0.3, ttft_p99_s=ttft_p99, itl_p50_ms=10.0, itl_p99_ms=20.0,
                        decode_conc_avg=p50, decode_conc_p50=p50, decode_conc_max=p50, reasoning_share=None,
                        osl_min=128, osl_max=128, osl_std=0.0, duration_s=10.0)


def test_knee_without_a_bound_fails() -> None:
    """Caught: ``knee_gate(..., not_before=None)`` returned pass with whatever knee the sweep had."""
    pts = [point(1, 1, 0.5), point(32, 30, 9.0)]
    result = gates.knee_gate(pts, 5.0, None)
    assert not result.passed and "no bound" in result.detail


def test_knee_bound_comes_from_the_target_on_dynamo() -> None:
    """The Dynamo targets state ``gates.knee_not_before``; a knee at c4 comes before it and fails."""
    gb300 = load_target("gb300-agg")
    bound = knee_bound(gb300, None, gb300.gates.ttft_p99_knee_s)
    assert bound == 32
    early = [point(1, 1, 0.5), point(4, 4, 6.5), point(32, 30, 9.0)]
    assert not gates.knee_gate(early, gb300.gates.ttft_p99_knee_s, bound).passed
    assert gates.knee_gate([point(1, 1, 0.5), point(32, 30, 1.0)], gb300.gates.ttft_p99_knee_s, bound).passed


def test_saturation_below_the_cap_fails_on_a_hidden_lower_cap() -> None:
    """Caught: at c32 under a 64 cap, an engine running only 4 sequences passed (4 <= 32)."""
    assert not gates.saturation_gate(point(32, 4.0), 64).passed
    assert gates.saturation_gate(point(32, 31.0), 64).passed
    assert gates.saturation_gate(point(1, 1.0), 64).passed
    assert not gates.saturation_gate(replace(point(4, 6.0)), 64).passed     # c4 cannot run 6


def _unstamped(line: str) -> str:
    """A vLLM log line without what differs between runs: process tag, pid, time, request id."""
    line = re.sub(r"^\(\w+ pid=\d+\) (\w+) [\d-]+ [\d:]+ ", r"\1 ", line)
    return re.sub(r"request \S+?(?=[ .]*(for tokens|Terminating|$))", "request ID", line)


def test_grammar_kill_fault_ends_the_request_as_real_vllm_does(tmp_path: Path, rtx_api_key: str) -> None:
    """Caught: the fault wrote a grammar-kill line while the request was served in full.
    Real vLLM logs two EngineCore lines and the client gets HTTP 500; the next request is served."""
    target = load_target("rtxpro6000-tp8")
    log = tmp_path / "engine.log"
    with SimServer(target, faults=("grammar_kill",), log_file=log,
                   overrides={"sim": {"ttft_s": 0.005, "itl_ms": 0.2}}) as sim:
        body = {"model": target.serving.served_model_name, "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 8}
        statuses = [httpx.post(sim.base_url + "/chat/completions", json=body, timeout=60,
                               headers={"Authorization": f"Bearer {rtx_api_key}"}).status_code for _ in range(2)]
    assert statuses == [500, 200]
    real = (Path(__file__).parent.parent / "fixtures" / "logs" / "grammar-terminated-real.log").read_text()
    written = [_unstamped(line) for line in log.read_text().splitlines() if "EngineCore" in line and "ERROR" in line]
    assert written == [_unstamped(line) for line in real.splitlines()]
    kills = LogView(FileLogReader(log).read(), "sim").all(GrammarKill)
    assert [k.tokens for k in kills] == [(9,)]


def test_streamed_reasoning_is_compared_by_presence_not_text() -> None:
    """Caught: streamed and non-streamed reasoning had to be the same text, which batching and speculative
    decoding do not guarantee at temperature 0; what must agree is that reasoning was separated at all."""
    from pytest_ml4.checks.protocol import Assembled

    a = Assembled(content="42", reasoning="Six times seven is 42.", finish_reason="stop")
    b = Assembled(content="42", reasoning="6 * 7 = 42, so the answer is 42.", finish_reason="stop")
    assert a.differences(b) == []
    missing = Assembled(content="42", reasoning="", finish_reason="stop")
    assert [d.split(":")[0] for d in a.differences(missing)] == ["reasoning"]
    assert [d.split(":")[0] for d in a.differences(Assembled(content="41", reasoning="x", finish_reason="stop"))] \
        == ["content"]


def test_osl_engine_counter_is_read_on_a_live_endpoint(pytester: pytest.Pytester, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Caught (item 4): the OSL engine-counter cross-check read ``metrics_url``, which only ``--sim`` sets; against
    a live endpoint (here the simulator given as ``--endpoint``) the counter was never read."""
    import secrets
    import xml.etree.ElementTree as ET

    target = load_target("rtxpro6000-tp8")
    monkeypatch.setenv(target.endpoint.api_key_env, "sk-osl-" + secrets.token_hex(8))
    monkeypatch.delenv(target.endpoint.metrics_url_env, raising=False)
    suite = Path(__file__).parent.parent / "suites" / "test_osl.py"
    junit = tmp_path / "junit.xml"
    with SimServer(target, log_file=tmp_path / "sim.log", overrides={"sim": {"ttft_s": 0.005, "itl_ms": 0.2}}) as sim:
        result = pytester.runpytest_subprocess(
            str(suite), "--target", "rtxpro6000-tp8", "--endpoint", sim.base_url, "--ml4-no-proxy",
            "--ml4-log-file", str(tmp_path / "sim.log"), "-k", "streamed_token_count", "--ml4-reports",
            str(tmp_path / "reports"), f"--junitxml={junit}", "-p", "no:randomly", timeout=240)
    result.assert_outcomes(passed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert props.get("osl_engine_tokens") == str(4 * 192), props


def test_a_sweep_without_a_point_under_the_knee_bound_cannot_judge_it() -> None:
    """Caught: gb300-agg's CI sweep was c32 alone against the bound c32, so the knee gate passed
    whatever the knee; such a sweep is now named as unable to judge it."""
    assert "start at or above the bound c32" in (gates.knee_unseen([32], 32) or "")
    assert "start at or above the bound c16" in (gates.knee_unseen([64, 16], 16) or "")
    assert gates.knee_unseen([16, 32], 32) is None
    assert gates.knee_unseen([32], None) is None
