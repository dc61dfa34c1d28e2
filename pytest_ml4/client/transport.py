"""The guarded transport under every client the suites use: deadlines, no cross-origin redirect, bounded bodies.

A hostile or broken endpoint must end a check in bounded time with one assertion naming the URL.
The guard sits at the httpx transport, so the raw httpx client, the stream probe and the
openai SDK (given an httpx client built here) all get the same rules:

* four deadlines per request (:class:`Deadlines`): connect, first byte (response headers), idle (no progress;
  an SSE comment such as ``: ping`` is not progress) and overall (derived from the request's ``max_tokens``);
* a redirect to another origin is refused before any client can follow it;
* a body larger than the request could need is cut off (a 50 MB answer never reaches a check or a report);
* for the openai SDK only (``validate_json``): a 2xx answer that is not a UTF-8 JSON object, or is an error
  object inside a 200, is refused (the SDK would hand the check a str, a None or a raw decode error).

Every refusal is an :class:`EndpointMisbehaved` (an AssertionError, so the check is *failed* with the message),
and also the httpx exception the callers already handle (the probe records it as a stream violation; the SDK
wraps it, and :mod:`pytest_ml4.client.endpoint` unwraps it again).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urljoin

import httpx

from pytest_ml4.client.urls import display_url

#: Below these a healthy deployment can fail a check: a single request may queue behind a long prefill
#: (256k-token prompts) or a batch being preempted, so the floors are generous and the options can raise them.
CONNECT_S = 5.0
FIRST_BYTE_FLOOR_S = 60.0
IDLE_FLOOR_S = 30.0
#: How many times the target's TTFT knee a first byte may take, and its typical ITL a token (the slow-ITL bound).
TTFT_FACTOR = 12.0
ITL_FACTOR = 10.0
#: Idle: as long as this many tokens at the slow-ITL bound take, at least IDLE_FLOOR_S.
IDLE_TOKENS = 100
SLOW_ITL_FLOOR_S = 0.1
#: A body bigger than this per requested token (SSE chunk with usage and ids is ~0.5 KB) cannot be an answer.
BYTES_PER_TOKEN = 2048
MIN_BODY_BYTES = 8 * 1024 * 1024
#: How much of an answer a message quotes.
QUOTE_BYTES = 2048


class EndpointMisbehaved(AssertionError):
    """The endpoint answered in a way no check can judge; the message is one line naming the URL."""


class DeadlineExceeded(httpx.TimeoutException, EndpointMisbehaved):
    """A connect, first-byte, idle or overall deadline passed."""

    #: Nothing arrived (connect, first byte, idle): the endpoint stalled. False for the overall deadline of an
    #: answer whose bytes kept coming (slow but alive); :mod:`pytest_ml4.client.breaker` trips only on a stall.
    stalled = True


class CrossOriginRedirect(httpx.TransportError, EndpointMisbehaved):
    """The endpoint redirected to another origin; the guard never follows it."""


class BadAnswer(httpx.DecodingError, EndpointMisbehaved):
    """Too big, not UTF-8, not JSON, or an error inside a 200."""


@dataclass(frozen=True)
class Deadlines:
    """Per-request time limits; ``overall_s`` None means first byte + ``max_tokens`` x the slow-ITL bound."""

    connect_s: float = CONNECT_S
    first_byte_s: float = 120.0
    idle_s: float = IDLE_FLOOR_S
    slow_itl_s: float = 0.25
    default_max_tokens: int = 4096
    overall_s: float | None = None

    @classmethod
    def for_target(cls, target: Any) -> Deadlines:
        """From the target: its TTFT knee (first byte), typical ITL (slow-ITL bound), output length (max_tokens)."""
        itl = max(SLOW_ITL_FLOOR_S, ITL_FACTOR * target.sim.itl_ms / 1000.0)
        return cls(first_byte_s=max(FIRST_BYTE_FLOOR_S, TTFT_FACTOR * target.gates.ttft_p99_knee_s),
                   idle_s=max(IDLE_FLOOR_S, IDLE_TOKENS * itl), slow_itl_s=itl, default_max_tokens=target.perf.osl)

    def overriding(self, **values: float | None) -> Deadlines:
        """A copy with the values that are set (options left unset keep the derived ones)."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})

    def overall_for(self, max_tokens: int | None, first_byte_s: float) -> float:
        if self.overall_s is not None:
            return max(self.overall_s, first_byte_s)
        return first_byte_s + (max_tokens or self.default_max_tokens) * self.slow_itl_s

    def body_cap(self, max_tokens: int | None) -> int:
        return max(MIN_BODY_BYTES, (max_tokens or self.default_max_tokens) * BYTES_PER_TOKEN)

    def describe(self) -> str:
        overall = f"{self.overall_s:g} s" if self.overall_s is not None else (
            f"first byte + max_tokens x {self.slow_itl_s:g} s")
        return (f"connect {self.connect_s:g} s, first byte {self.first_byte_s:g} s, idle {self.idle_s:g} s, "
                f"overall {overall}")


