"""A dead endpoint ends the gate (issue 33 item 9): the first check that finds it stalled or dead fails, the rest are
not sent and end not judged naming that failure, in this process and in every xdist worker.

The core (:mod:`pytest_ml4.client.breaker`) is met over real sockets (``tests/ml4_http_stub.py``); the plugin through the
smoke suite against a stub that answers ``/v1/models`` and never answers a chat, with short deadlines (CI) and with
the default ones (the smoke gate must end within 5 minutes as a team would run it).
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import httpx
import pytest
from ml4_http_stub import Scripted, StubServer, hostile

from pytest_ml4.client.breaker import STORE_NAME, EndpointDown, EndpointHealth
from pytest_ml4.client.endpoint import Endpoint, make_httpx, make_openai
from pytest_ml4.client.stream_probe import probe_chat_stream
from pytest_ml4.client.transport import DeadlineExceeded, Deadlines

SHORT = Deadlines(connect_s=2, first_byte_s=1, idle_s=1, overall_s=2)
BODY = {"model": "ml4", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
MODELS = b'{"object":"list","data":[{"id":"ml4","object":"model","owned_by":"vllm","max_model_len":256000}]}'
CHAT = "/v1/chat/completions"


def _chats(srv: StubServer) -> int:
    return sum(1 for s in srv.seen if s.path == CHAT)


def test_a_stall_trips_the_breaker_and_no_later_request_is_sent(tmp_path: Path) -> None:
    health = EndpointHealth.in_folder(tmp_path, answered=True)
    with StubServer({CHAT: hostile("stalled")}) as srv:
        ep = Endpoint(srv.base_url, api_key="sk-breaker-test-0123456789", deadlines=SHORT, health=health)
        health.check = "suites/test_smoke.py::test_chat"
        with make_openai(ep) as client, pytest.raises(DeadlineExceeded):
            client.chat.completions.create(**BODY)
        health.check = "suites/test_smoke.py::test_next"
        started = time.monotonic()
        with make_httpx(ep) as http, pytest.raises(EndpointDown) as refused:
            http.post("chat/completions", json=BODY)
        took = time.monotonic() - started
        sent = _chats(srv)
    trip = health.trip()
    assert trip is not None and (trip.check, trip.state) == ("suites/test_smoke.py::test_chat", "stalled")
    assert trip.url == f"{srv.base_url}/chat/completions"
    assert "nothing arrived, not even response headers" in trip.what
    assert sent == 1, "the request after the trip reached the endpoint"
    assert took < 1.0, f"a refused request took {took:.1f} s"
    assert str(refused.value).startswith(f"not sent: endpoint {trip.url} judged stalled by "
                                         f"suites/test_smoke.py::test_chat: nothing arrived")
    assert health.refused("suites/test_smoke.py::test_next") == 1
    # Another process sharing the run folder (an xdist worker) sees the same first failure.
    assert EndpointHealth.in_folder(tmp_path).trip() == trip
    assert json.loads((tmp_path / STORE_NAME).read_text())["check"] == "suites/test_smoke.py::test_chat"


def test_a_slow_endpoint_whose_bytes_keep_arriving_does_not_trip(tmp_path: Path) -> None:
    """A trickle past the overall deadline fails its check, but the endpoint is alive: nothing is refused after."""
    health = EndpointHealth.in_folder(tmp_path, answered=True)
    with StubServer({CHAT: hostile("trickling")}) as srv:
        ep = Endpoint(srv.base_url, deadlines=SHORT.overriding(idle_s=10), health=health)
        with make_httpx(ep) as http:
            result = probe_chat_stream(http, {**BODY, "stream": True})
            assert "answer not finished within the overall deadline" in (result.transport_error or "")
            srv.routes[CHAT] = Scripted(200, "application/json", [b'{"object":"chat.completion","choices":[]}'])
            assert http.post("chat/completions", json=BODY).status_code == 200
    assert health.trip() is None and not (tmp_path / STORE_NAME).exists()


def test_a_stream_that_stops_mid_way_trips_it(tmp_path: Path) -> None:
    health = EndpointHealth.in_folder(tmp_path, answered=True)
    with StubServer({CHAT: hostile("stalled_mid_stream")}) as srv, \
            make_httpx(Endpoint(srv.base_url, deadlines=SHORT, health=health)) as http:
        probe_chat_stream(http, {**BODY, "stream": True})
    trip = health.trip()
    assert trip is not None and trip.state == "stalled" and "no progress for" in trip.what


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("answered", [False, True])
def test_a_refused_connection_is_a_death_only_after_the_endpoint_answered(tmp_path: Path, answered: bool) -> None:
    """Refused before any answer is a wrong URL (the session-start check says so), after one the engine died."""
    health = EndpointHealth.in_folder(tmp_path, answered=answered)
    ep = Endpoint(f"http://127.0.0.1:{_closed_port()}/v1", deadlines=SHORT, health=health)
    with make_httpx(ep) as http, pytest.raises(httpx.ConnectError):
        http.get("models")
    trip = health.trip()
    assert (trip.state if trip else None) == ("dead" if answered else None)


def test_a_deliberate_outage_trips_nothing(tmp_path: Path) -> None:
    health = EndpointHealth.in_folder(tmp_path, answered=True)
    ep = Endpoint(f"http://127.0.0.1:{_closed_port()}/v1", deadlines=SHORT, health=health)
    with health.paused(), make_httpx(ep) as http, pytest.raises(httpx.ConnectError):
        http.get("models")
    assert health.trip() is None


# -- the plugin: the smoke gate against a stalled endpoint ---------------------------------------------------------

def _stalled_routes() -> dict[str, Scripted]:
    return {"/v1/models": Scripted(200, "application/json", [MODELS]), CHAT: hostile("stalled")}


def _gate(pytester: pytest.Pytester, srv: StubServer, *args: str, subprocess: bool = False) -> tuple[
        pytest.RunResult, float]:
    run = pytester.runpytest_subprocess if subprocess else pytester.runpytest
    started = time.monotonic()
    result = run("--target", "rtxpro6000-tp8", "--endpoint", srv.base_url, "-m", "smoke",
                 f"--ml4-run-dir={pytester.path / 'run'}", "suites/test_smoke.py", *args)
    return result, time.monotonic() - started


def _assert_counts(result: pytest.RunResult, **want: int) -> None:
    """pytest's exit line, with the plugin's ``not_judged`` (``assert_outcomes`` knows no such outcome)."""
    got = result.parseoutcomes()
    assert {k: got.get(k, 0) for k in ("passed", "failed", "not_judged", "skipped", "errors")} == {
        "skipped": 0, "errors": 0, **want}, got


def _assert_gate_stopped(result: pytest.RunResult, srv: StubServer, first: str, run_dir: Path) -> None:
    out = result.stdout.str()
    url = f"{srv.base_url}/chat/completions"
    stop = re.search(rf"ml4: the gate stopped early: endpoint {re.escape(url)} judged stalled by "
                     rf"suites/test_smoke.py::(\w+): nothing arrived, not even response headers.*; (\d+) check\(s\) "
                     rf"after it not sent \(not judged\)", out)
    assert stop, out[-4000:]
    assert first in ("", stop.group(1)), f"tripped by {stop.group(1)}, expected {first}"
    assert f"FAILED suites/test_smoke.py::{stop.group(1)}" in out, "the check that tripped it keeps its failure"
    not_judged = [ln for ln in result.outlines if ln.startswith("NOT JUDGED ")]
    assert not_judged and all(f"not sent: endpoint {url} judged stalled by suites/test_smoke.py::{stop.group(1)}: "
                              f"nothing arrived" in ln for ln in not_judged), "\n".join(not_judged)
    assert len(not_judged) >= int(stop.group(2)) > 0
    checks = json.loads((run_dir / "summary.json").read_text())["checks"]
    reasons = [c["message"] for c in checks if c["outcome"] == "not_judged"]
    assert len(reasons) == len(not_judged) and all(f"judged stalled by suites/test_smoke.py::{stop.group(1)}" in r
                                                   for r in reasons), reasons


def test_the_smoke_gate_against_a_stalled_endpoint_stops_at_the_first_stall(
        pytester: pytest.Pytester, smoke_copy: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Short deadlines: health fails (404 on /health/liveliness, an answer: no trip), the models checks pass, the
    first chat stalls and fails; the six checks after it are not sent (was: each waited its own deadline)."""
    monkeypatch.setenv("LLM_API_KEY", "sk-not-used-0123456789")
    with StubServer(_stalled_routes()) as srv:
        result, took = _gate(pytester, srv, "--ml4-deadlines", "first_byte=1,idle=1,overall=2")
        chats = _chats(srv)
    _assert_counts(result, failed=2, passed=2, not_judged=6)
    _assert_gate_stopped(result, srv, "test_chat_answers_known_question", pytester.path / "run")
    assert chats == 1, f"{chats} chat requests reached the stalled endpoint; only the first may"
    assert took < 60, f"took {took:.0f} s"


