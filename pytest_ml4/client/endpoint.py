"""Client side of the suite: the endpoint description and the HTTP/OpenAI clients built from it.

Works without pytest::

    from pytest_ml4.client.endpoint import Endpoint, make_openai, make_httpx, check_reachable
    ep = Endpoint(base_url="http://127.0.0.1:8000/v1", api_key="...", model="mistral-large-4")
    problem = check_reachable(ep)          # None, or one line naming the URL and the error
    oai = make_openai(ep)                  # openai SDK, max_retries=0: the suite sees what the endpoint does
    http = make_httpx(ep)                  # httpx.Client with base_url + bearer auth (stream probe, raw checks)

The API key is held only on :class:`Endpoint` and in the clients' auth headers; it never appears in a repr,
``str()``, log line or error message produced here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
from pydantic import Field, field_validator

from pytest_ml4.checks.codes import Violation, fails_with
from pytest_ml4.client.transport import (
    AsyncGuardedTransport,
    Deadlines,
    EndpointMisbehaved,
    GuardedTransport,
    is_html,
    json_problem,
)
from pytest_ml4.client.urls import display_url, strip_userinfo
from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file

#: Connect timeout: an unreachable endpoint must be reported within seconds, not minutes.
CONNECT_TIMEOUT_S = 5.0
#: How long the start-of-session ``/models`` probe waits for an answer once connected: a loaded deployment
#: answering in 10 s is slow, not unreachable (only the connection is held to CONNECT_TIMEOUT_S).
PROBE_ANSWER_TIMEOUT_S = 60.0
#: How much of an unexpected body is quoted in an error message.
QUOTE_CHARS = 200


class EndpointConfigError(ValueError):
    """The endpoint cannot be described (missing URL or API-key variable); the message is one line."""


class BadResponseError(Violation):
    """The endpoint answered something that is not the JSON it should be; the message quotes what came back.

    A verdict (:class:`pytest_ml4.checks.codes.Violation`, an AssertionError) so a test that hits it is reported as
    *failed* with this message and its code.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message, _depth=3)  # the origin is the function that raised it, not this class


@dataclass(frozen=True)
class Endpoint:
    """Where the suite talks to: an OpenAI-compatible base URL ending in ``/v1``, the key, the model name."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    model: str = "mistral-large-4"
    metrics_url: str | None = None
    simulated: bool = False
    proxy: bool = False
    headers: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False)
    #: Dynamo: role (``worker|prefill|decode``) -> the workers' own /metrics URLs, where the ``vllm:*`` families
    #: live; empty when unknown (the frontend's /metrics has only ``dynamo_*``).
    worker_metrics_urls: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    #: Per-request limits of every client made from this endpoint (derived from the target, set by options).
    deadlines: Deadlines = field(default_factory=Deadlines, hash=False)
    #: The run's breaker (:class:`pytest_ml4.client.breaker.EndpointHealth`) every client made from this endpoint reports
    #: to and asks before sending; None: each request on its own.
    health: Any = field(default=None, hash=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.base_url.rstrip("/").endswith("/v1"):
            raise EndpointConfigError(f"endpoint base URL must end in /v1, got {strip_userinfo(self.base_url)}")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

    def __repr__(self) -> str:
        # Header *names* only: extra headers may carry tokens too.
        metrics = display_url(self.metrics_url) if self.metrics_url else None
        return (f"Endpoint(base_url={display_url(self.base_url)!r}, model={self.model!r}, "
                f"metrics_url={metrics!r}, simulated={self.simulated}, proxy={self.proxy}, "
                f"api_key={'<set>' if self.api_key else None}, headers={sorted(self.headers)})")

    __str__ = __repr__

    @property
    def root_url(self) -> str:
        """The server root (base URL without ``/v1``), where vLLM serves ``/health``, ``/metrics``, ``/version``."""
        return self.base_url[: -len("/v1")]

    @property
    def effective_metrics_url(self) -> str:
        return self.metrics_url or f"{self.root_url}/metrics"

    @property
    def engine_root_url(self) -> str:
        """The root of the server the metrics URL names: behind a proxy the engine's own server (its ``/health``,
        ``/v1/models``); the endpoint's own root when no other metrics URL is set."""
        return self.effective_metrics_url.rsplit("/metrics", 1)[0]

    def all_worker_metrics_urls(self) -> tuple[str, ...]:
        """Every worker's /metrics URL, roles in a fixed order (empty when none is known)."""
        return tuple(u for role in sorted(self.worker_metrics_urls) for u in self.worker_metrics_urls[role])

    def host_for_display(self) -> str:
        """``scheme://host:port`` without credentials, path or query: safe for report headers."""
        parts = urlsplit(self.base_url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}"

    def auth_headers(self) -> dict[str, str]:
        out = dict(self.headers)
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out