#: ``--ml4-deadlines`` names -> :class:`Deadlines` fields.
DEADLINE_NAMES = {"connect": "connect_s", "first_byte": "first_byte_s", "idle": "idle_s", "overall": "overall_s",
                  "slow_itl": "slow_itl_s"}


def parse_deadlines(spec: str | None) -> dict[str, float]:
    """``"idle=5,overall=60"`` -> Deadlines field values; ValueError with one line naming what is wrong."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in (spec or "").split(","))):
        name, sep, value = item.partition("=")
        field_name = DEADLINE_NAMES.get(name.strip())
        if not sep or field_name is None:
            raise ValueError(f"{item!r} is not NAME=SECONDS with NAME one of {', '.join(DEADLINE_NAMES)}")
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"{item!r}: {value!r} is not a number of seconds") from None
        if not seconds > 0:
            raise ValueError(f"{item!r}: seconds must be more than 0")
        out[field_name] = seconds
    return out


def quote_bytes(data: bytes, total: int | None = None, limit: int = QUOTE_BYTES) -> str:
    """The start of a body on one line, marked when cut and with the total size stated."""
    text = " ".join(data[:limit].decode("utf-8", errors="replace").split())
    size = len(data) if total is None else total
    return repr(text) + (f" ... ({size:,} bytes in all)" if size > limit else "")


def _shown(url: Any) -> str:
    return display_url(str(url))


def _max_tokens(request: httpx.Request) -> tuple[int | None, bool]:
    """``max_tokens`` (or ``max_completion_tokens``) and ``stream`` of a JSON request body."""
    try:
        body = json.loads(request.content or b"null")
    except (ValueError, httpx.RequestNotRead):
        return None, False
    if not isinstance(body, dict):
        return None, False
    n = body.get("max_tokens") or body.get("max_completion_tokens")
    return (n if isinstance(n, int) and n > 0 else None), bool(body.get("stream"))


@dataclass
class _Plan:
    """One request's limits and clock."""

    url: str
    first_byte_s: float
    idle_s: float
    overall_s: float
    body_cap: int
    t0: float

    @classmethod
    def of(cls, request: httpx.Request, d: Deadlines) -> _Plan:
        timeouts = request.extensions.setdefault("timeout", {})
        # A check that set its own read timeout (a 256k-token prompt) gets it as its first-byte deadline.
        given = timeouts.get("read")
        first = float(given) if given is not None and given != d.first_byte_s else d.first_byte_s
        max_tokens, stream = _max_tokens(request)
        overall = d.overall_for(max_tokens, first)
        if not stream:  # a non-streamed answer's headers come only after the whole generation
            first = max(first, overall)
        timeouts.update(connect=d.connect_s, read=first)
        return cls(_shown(request.url), first, d.idle_s, overall, d.body_cap(max_tokens), time.monotonic())

    def waited(self) -> float:
        return time.monotonic() - self.t0

    def headers_arrived(self, request: httpx.Request, health: Any = None) -> None:
        if health is not None:
            health.saw_answer()
        # httpcore reads the body with the read timeout it finds in this dict when the body is first read.
        request.extensions["timeout"]["read"] = min(self.idle_s, self.overall_s)

    def transport_error(self, err: httpx.TransportError) -> Exception:
        if isinstance(err, httpx.ConnectTimeout):
            return DeadlineExceeded(f"{self.url}: no connection within the connect deadline "
                                    f"(waited {self.waited():.1f} s)")
        if isinstance(err, httpx.ReadTimeout):
            return DeadlineExceeded(f"{self.url}: nothing arrived, not even response headers, within the "
                                    f"first-byte deadline of {self.first_byte_s:g} s (waited {self.waited():.1f} s)")
        return err

    def redirect(self, request: httpx.Request, response: httpx.Response) -> Exception | None:
        location = response.headers.get("location")
        if not response.is_redirect or not location:
            return None
        target = httpx.URL(urljoin(str(request.url), location))
        if (target.scheme, target.host, target.port) == (request.url.scheme, request.url.host, request.url.port):
            return None
        return CrossOriginRedirect(f"{self.url} redirected (HTTP {response.status_code}) to another origin, "
                                   f"{_shown(target)}: not followed, the check judges only the endpoint it was given")


