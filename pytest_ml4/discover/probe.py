"""What a running deployment shows over HTTP: ``/v1/models``, ``/version``, ``/metrics`` and ``/health``.

Each answer is kept with the URL it came from (the provenance written into the target). A deployment that cannot
be reached, or refuses the key, is a :class:`DiscoverError` of one line naming the URL or the variable; a page
that is missing or unreadable (a proxy has no ``/version``) is a note in :attr:`Shown.unread`, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_ml4.client.endpoint import (
    BadResponseError,
    Endpoint,
    EndpointConfigError,
    check_reachable,
    decode_json,
    key_refusal,
    make_httpx,
)
from pytest_ml4.client.urls import display_url
from pytest_ml4.evidence.metrics import MetricsError, MetricsSnapshot, parse_metrics


class DiscoverError(ValueError):
    """The deployment could not be read or the target not written; the message is one line."""


@dataclass
class Shown:
    """The deployment's answers, each with the URL (credentials cut off) it came from."""

    base_url: str
    models: list[dict[str, Any]]
    models_url: str
    #: Whether ``/v1/models`` refused a request without the key (None: no key was given to compare with).
    requires_key: bool | None = None
    version: str | None = None
    version_url: str = ""
    metrics: MetricsSnapshot | None = None
    metrics_url: str = ""
    #: A Dynamo frontend's ``/health`` body (a vLLM server answers an empty 200: None).
    health: dict[str, Any] | None = None
    health_url: str = ""
    #: Behind a proxy: the engine's own model cards (``--metrics-url``'s server), where the context length is.
    engine_models: list[dict[str, Any]] = field(default_factory=list)
    engine_models_url: str = ""
    #: Pages that could not be read, one line each (``/version: HTTP 404``).
    unread: list[str] = field(default_factory=list)


def endpoint_for(url: str, api_key: str | None, metrics_url: str | None = None) -> Endpoint:
    """The endpoint to read; ``metrics_url``: the engine's own /metrics behind a proxy (its root serves /version)."""
    try:
        return Endpoint(base_url=url, api_key=api_key, metrics_url=metrics_url)
    except EndpointConfigError as err:
        raise DiscoverError(f"--endpoint: {err}") from None


def probe(ep: Endpoint, key_source: str | None = None) -> Shown:
    """Read everything the endpoint shows; ``key_source`` names the key's variable in messages (never the key)."""
    problem = check_reachable(ep, key_source=key_source)
    if problem:
        raise DiscoverError(problem)
    with make_httpx(ep) as http:
        shown = _models(http, ep)
        shown.requires_key = _requires_key(ep) if ep.api_key else None
        if ep.metrics_url:
            _engine_models(http, ep, shown)
        _version(http, ep, shown)
        _metrics(http, ep.effective_metrics_url, shown)
        _health(http, ep, shown)
    return shown


def _get(http: httpx.Client, url: str) -> httpx.Response | str:
    """The response, or one line saying why there is none."""
    try:
        return http.get(url)
    except httpx.HTTPError as err:
        return f"{display_url(url)}: {type(err).__name__}: {err}"


def _models(http: httpx.Client, ep: Endpoint) -> Shown:
    url = f"{ep.base_url}/models"
    resp = _get(http, url)
    if isinstance(resp, str):
        raise DiscoverError(resp)
    if resp.status_code != 200:
        raise DiscoverError(f"{display_url(url)} answered HTTP {resp.status_code}: {resp.text[:200]!r}")
    try:
        body = decode_json(resp, "/v1/models")
    except BadResponseError as err:
        raise DiscoverError(str(err)) from None
    cards = body.get("data") if isinstance(body, dict) else None
    if not isinstance(cards, list) or not cards or not all(isinstance(c, dict) and c.get("id") for c in cards):
        raise DiscoverError(f"{display_url(url)} lists no served model (no data[].id): {resp.text[:200]!r}")
    return Shown(base_url=display_url(ep.base_url), models=cards, models_url=display_url(url))


def _requires_key(ep: Endpoint) -> bool | None:
    """Whether ``/v1/models`` refuses a request without a key, as the stack refuses one (None: no answer)."""
    try:
        resp = httpx.get(f"{ep.base_url}/models", headers=dict(ep.headers), timeout=10.0)
    except httpx.HTTPError:
        return None
    return key_refusal(resp.status_code, resp.text) is not None


def _page(http: httpx.Client, url: str, shown: Shown) -> httpx.Response | None:
    """A 200 answer, or None with the reason noted in ``shown.unread``."""
    resp = _get(http, url)
    if isinstance(resp, str) or resp.status_code != 200:
        shown.unread.append(resp if isinstance(resp, str) else f"{display_url(url)}: HTTP {resp.status_code}")
        return None
    return resp


def _engine_models(http: httpx.Client, ep: Endpoint, shown: Shown) -> None:
    url = f"{ep.engine_root_url}/v1/models"
    shown.engine_models_url = display_url(url)
    resp = _page(http, url, shown)
    try:
        cards = resp.json().get("data") if resp is not None else None
    except (ValueError, AttributeError):
        cards = None
    if isinstance(cards, list):
        shown.engine_models = [c for c in cards if isinstance(c, dict) and c.get("id")]


def _version(http: httpx.Client, ep: Endpoint, shown: Shown) -> None:
    url = f"{ep.engine_root_url}/version"
    shown.version_url = display_url(url)
    resp = _page(http, url, shown)
    if resp is None:
        return
    try:
        version = resp.json().get("version")
    except (ValueError, AttributeError):
        version = None
    if isinstance(version, str) and version:
        shown.version = version
    else:
        shown.unread.append(f"{shown.version_url}: no version in {resp.text[:100]!r}")


def _metrics(http: httpx.Client, url: str, shown: Shown) -> None:
    shown.metrics_url = display_url(url)
    resp = _page(http, url, shown)
    if resp is None:
        return
    try:
        shown.metrics = parse_metrics(resp.text)
    except MetricsError as err:
        shown.unread.append(f"{shown.metrics_url}: {err}")


def _health(http: httpx.Client, ep: Endpoint, shown: Shown) -> None:
    url = f"{ep.root_url}/health"
    shown.health_url = display_url(url)
    resp = _get(http, url)
    if isinstance(resp, str) or resp.status_code != 200 or not resp.content.strip():
        return  # vLLM's /health is an empty 200: nothing to read, nothing missing
    try:
        body = resp.json()
    except ValueError:
        return
    if isinstance(body, dict) and isinstance(body.get("instances"), list):
        shown.health = body