def worker_metrics_urls_from_env(role_vars: Mapping[str, str],
                                 environ: Mapping[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """Role -> URLs from the variables a target names (``endpoint.worker_metrics_url_env``), comma-separated.

    An unset or empty variable leaves its role out: the checks that need it skip and name the variable.
    """
    env = os.environ if environ is None else environ
    out: dict[str, tuple[str, ...]] = {}
    for role, var in role_vars.items():
        urls = tuple(u.strip() for u in (env.get(var) or "").split(",") if u.strip())
        if urls:
            out[role] = urls
    return out


def _deadlines(ep: Endpoint, timeout: float | None) -> Deadlines:
    """The endpoint's deadlines; ``timeout`` (a caller's own) replaces the first-byte one."""
    return ep.deadlines.overriding(first_byte_s=timeout)


def _httpx_timeout(d: Deadlines) -> httpx.Timeout:
    return httpx.Timeout(d.first_byte_s, connect=d.connect_s)


class _GuardedOpenAI(openai.OpenAI):
    """The openai SDK over a guarded httpx client; what the guard refused reaches the check as its assertion
    (the SDK would wrap it in ``APIConnectionError: Connection error.``, which names neither URL nor cause)."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().request(*args, **kwargs)
        except openai.APIConnectionError as err:
            raise _unwrapped(err) from None


class _GuardedAsyncOpenAI(openai.AsyncOpenAI):
    async def request(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().request(*args, **kwargs)
        except openai.APIConnectionError as err:
            raise _unwrapped(err) from None


def _unwrapped(err: openai.APIConnectionError) -> BaseException:
    return err.__cause__ if isinstance(err.__cause__, EndpointMisbehaved) else err


def make_openai(ep: Endpoint, timeout: float | None = None) -> openai.OpenAI:
    """A synchronous openai SDK client; ``max_retries=0`` so retries never hide a flaky endpoint.

    Its httpx client is guarded (:mod:`pytest_ml4.client.transport`): deadlines, no cross-origin redirect, bounded bodies,
    and any answer that is not UTF-8 JSON (or is an error inside a 200) fails as one assertion naming the URL.
    """
    d = _deadlines(ep, timeout)
    http = httpx.Client(transport=GuardedTransport(d, validate_json=True, health=ep.health), timeout=_httpx_timeout(d),
                        follow_redirects=True)
    return _GuardedOpenAI(base_url=ep.base_url, api_key=ep.api_key or "EMPTY", max_retries=0,
                          timeout=_httpx_timeout(d), default_headers=dict(ep.headers) or None, http_client=http)


def make_async_openai(ep: Endpoint, timeout: float | None = None) -> openai.AsyncOpenAI:
    """The asyncio twin of :func:`make_openai` (bursts of parallel requests)."""
    d = _deadlines(ep, timeout)
    http = httpx.AsyncClient(transport=AsyncGuardedTransport(d, validate_json=True, health=ep.health), timeout=_httpx_timeout(d),
                             follow_redirects=True)
    return _GuardedAsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key or "EMPTY", max_retries=0,
                               timeout=_httpx_timeout(d), default_headers=dict(ep.headers) or None,
                               http_client=http)


def make_httpx(ep: Endpoint, timeout: float | None = None) -> httpx.Client:
    """An httpx client rooted at the base URL (``http.post("/chat/completions", ...)``) with bearer auth, guarded."""
    d = _deadlines(ep, timeout)
    return httpx.Client(base_url=ep.base_url + "/", headers=ep.auth_headers(), timeout=_httpx_timeout(d),
                        transport=GuardedTransport(d, health=ep.health))


def check_reachable(ep: Endpoint, timeout: float = CONNECT_TIMEOUT_S, key_source: str | None = None) -> str | None:
    """None when the endpoint answers HTTP and takes the session's key, else one line naming the URL and the error.

    Transport failures (refused, DNS, TLS, timeout) and a refusal of the session's own key (any stack's way of
    saying so: :func:`key_refusal`) are reported, so the plugin can stop the session instead of failing every test; any other status (a 404, an HTML error page) is
    the tests' business. ``key_source`` names where the key came from (the variable), never the key.
    """
    url = f"{ep.base_url}/models"
    answer_s = max(timeout, PROBE_ANSWER_TIMEOUT_S)
    try:
        with httpx.Client(timeout=httpx.Timeout(answer_s, connect=timeout), headers=ep.auth_headers()) as http:
            resp = http.get(url)
    except httpx.ReadTimeout:
        return (f"endpoint {display_url(url)} accepted the connection but sent no answer within {answer_s:.0f} s "
                f"(reachable, but stalled or overloaded)")
    except httpx.HTTPError as err:
        return f"endpoint {display_url(url)} is unreachable: {type(err).__name__}: {_one_line(str(err)) or 'no detail'}"
    if ep.api_key and key_refusal(resp.status_code, resp.text) is not None:
        source = f" from {key_source}" if key_source else ""
        return (f"endpoint {display_url(url)} refused the API key{source}: HTTP {resp.status_code}: "
                f"{quote_body(resp.text)}")
    return None


REFUSALS_FILE = data_file("bad_input", "refused_keys.yaml")


class KeyRefusal(Strict):
    """One stack's recorded way of refusing a key: its status code(s) and a text its body holds ("" = any body).
    ``why``, ``source`` and ``recorded`` are the row's evidence, for the reader of the file."""

    #: The stack that answers this way (the file's ``stack``): a name for the message, never a branch.
    refused_by: str = Field(alias="stack")
    status: tuple[int, ...]
    body_contains: str = ""
    why: str
    source: str
    recorded: str | None = None

    @field_validator("status", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return value if isinstance(value, list) else [value]

    def matches(self, status: int, body: str) -> bool:
        return status in self.status and self.body_contains in body


class KeyRefusals(Strict):
    refusals: tuple[KeyRefusal, ...]


@functools.cache
def key_refusals(path: Path = REFUSALS_FILE) -> tuple[KeyRefusal, ...]:
    return load_yaml(path, KeyRefusals).refusals


def key_refusal(status: int, body: str) -> str | None:
    """The stack whose recorded way of refusing a key this answer is (``pytest_ml4/data/bad_input/refused_keys.yaml``)."""
    return next((row.refused_by for row in key_refusals() if row.matches(status, body)), None)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def quote_body(text: str | bytes, limit: int = QUOTE_CHARS) -> str:
    """The first ``limit`` characters of a body, on one line; when cut, marked and the total size stated."""
    total, unit = len(text), "bytes" if isinstance(text, bytes) else "characters"
    head = text[: limit * 8]  # never flatten a 50 MB body to quote 200 characters of it
    flat = _one_line(head.decode("utf-8", errors="replace") if isinstance(head, bytes) else head)
    if len(flat) <= limit and total <= limit * 8:
        return repr(flat)
    return repr(flat[:limit] + "...") + f" ({total:,} {unit} in all)"


@fails_with("endpoint.bad_json",
            "an answer that must be JSON is not (an HTML page, broken JSON, not UTF-8, an error inside a 2xx)")
def decode_json(resp: httpx.Response, what: str = "response") -> Any:
    """``resp.json()``, or a :class:`BadResponseError` quoting what came back: an HTML page, broken JSON, bytes
    that are not UTF-8, or an error object inside a 2xx."""
    data, problem = json_problem(resp.content, resp.is_success)
    if problem is None:
        return data
    ctype = resp.headers.get("content-type", "")
    raise BadResponseError("endpoint.bad_json", f"{what} from {display_url(str(resp.request.url))} {problem} (HTTP "
                           f"{resp.status_code}, content-type {ctype or 'none'}): {quote_body(resp.content)}")


@fails_with("endpoint.html_page", "an answer that must come from the API is an HTML page (a login portal's 200)")
def refuse_html(resp: httpx.Response, what: str) -> None:
    """A :class:`BadResponseError` when a page that should be an API's answer is an HTML page (a login portal
    answering 200 to ``/health`` is not a healthy deployment)."""
    ctype = resp.headers.get("content-type", "")
    if is_html(resp.content, ctype):
        raise BadResponseError("endpoint.html_page", f"{what} from {display_url(str(resp.request.url))} is an HTML page (HTTP "
                               f"{resp.status_code}, content-type {ctype or 'none'}): {quote_body(resp.content)}")


def explain_openai_error(err: BaseException) -> str:
    """One line for an openai SDK exception, quoting the body the server sent (never the request headers)."""
    if isinstance(err, openai.APIStatusError):
        try:
            body = err.response.text
        except Exception:  # a streamed response whose body was already consumed
            body = str(err.body)
        return f"HTTP {err.status_code} {type(err).__name__}: {quote_body(body)}"
    if isinstance(err, openai.APIResponseValidationError):
        return f"malformed response ({type(err).__name__}): {quote_body(err.response.text)}"
    if isinstance(err, openai.APIConnectionError):
        cause = err.__cause__
        return f"{type(err).__name__}: {err}" + (f" ({type(cause).__name__}: {_one_line(str(cause))})" if cause else "")
    return f"{type(err).__name__}: {_one_line(str(err))}"


def endpoint_from_env(*, url_env: str, model: str, api_key_env: str | None = None, requires_api_key: bool = False,
                      metrics_url_env: str | None = None, proxy: bool = False,
                      env: Mapping[str, str] | None = None, url: str | None = None,
                      default_url: str | None = None) -> Endpoint:
    """Build an :class:`Endpoint` from the environment variable *names* a target records.

    Raises :class:`EndpointConfigError` with one line (naming the variable, never a value) when the URL or a
    required key is missing.
    """
    env = os.environ if env is None else env
    base = url or env.get(url_env) or default_url
    if not base:
        raise EndpointConfigError(f"no endpoint URL: set {url_env} (or pass --endpoint)")
    key = env.get(api_key_env) if api_key_env else None
    if requires_api_key and not key:
        raise EndpointConfigError(
            f"the target requires an API key but {api_key_env or '(no api_key_env in the target)'} is not set")
    metrics = env.get(metrics_url_env) if metrics_url_env else None
    return Endpoint(base_url=base, api_key=key, model=model, metrics_url=metrics or None, proxy=proxy)