class _Progress:
    """Whether new bytes carry progress: any byte of a plain body; in an SSE stream, anything but comments."""

    def __init__(self, sse: bool) -> None:
        self.sse = sse
        self.line_start = True
        self.comment = False

    def feed(self, chunk: bytes) -> bool:
        if not self.sse:
            return bool(chunk)
        moved = False
        parts = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        for i, part in enumerate(parts):
            if self.line_start and part:
                self.comment = part.startswith(b":")
            if part and not self.comment:
                moved = True
            self.line_start = i < len(parts) - 1 or (self.line_start and not part)
        return moved


class _BodyWatch:
    """Applies the idle, overall and size limits to a body as it arrives."""

    def __init__(self, plan: _Plan, response: httpx.Response, health: Any = None) -> None:
        self.plan, self.health = plan, health
        self.progress = _Progress(response.headers.get("content-type", "").startswith("text/event-stream"))
        self.size = 0
        self.head = bytearray()
        self.last_progress = time.monotonic()

    def seen(self, chunk: bytes) -> None:
        p, now = self.plan, time.monotonic()
        self.size += len(chunk)
        self.head.extend(chunk[: max(0, QUOTE_BYTES - len(self.head))])
        if self.progress.feed(chunk):
            self.last_progress = now
        if self.size > p.body_cap:
            raise BadAnswer(f"answer from {p.url} exceeded {p.body_cap:,} bytes, more than the request could need; "
                            f"cut off (starts {quote_bytes(bytes(self.head), self.size)})")
        if now - self.last_progress > p.idle_s:
            raise self.idle()
        if now - p.t0 > p.overall_s:
            slow = DeadlineExceeded(f"{p.url}: answer not finished within the overall deadline of {p.overall_s:g} s "
                                    f"(waited {p.waited():.1f} s; {self._arrived()})")
            slow.stalled = False
            raise slow

    def idle(self) -> DeadlineExceeded:
        p = self.plan
        return DeadlineExceeded(f"{p.url}: no progress for {time.monotonic() - self.last_progress:.1f} s, over the "
                                f"idle deadline of {p.idle_s:g} s (keep-alive comments are not progress; waited "
                                f"{p.waited():.1f} s in all; {self._arrived()})")

    def report(self, err: EndpointMisbehaved) -> EndpointMisbehaved:
        """Tell the run's breaker (:mod:`pytest_ml4.client.breaker`) what ended this body; returns ``err``."""
        if self.health is not None:
            self.health.observe(err, self.plan.url)
        return err

    def _arrived(self) -> str:
        return f"{self.size:,} bytes arrived: {quote_bytes(bytes(self.head), self.size, 300)}"


class _GuardedStream(httpx.SyncByteStream):
    def __init__(self, inner: Any, watch: _BodyWatch) -> None:
        self.inner, self.watch = inner, watch

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self.inner:
                self.watch.seen(chunk)
                yield chunk
        except httpx.ReadTimeout:
            raise self.watch.report(self.watch.idle()) from None
        except EndpointMisbehaved as err:
            raise self.watch.report(err) from None

    def close(self) -> None:
        self.inner.close()


class _AsyncGuardedStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, watch: _BodyWatch) -> None:
        self.inner, self.watch = inner, watch

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.inner:
                self.watch.seen(chunk)
                yield chunk
        except httpx.ReadTimeout:
            raise self.watch.report(self.watch.idle()) from None
        except EndpointMisbehaved as err:
            raise self.watch.report(err) from None

    async def aclose(self) -> None:
        await self.inner.aclose()


def _judged_as_json(response: httpx.Response) -> bool:
    """Not an SSE stream nor a redirect: the openai SDK parses it as JSON (an answer, or a 4xx/5xx's error)."""
    return not (response.is_redirect or response.headers.get("content-type", "").startswith("text/event-stream"))


