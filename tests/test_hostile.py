"""Hostile endpoints end a check in bounded time with one assertion naming the URL.

The answers are data (``fixtures/bad_input/hostile.yaml``), served over real sockets by ``tests/ml4_http_stub.py``
and met by each client the checks use: the openai SDK, the guarded httpx client, the stream probe. Deadlines are
set small (as ``--ml4-deadlines`` does) and each case is asserted to end under a generous bound: the message is
what is checked, the clock only catches a case that would hang.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
import yaml
from ml4_http_stub import HOSTILE_FILE, Scripted, StubServer, hostile, hostile_answers

from pytest_ml4.checks.protocol import assert_stream_clean
from pytest_ml4.client.endpoint import (
    Endpoint,
    check_reachable,
    decode_json,
    make_async_openai,
    make_httpx,
    make_openai,
)
from pytest_ml4.client.stream_probe import probe_chat_stream
from pytest_ml4.client.transport import Deadlines, EndpointMisbehaved, parse_deadlines

SPEC = yaml.safe_load(HOSTILE_FILE.read_text())
ANSWERS = hostile_answers()
DEADLINES = Deadlines().overriding(**parse_deadlines(SPEC["deadlines"]))
BODY = {"model": "ml4", "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16}
CHAT_OK = (b'{"id":"chatcmpl-9","object":"chat.completion","created":1,"model":"ml4","choices":[{"index":0,"message":'
           b'{"role":"assistant","content":"Paris"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,'
           b'"completion_tokens":1,"total_tokens":6}}')


def _sdk(ep: Endpoint) -> None:
    with make_openai(ep) as client:
        client.chat.completions.create(**BODY)


def _httpx(ep: Endpoint) -> None:
    with make_httpx(ep) as http:
        decode_json(http.post("chat/completions", json=BODY), "chat completion")


def _probe(ep: Endpoint) -> None:
    with make_httpx(ep) as http:
        assert_stream_clean(probe_chat_stream(http, {**BODY, "stream_options": {"include_usage": True}}))


CLIENTS: dict[str, Callable[[Endpoint], None]] = {"sdk": _sdk, "httpx": _httpx, "probe": _probe}
CASES = [(name, client) for name, spec in ANSWERS.items() for client in spec["expect"]]


@pytest.mark.parametrize(("name", "client"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_hostile_answer_is_one_assertion_naming_the_url(name: str, client: str) -> None:
    with StubServer({}) as other, StubServer({}) as srv:
        other.routes["/v1/chat/completions"] = Scripted(200, "application/json", [CHAT_OK])
        srv.routes["/v1/chat/completions"] = hostile(name, {"$OTHER": other.url})
        deadlines = DEADLINES.overriding(**parse_deadlines(ANSWERS[name].get("deadlines")))
        ep = Endpoint(srv.base_url, api_key="sk-hostile-test-key-0123456789", deadlines=deadlines)
        started = time.monotonic()
        with pytest.raises(AssertionError) as info:
            CLIENTS[client](ep)
        took = time.monotonic() - started
        asked_other = list(other.seen)
    message = str(info.value).split("\n")[0]  # what follows is pytest's explanation of a rewritten assert
    # A failing verdict leads with its stable code ([area.property]); the pattern is about what follows it.
    message = re.sub(r"^\[[a-z0-9_]+(?:\.[a-z0-9_]+)+\] ", "", message)
    pattern = ANSWERS[name]["expect"][client].replace("$URL", f"{srv.base_url}/chat/completions")
    pattern = pattern.replace("$OTHER", other.url)
    assert fnmatch.fnmatchcase(message, pattern), f"{ANSWERS[name]['what']}:\n{message[:3000]}\n!= {pattern}"
    assert len(message) < 6000, "a bounded line"
    assert "sk-hostile-test-key" not in message
    assert took < SPEC["within_s"], f"{name} took {took:.1f} s, over the bound of {SPEC['within_s']} s"
    assert not asked_other, "the other origin was asked: the redirect was followed"


def test_every_hostile_answer_is_met_by_some_client_or_the_key_check() -> None:
    unexercised = [n for n, spec in ANSWERS.items() if not spec["expect"] and n != "litellm_no_db"]
    assert not unexercised and all(spec.get("what") for spec in ANSWERS.values())


def _chunk(delta: str, finish: str = "null") -> bytes:
    return (b'data: {"id":"c","object":"chat.completion.chunk","model":"ml4","choices":[{"index":0,"delta":'
            + delta.encode() + b',"finish_reason":' + finish.encode() + b"}]}\n\n")


def test_control_a_well_behaved_endpoint_passes_every_client() -> None:
    """The same clients against correct answers: no guard fires without a fault. The stream lasts twice the idle
    deadline, tokens 0.5 s apart with a ``: ping`` between them: only a gap without progress counts as idle."""
    tokens = [b": ping\n\n", _chunk('{"content":"Par"}')] * 8
    stream = [_chunk('{"role":"assistant","content":""}'), *tokens, _chunk('{"content":"is"}', '"stop"'),
              (b'data: {"id":"c","object":"chat.completion.chunk","model":"ml4","choices":[],"usage":'
              b'{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}\n\n'), b"data: [DONE]\n\n"]
    with StubServer({"/v1/chat/completions": Scripted(200, "application/json", [CHAT_OK])}) as srv:
        _sdk(Endpoint(srv.base_url, api_key="sk-x", deadlines=DEADLINES))
        _httpx(Endpoint(srv.base_url, api_key="sk-x", deadlines=DEADLINES))
        srv.routes["/v1/chat/completions"] = Scripted(200, "text/event-stream", stream, delay_s=0.25)
        patient = DEADLINES.overriding(idle_s=2.0, overall_s=120.0)
        started = time.monotonic()
        _probe(Endpoint(srv.base_url, api_key="sk-x", deadlines=patient))
    assert time.monotonic() - started > patient.idle_s, "the stream must outlast the idle deadline to prove this"


def test_same_origin_redirect_is_followed_by_the_sdk() -> None:
    """Only another origin is refused: a redirect within the endpoint's server is the SDK's usual business."""
    with StubServer({"/v1/chat/completions": Scripted(307, "text/plain", [], headers={"Location": "/v1/moved"}),
                     "/v1/moved": Scripted(200, "application/json", [CHAT_OK])}) as srv, \
            make_openai(Endpoint(srv.base_url, api_key="sk-x", deadlines=DEADLINES)) as client:
        assert client.chat.completions.create(**BODY).choices[0].message.content == "Paris"


def test_async_sdk_reports_an_html_page_as_one_assertion() -> None:
    import asyncio

    with StubServer({"/v1/chat/completions": hostile("html_502")}) as srv:
        ep = Endpoint(srv.base_url, api_key="sk-x", deadlines=DEADLINES)

        async def ask() -> Any:
            return await make_async_openai(ep).chat.completions.create(**BODY)

        with pytest.raises(EndpointMisbehaved, match=r"answer from .*/v1/chat/completions is not JSON \(an HTML"):
            asyncio.run(ask())


def test_the_sdk_still_raises_its_own_errors_for_json_refusals() -> None:
    """A JSON 4xx is an answer the checks judge (refusal shapes), not a hostile one."""
    with StubServer({"/v1/chat/completions": hostile("litellm_no_db")}) as srv, \
            make_openai(Endpoint(srv.base_url, api_key="sk-x", deadlines=DEADLINES)) as client, \
            pytest.raises(openai.BadRequestError, match="No connected db."):
        client.chat.completions.create(**BODY)


@pytest.mark.parametrize(("answer", "status"), [("litellm_no_db", 400), (None, 401)])
def test_a_refused_key_stops_with_one_line_naming_the_variable(answer: str | None, status: int) -> None:
    """LiteLLM's 400 ``No connected db.`` is a refused key as much as vLLM's 401 (pytest_ml4/data/bad_input/refused_keys.yaml)."""
    script = hostile(answer) if answer else Scripted(401, "application/json", [b'{"error":"Unauthorized"}'])
    with StubServer({"/v1/models": script}) as srv:
        problem = check_reachable(Endpoint(srv.base_url, api_key="sk-wrong-0123456789"), key_source="LLM_API_KEY")
    assert problem is not None and problem.startswith(
        f"endpoint {srv.base_url}/models refused the API key from LLM_API_KEY: HTTP {status}: ")
    assert "sk-wrong" not in problem


def test_a_400_that_is_not_a_key_refusal_is_the_tests_business() -> None:
    with StubServer({"/v1/models": Scripted(400, "application/json", [b'{"error":{"message":"bad request"}}'])}) as srv:
        assert check_reachable(Endpoint(srv.base_url, api_key="sk-x"), key_source="LLM_API_KEY") is None


def test_deadlines_derive_from_the_target() -> None:
    from pytest_ml4.target.model import load_target

    d = Deadlines.for_target(load_target("rtxpro6000-tp8"))
    # rtxpro6000-tp8: TTFT knee 5 s (12 x = 60 s, the floor), ITL p50 11.7 ms (10 x = 0.117 s/token), osl 4096.
    assert (d.connect_s, d.first_byte_s, d.idle_s) == (5.0, 60.0, 30.0)
    assert d.slow_itl_s == pytest.approx(0.117) and d.default_max_tokens == 4096
    assert d.overall_for(64, 60.0) == pytest.approx(60 + 64 * 0.117)
    assert d.overall_for(None, 60.0) == pytest.approx(60 + 4096 * 0.117)
    assert d.overriding(overall_s=90.0).overall_for(64, 60.0) == 90.0


@pytest.mark.parametrize(("spec", "error"), [("idle=x", "'idle=x': 'x' is not a number of seconds"),
                                             ("stall=3", "'stall=3' is not NAME=SECONDS"),
                                             ("idle=0", "seconds must be more than 0")])
def test_bad_deadline_values_name_the_item(spec: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_deadlines(spec)


# -- the suites' own checks against hostile answers (pytester runs a copy of suites/test_smoke.py) -----------

MODELS = (b'{"object":"list","data":[{"id":"ml4","object":"model","owned_by":"vllm","max_model_len":256000}]}')
SMOKE = "suites/test_smoke.py"


def _smoke(pytester: pytest.Pytester, srv: StubServer, *args: str) -> tuple[pytest.RunResult, float]:
    started = time.monotonic()
    result = pytester.runpytest("--target", "rtxpro6000-tp8", "--endpoint", srv.base_url, "-p", "no:randomly",
                                f"--ml4-run-dir={pytester.path / 'run'}", SMOKE, *args)
    return result, time.monotonic() - started


def test_a_stalled_deployment_fails_the_smoke_checks_within_the_deadline(
        pytester: pytest.Pytester, smoke_copy: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stalled endpoint fails its first check within the documented deadline (here set
    small by --ml4-deadlines), naming the URL and how long it waited; a login page on /health fails test_health.
    The stream check after the stall is not sent (tests/test_breaker.py): not judged, naming the stall."""
    monkeypatch.setenv("LLM_API_KEY", "sk-not-used-0123456789")
    with StubServer({"/v1/models": Scripted(200, "application/json", [MODELS]),
                     "/health/liveliness": hostile("html_200"),
                     "/v1/chat/completions": hostile("stalled")}) as srv:
        result, took = _smoke(pytester, srv, "--ml4-deadlines", "first_byte=1,idle=1,overall=2",
                              "-k", "health or chat_answers_known_question or stream_answers_known_question")
    assert result.parseoutcomes() == {"failed": 2, "not_judged": 1, "deselected": 7}, result.outlines[-3:]
    url = f"{srv.base_url}/chat/completions"
    out = result.stdout.str()
    assert ("ml4 deadlines per request: connect 5 s, first byte 1 s, idle 1 s, overall 2 s (--ml4-deadlines)"
            in out), "the header states the deadlines in force"
    assert (f"DeadlineExceeded: {url}: nothing arrived, not even response headers, within the first-byte deadline "
            f"of 2 s") in out, out[-3000:]
    assert (f"NOT JUDGED suites/test_smoke.py::test_stream_answers_known_question_with_clean_grammar: not sent: "
            f"endpoint {url} judged stalled by suites/test_smoke.py::test_chat_answers_known_question: nothing "
            f"arrived, not even response headers, within the first-byte deadline of 2 s") in out, out[-3000:]
    assert f"GET /health/liveliness from {srv.url}/health/liveliness is an HTML page (HTTP 200" in out, out[-3000:]
    assert took < 90, f"three stalled checks with 2 s deadlines took {took:.0f} s"


