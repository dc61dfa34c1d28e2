"""Client factories and endpoint handling: secrets stay out of reprs, timeouts and retries are as promised,
an unreachable endpoint is one line within seconds, and non-JSON answers are quoted."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest
from ml4_http_stub import Scripted, StubServer

from pytest_ml4.client.endpoint import (
    BadResponseError,
    Endpoint,
    EndpointConfigError,
    check_reachable,
    decode_json,
    endpoint_from_env,
    explain_openai_error,
    make_async_openai,
    make_httpx,
    make_openai,
)
from pytest_ml4.client.transport import AsyncGuardedTransport, GuardedTransport

SECRET = "sk-live-do-not-print-1234567890"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_key_never_in_repr_or_str() -> None:
    ep = Endpoint("https://user:pw@llm.example.com:8443/v1/", api_key=SECRET, model="ml4",
                  headers={"X-Gateway-Token": SECRET})
    for text in (repr(ep), str(ep), f"{ep}"):
        assert SECRET not in text and "pw" not in text
    assert "api_key=<set>" in repr(ep) and "X-Gateway-Token" in repr(ep)
    assert ep.host_for_display() == "https://llm.example.com:8443"
    assert ep.base_url == "https://user:pw@llm.example.com:8443/v1"
    assert ep.effective_metrics_url.endswith(":8443/metrics")


def test_base_url_must_end_in_v1() -> None:
    with pytest.raises(EndpointConfigError, match="must end in /v1"):
        Endpoint("http://127.0.0.1:8000", api_key=None)


def test_factories_use_no_retries_and_a_short_connect_timeout() -> None:
    ep = Endpoint("http://127.0.0.1:9/v1", api_key=SECRET)
    for client in (make_openai(ep), make_async_openai(ep)):
        assert client.max_retries == 0
        assert client.timeout.connect == 5.0 and client.timeout.read == ep.deadlines.first_byte_s
        assert SECRET not in repr(client)
        assert isinstance(client._client._transport, (GuardedTransport, AsyncGuardedTransport))
    http = make_httpx(ep, timeout=30)
    assert http.headers["authorization"] == f"Bearer {SECRET}" and http.timeout.connect == 5.0
    assert http.timeout.read == 30 and str(http.base_url) == "http://127.0.0.1:9/v1/"
    assert isinstance(http._transport, GuardedTransport) and http._transport.deadlines.first_byte_s == 30


#: uvicorn's default ``timeout_keep_alive`` (LiteLLM's proxy and vLLM's API server run on uvicorn without changing it).
UVICORN_KEEP_ALIVE_S = 5.0


def test_every_client_drops_an_idle_connection_before_uvicorn_closes_it() -> None:
    """A pooled connection reused at the server's keep-alive limit is reset before the request is served; the
    suite never retries, so its clients must give idle connections up first."""
    ep = Endpoint("http://127.0.0.1:9/v1", api_key=SECRET)
    transports = [make_openai(ep)._client._transport, make_async_openai(ep)._client._transport,
                  make_httpx(ep)._transport]
    for transport in transports:
        pool = transport.inner._pool
        assert pool._keepalive_expiry < UVICORN_KEEP_ALIVE_S, type(transport).__name__


def test_unreachable_endpoint_is_one_line_within_seconds() -> None:
    ep = Endpoint(f"http://127.0.0.1:{_free_port()}/v1", api_key=SECRET)
    problem = check_reachable(ep)  # bounded by the connect timeout; the line is asserted, not the time
    assert problem is not None and "\n" not in problem
    assert f"{ep.root_url}/v1/models" in problem and "ConnectError" in problem and SECRET not in problem


def test_any_other_http_answer_counts_as_reachable() -> None:
    with StubServer({"/v1/models": Scripted(404, "application/json", [b'{"error":"Not Found"}'])}) as srv:
        assert check_reachable(Endpoint(srv.base_url, api_key=SECRET)) is None
        assert srv.seen[0].headers["authorization"] == f"Bearer {SECRET}"


def test_a_refused_session_key_is_one_line_naming_url_and_variable() -> None:
    with StubServer({"/v1/models": Scripted(401, "application/json", [b'{"error":"Unauthorized"}'])}) as srv:
        problem = check_reachable(Endpoint(srv.base_url, api_key=SECRET), key_source="LLM_API_KEY")
        assert problem == (f"endpoint {srv.base_url}/models refused the API key from LLM_API_KEY: HTTP 401: "
                           """'{"error":"Unauthorized"}'""")
        assert check_reachable(Endpoint(srv.base_url, api_key="")) is None, "no key sent: the tests' business"


def test_html_answer_is_quoted() -> None:
    page = b"<html><body><h1>502 Bad Gateway</h1>nginx</body></html>"
    with StubServer({"/v1/models": Scripted(502, "text/html", [page])}) as srv, \
            make_httpx(Endpoint(srv.base_url)) as http:
        resp = http.get("models")
    with pytest.raises(BadResponseError) as info:
        decode_json(resp, "GET /v1/models")
    text = str(info.value)
    assert "is not JSON" in text and "HTTP 502" in text and "text/html" in text and "502 Bad Gateway" in text


def test_truncated_json_is_quoted_and_long_bodies_cut() -> None:
    body = b'{"object":"list","data":[' + b'{"id":"x"},' * 100
    with StubServer({"/v1/models": Scripted(200, "application/json", [body])}) as srv, \
            make_httpx(Endpoint(srv.base_url)) as http:
        resp = http.get("models")
    with pytest.raises(BadResponseError, match=r"\.\.\.' \(1,125 bytes in all\)$"):
        decode_json(resp)


def test_openai_errors_are_explained_with_the_body() -> None:
    err_body = b'{"error":{"message":"The model `foo` does not exist.","type":"NotFoundError","param":"model","code":404}}'
    with StubServer({"/v1/chat/completions": Scripted(404, "application/json", [err_body])}) as srv:
        client = make_openai(Endpoint(srv.base_url, api_key=SECRET, model="foo"))
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model="foo", messages=[{"role": "user", "content": "hi"}])
    line = explain_openai_error(info.value)
    assert line.startswith("HTTP 404 NotFoundError") and "does not exist" in line and SECRET not in line


def test_openai_connection_error_is_one_line() -> None:
    client = make_openai(Endpoint(f"http://127.0.0.1:{_free_port()}/v1", api_key=SECRET))
    with pytest.raises(openai.APIConnectionError) as info:
        client.models.list()
    assert "APIConnectionError" in explain_openai_error(info.value)


def test_endpoint_from_env_names_missing_variables_only() -> None:
    with pytest.raises(EndpointConfigError, match="set ML4_X_URL"):
        endpoint_from_env(url_env="ML4_X_URL", model="ml4", env={})
    with pytest.raises(EndpointConfigError, match="LLM_API_KEY is not set"):
        endpoint_from_env(url_env="U", model="ml4", api_key_env="LLM_API_KEY", requires_api_key=True,
                          env={"U": "http://h/v1"})
    ep = endpoint_from_env(url_env="U", model="ml4", api_key_env="K", requires_api_key=True, proxy=True,
                           metrics_url_env="M", env={"U": "http://h:1/v1", "K": SECRET, "M": "http://h:2/metrics"})
    assert ep.api_key == SECRET and ep.proxy and ep.metrics_url == "http://h:2/metrics"


def test_httpx_client_joins_paths_under_v1() -> None:
    with StubServer({"/v1/models": Scripted(200, "application/json", [b'{"data":[]}'])}) as srv, \
            make_httpx(Endpoint(srv.base_url)) as http:
        assert http.get("/models").status_code == 200
        assert srv.seen[-1].path == "/v1/models"
    assert isinstance(http, httpx.Client)