def is_html(body: bytes, content_type: str = "") -> bool:
    """A web page (a login portal, a gateway's error page) rather than what an API answers."""
    return content_type.startswith("text/html") or body.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html"))


def json_problem(body: bytes, success: bool) -> tuple[Any, str | None]:
    """The decoded JSON and None, or None and what is wrong: not UTF-8, an HTML page, not JSON, an error in a 2xx."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as err:
        return None, f"is not valid UTF-8 (byte {err.start})"
    except ValueError:
        return None, "is not JSON (an HTML page)" if is_html(body) else "is not JSON"
    if success and isinstance(data, dict) and "error" in data and not {"choices", "data", "object"} & set(data):
        return None, "is an error inside a success"
    return data, None


def _refuse_bad_json(plan: _Plan, response: httpx.Response) -> None:
    """For the openai SDK: the body must be UTF-8 JSON, and a 2xx one must not be an error inside a 200."""
    _, problem = json_problem(response.content, response.is_success)
    if problem:
        ctype = response.headers.get("content-type", "")
        raise BadAnswer(f"answer from {plan.url} {problem} (HTTP {response.status_code}, content-type "
                        f"{ctype or 'none'}): {quote_bytes(response.content)}")


def _before_sending(health: Any, plan: _Plan) -> None:
    """The run's breaker (:mod:`pytest_ml4.client.breaker`) refuses a request once the endpoint was judged gone."""
    if health is not None:
        health.before_request(plan.url)


def _failed(health: Any, plan: _Plan, err: httpx.TransportError) -> Exception:
    """The error a failed send raises, told to the breaker first."""
    failure = plan.transport_error(err)
    if health is not None:
        health.observe(failure, plan.url)
    return failure


#: The connection pool of every client: httpx's defaults but an idle connection reused for at most 2 s. uvicorn
#: (LiteLLM's proxy, vLLM) closes an idle keep-alive connection after 5 s, which is also httpx's default expiry, so a
#: request sent on a pooled connection just as the server closes it is reset before it is served (2 of 456 BFCL
#: requests through LiteLLM once). The suite never retries (a retry would hide a real reset), so it must not reuse a
#: connection at the server's limit.
POOL_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=2.0)


class GuardedTransport(httpx.BaseTransport):
    """An httpx transport applying :class:`Deadlines`, the redirect rule and the size cap (see the module doc)."""

    def __init__(self, deadlines: Deadlines, *, validate_json: bool = False,
                 inner: httpx.BaseTransport | None = None, health: Any = None) -> None:
        self.deadlines, self.validate_json, self.health = deadlines, validate_json, health
        self.inner = inner or httpx.HTTPTransport(limits=POOL_LIMITS)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        plan = _Plan.of(request, self.deadlines)
        _before_sending(self.health, plan)
        try:
            response = self.inner.handle_request(request)
        except httpx.TransportError as err:
            raise _failed(self.health, plan, err) from None
        refused = plan.redirect(request, response)
        if refused is not None:
            response.close()
            raise refused
        plan.headers_arrived(request, self.health)
        response.stream = _GuardedStream(response.stream, _BodyWatch(plan, response, self.health))
        if self.validate_json and _judged_as_json(response):
            try:
                response.read()
                _refuse_bad_json(plan, response)
            finally:
                response.close()
        return response

    def close(self) -> None:
        self.inner.close()


class AsyncGuardedTransport(httpx.AsyncBaseTransport):
    """The asyncio twin of :class:`GuardedTransport`."""

    def __init__(self, deadlines: Deadlines, *, validate_json: bool = False,
                 inner: httpx.AsyncBaseTransport | None = None, health: Any = None) -> None:
        self.deadlines, self.validate_json, self.health = deadlines, validate_json, health
        self.inner = inner or httpx.AsyncHTTPTransport(limits=POOL_LIMITS)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        plan = _Plan.of(request, self.deadlines)
        _before_sending(self.health, plan)
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError as err:
            raise _failed(self.health, plan, err) from None
        refused = plan.redirect(request, response)
        if refused is not None:
            await response.aclose()
            raise refused
        plan.headers_arrived(request, self.health)
        response.stream = _AsyncGuardedStream(response.stream, _BodyWatch(plan, response, self.health))
        if self.validate_json and _judged_as_json(response):
            try:
                await response.aread()
                _refuse_bad_json(plan, response)
            finally:
                await response.aclose()
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()