def test_under_xdist_every_worker_stops_after_the_first_stall(
        pytester: pytest.Pytester, smoke_copy: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """-n 2: the trip is a file in the shared run folder, so the other worker stops too (a check already waiting
    when the other worker tripped it ends on its own deadline, and may fail)."""
    monkeypatch.setenv("LLM_API_KEY", "sk-not-used-0123456789")
    with StubServer(_stalled_routes()) as srv:
        result, took = _gate(pytester, srv, "--ml4-deadlines", "first_byte=3,idle=3,overall=3", "-n", "2",
                             subprocess=True)
        chats = _chats(srv)
    _assert_gate_stopped(result, srv, "", pytester.path / "run")
    outcomes = result.parseoutcomes()
    assert outcomes.get("not_judged", 0) >= 4 and outcomes.get("failed", 0) <= 4, outcomes
    assert chats <= 2, f"{chats} chat requests reached the stalled endpoint; at most one per worker may"
    assert took < 90, f"took {took:.0f} s"


def test_a_restart_outage_trips_nothing_and_preflight_still_runs(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Markers from pytest_ml4/data/plugin/breaker.yaml: a ``restart`` check's own outage trips nothing; a
    ``preflight`` check sends no request, so it runs after a trip."""
    monkeypatch.setenv("LLM_API_KEY", "sk-not-used-0123456789")
    pytester.makepyfile(test_order="""
        import pytest

        @pytest.mark.restart
        def test_1_outage(http_client):
            http_client.post("/chat/completions", json={"model": "ml4", "max_tokens": 8})

        @pytest.mark.smoke
        def test_2_still_sent(http_client):
            assert http_client.get("/models").status_code == 200

        @pytest.mark.smoke
        def test_3_stalls(http_client):
            http_client.post("/chat/completions", json={"model": "ml4", "max_tokens": 8})

        @pytest.mark.preflight
        def test_4_lint():
            pass

        @pytest.mark.smoke
        def test_5_not_sent(http_client):
            http_client.get("/models")
    """)
    with StubServer(_stalled_routes()) as srv:
        result = pytester.runpytest("--target", "rtxpro6000-tp8", "--endpoint", srv.base_url, "test_order.py",
                                    "--ml4-deadlines", "first_byte=1,idle=1,overall=1",
                                    f"--ml4-run-dir={pytester.path / 'run'}")
    _assert_counts(result, failed=2, passed=2, not_judged=1)
    line = "NOT JUDGED test_order.py::test_5_not_sent: not sent: endpoint * judged stalled by test_order.py::test_3_stalls: *"
    result.stdout.fnmatch_lines([line])


def test_the_default_deadlines_in_force_bound_the_stalled_smoke_gate_under_5_minutes(
        pytester: pytest.Pytester, smoke_copy: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's part of the default-deadline proof, in seconds: without ``--ml4-deadlines`` the session runs with the
    deadlines derived from rtxpro6000-tp8 (the header states those in force), and with them the gate's one stalled
    request, the smoke question's non-streamed chat, ends within connect + first byte + max_tokens x the slow-ITL
    bound, under 5 minutes; the stalled request then stops the gate (tests above, short deadlines). The whole
    wait, about 3 idle minutes of one CI worker, is the nightly test below."""
    from pytest_ml4.checks.suite_data import smoke_data

    monkeypatch.setenv("LLM_API_KEY", "sk-not-used-0123456789")
    with StubServer(_stalled_routes()) as srv:
        result = pytester.runpytest("--target", "rtxpro6000-tp8", "--endpoint", srv.base_url, "--collect-only",
                                    f"--ml4-run-dir={pytester.path / 'run'}", "suites/test_smoke.py")
    assert _chats(srv) == 0, "collecting sends no chat"
    result.stdout.fnmatch_lines(["ml4 deadlines per request: connect 5 s, first byte 60 s, idle 30 s, overall first "
                                 "byte + max_tokens x 0.117 s (--ml4-deadlines)"])
    max_tokens = smoke_data().question.max_tokens
    bound_s = 5 + 60 + max_tokens * 0.117
    assert bound_s < 300, f"a stalled smoke question of {max_tokens} tokens may hold the gate {bound_s:.0f} s"


@pytest.mark.nightly
def test_the_default_smoke_gate_against_a_stalled_endpoint_ends_within_5_minutes(
        pytester: pytest.Pytester, smoke_copy: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a team runs it, default deadlines: the non-streamed chat's first byte may take first byte + 1024 tokens x
    the slow-ITL bound (60 + 1024 x 0.117 = 180 s on rtxpro6000-tp8), then the gate ends (measured: 190 s wall).
    Nightly: three idle minutes of one CI worker; CI proves the deadlines in force and their bound (test above)."""
    monkeypatch.setenv("LLM_API_KEY", "sk-not-used-0123456789")
    with StubServer(_stalled_routes()) as srv:
        result, took = _gate(pytester, srv)
    _assert_counts(result, failed=2, passed=2, not_judged=6)
    _assert_gate_stopped(result, srv, "test_chat_answers_known_question", pytester.path / "run")
    assert took < 300, f"the stalled smoke gate took {took:.0f} s, over 5 minutes"