def _completion(content: str) -> Scripted:
    body = (b'{"id":"c","object":"chat.completion","created":1,"model":"ml4","choices":[{"index":0,"message":'
            b'{"role":"assistant","content":"' + content.encode() + b'"},"finish_reason":"length"}],'
            b'"usage":{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}}')
    return Scripted(200, "application/json", [body])


@pytest.mark.parametrize(("answer", "says"), [
    ("3 MB", "finish_reason 'length', content 'yyyy"),  # under the size cap: the check quotes it, the hook cuts it
    ("50 MB", "answer from *exceeded 8,388,608 bytes"),  # over the cap: cut off before any check sees it
])
def test_a_huge_wrong_answer_stays_a_bounded_failure(pytester: pytest.Pytester, smoke_copy: None,
                                                     monkeypatch: pytest.MonkeyPatch, answer: str, says: str) -> None:
    """A huge answer becomes a message of a few KB on the console and in the Allure results, the total size
    stated (was: 100 MB of console and two 100 MB Allure results for a 50 MB answer)."""
    monkeypatch.setenv("LLM_API_KEY", "sk-not-used-0123456789")
    script = _completion("y" * 3_000_000) if answer == "3 MB" else hostile("huge")
    with StubServer({"/v1/models": Scripted(200, "application/json", [MODELS]),
                     "/v1/chat/completions": script}) as srv:
        result, _ = _smoke(pytester, srv, "-k", "chat_answers_known_question")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert fnmatch.fnmatch(out, f"*{says}*") and " in all" in out, out[-3000:]
    assert len(out) < 100_000, f"{len(out):,} characters of console for one failure"
    allure = sum(p.stat().st_size for p in (pytester.path / "run" / "allure-results").rglob("*") if p.is_file())
    assert allure < 500_000, f"{allure:,} bytes of Allure results for one failure"


def test_wrong_key_through_litellm_without_a_db_stops_the_session_in_one_line(
        pytester: pytest.Pytester, smoke_copy: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM's recorded 400 ``No connected db.`` stops the session like a 401 (was: 8 failed, 2 passed)."""
    monkeypatch.setenv("LLM_API_KEY", "sk-wrong-key-0123456789")
    with StubServer({"/v1/models": hostile("litellm_no_db")}) as srv:
        result, _ = _smoke(pytester, srv)
    assert result.ret == 3
    lines = [ln for ln in result.outlines + result.errlines
             if f"ml4: endpoint {srv.base_url}/models refused the API key from LLM_API_KEY: HTTP 400: " in ln]
    assert lines and "No connected db." in lines[0], "\n".join(result.outlines[-20:] + result.errlines[-20:])
    assert "sk-wrong-key" not in result.stdout.str() + result.stderr.str()


def test_attachments_are_capped_with_the_total_size_stated(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An 8 MB transcript or stream is cut in the report, saying how big it was."""
    import allure

    from pytest_ml4.report import attach as attach_mod

    attached: list[tuple[str, Any]] = []
    monkeypatch.setattr(allure, "attach", lambda body, name, attachment_type: attached.append((name, body)))
    transcript = tmp_path / "t.sse.txt"
    transcript.write_bytes(b"data: x\n\n" * 500_000)
    attach_mod.attach_file(transcript)
    attach_mod.attach_text("y" * 3_000_000, "text")
    (_, file_body), (_, text_body) = attached
    assert len(file_body) < attach_mod.MAX_TEXT_ATTACHMENT + 500
    assert file_body.endswith(f"[attachment cut: 4,500,000 bytes in all; the whole file is {transcript}]\n".encode())
    assert len(text_body) < attach_mod.MAX_TEXT_ATTACHMENT + 500
    assert text_body.endswith("[attachment cut: 3,000,000 characters in all]\n")

    rec = attach_mod.ExchangeRecorder()
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"zzzzzzzz"}}]}\n\n'
    with StubServer({"/v1/chat/completions": Scripted(200, "text/event-stream", [chunk], repeat=20_000)}) as srv, \
            make_httpx(Endpoint(srv.base_url, deadlines=Deadlines())) as http:  # read it all, however loaded
        rec.install(http)
        rec.start()
        probe_chat_stream(http, BODY)
    (exchange,) = rec.exchanges
    assert exchange.render().endswith(f"[stream cut: {len(chunk) * 20_000:,} bytes in all]")
