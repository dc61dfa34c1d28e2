"""Allure attachments that are always redacted, and a recorder of HTTP exchanges for failing checks.

* :func:`attach_text`, :func:`attach_json`, :func:`attach_file` — use these (or ``redact()`` yourself) for request
  and response bodies, SSE transcripts, log excerpts, aiperf exports and plots; secrets are scrubbed first.
* :class:`ExchangeRecorder` hooks an ``httpx`` client (also the one inside an ``openai`` client): while a check
  runs it keeps its requests and responses, and :meth:`ExchangeRecorder.attach` puts them into the report when
  the check failed. Streamed (SSE) bodies are teed while the check reads them, up to :data:`MAX_BODY` bytes, so
  the transcript of a failing stream is in the report too.
"""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import allure
import httpx

from pytest_ml4.report.redact import redact

#: Bodies larger than this are cut in attachments (a 256k-token prompt would make the report unusable).
MAX_BODY = 64 * 1024
#: A plain-text attachment (an SSE transcript, a log) is cut here, the total size stated: a hostile 8 MB stream
#: must not become 8 MB per failing check in the Allure results. JSON and CSV exports stay whole (tools read them).
MAX_TEXT_ATTACHMENT = 1024 * 1024


def attach_text(text: str, name: str, kind: Any = allure.attachment_type.TEXT) -> None:
    """Attach text after redaction (plain text cut at :data:`MAX_TEXT_ATTACHMENT`, the total size stated)."""
    if kind == allure.attachment_type.TEXT and len(text) > MAX_TEXT_ATTACHMENT:
        text = text[:MAX_TEXT_ATTACHMENT] + f"\n... [attachment cut: {len(text):,} characters in all]\n"
    allure.attach(redact(text), name=name, attachment_type=kind)


def attach_json(obj: Any, name: str) -> None:
    """Attach a JSON-serialisable object after redaction (sensitive keys masked whole)."""
    allure.attach(json.dumps(redact(obj), indent=2, ensure_ascii=False, default=str), name=name,
                  attachment_type=allure.attachment_type.JSON)


def attach_file(path: Path, name: str | None = None) -> None:
    """Attach a file: PNGs as they are, text (JSON, CSV, logs) after redaction."""
    suffix = path.suffix.lower()
    kinds = {".png": allure.attachment_type.PNG, ".json": allure.attachment_type.JSON,
             ".csv": allure.attachment_type.CSV, ".html": allure.attachment_type.HTML}
    kind = kinds.get(suffix, allure.attachment_type.TEXT)
    body: bytes = path.read_bytes()
    if kind == allure.attachment_type.TEXT and len(body) > MAX_TEXT_ATTACHMENT:
        body = body[:MAX_TEXT_ATTACHMENT] + (f"\n... [attachment cut: {len(body):,} bytes in all; the whole file is "
                                             f"{path}]\n").encode()
    if suffix != ".png":
        body = redact(body)
    allure.attach(body, name=name or path.name, attachment_type=kind)


@dataclass
class Exchange:
    """One request and, when it came, its response."""

    method: str
    url: str
    request_headers: dict[str, str]
    request_body: str
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    response: Any = None   # httpx.Response (or the openai SDK's httpx2 one)
    streamed: bytearray | None = None  # what the check read of a streamed body (the first MAX_BODY bytes)
    streamed_bytes: int = 0  # how many bytes of it the check read in all

    def render(self) -> str:
        lines = [f"{self.method} {self.url}", *(f"{k}: {v}" for k, v in self.request_headers.items()), "",
                 _cut(self.request_body), "", f"HTTP {self.status if self.status is not None else '(no response)'}",
                 *(f"{k}: {v}" for k, v in self.response_headers.items()), "", self._response_body()]
        return redact("\n".join(lines))

    def tee(self, chunk: bytes) -> None:
        """A piece of the streamed body as the check reads it: the first :data:`MAX_BODY` bytes kept, all counted."""
        if self.streamed is not None:
            self.streamed.extend(chunk[: max(0, MAX_BODY - len(self.streamed))])
        self.streamed_bytes += len(chunk)

    def _response_body(self) -> str:
        if self.streamed is not None:
            total = self.streamed_bytes
            cut = f"\n... [stream cut: {total:,} bytes in all]" if total > len(self.streamed) else ""
            return (self.streamed.decode("utf-8", errors="replace") + cut) or "(stream not read)"
        if self.response is None:
            return ""
        try:
            return _cut(self.response.content.decode("utf-8", errors="replace"))
        except Exception:  # noqa: BLE001 - ResponseNotRead of httpx or of the openai SDK's own httpx2 copy
            return "(streamed body: see the stream transcript attachment when the check made one)"


def _tee_classes(response: Any) -> tuple[type, type]:
    """Sync and async stream wrappers derived from the byte-stream bases of the response's own httpx package.

    httpx only iterates streams that are instances of its ``SyncByteStream``/``AsyncByteStream``; the openai SDK
    ships a fork (``httpx2``) with its own bases, so the wrappers are made per package.
    """
    package = sys.modules[type(response).__module__.split(".")[0]]
    cached = _TEE_CACHE.get(package.__name__)
    if cached:
        return cached

    class SyncTee(package.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, exchange: Exchange) -> None:
            self.inner, self.exchange = inner, exchange

        def __iter__(self) -> Any:
            for chunk in self.inner:
                self.exchange.tee(chunk)
                yield chunk

        def close(self) -> None:
            self.inner.close()

    class AsyncTee(package.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, exchange: Exchange) -> None:
            self.inner, self.exchange = inner, exchange

        async def __aiter__(self) -> Any:
            async for chunk in self.inner:
                self.exchange.tee(chunk)
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    _TEE_CACHE[package.__name__] = (SyncTee, AsyncTee)
    return SyncTee, AsyncTee


_TEE_CACHE: dict[str, tuple[type, type]] = {}


def _cut(text: str) -> str:
    return text if len(text) <= MAX_BODY else text[:MAX_BODY] + f"\n... ({len(text) - MAX_BODY} more characters)"


def _body(request: Any) -> str:
    try:
        return request.content.decode("utf-8", errors="replace")
    except Exception:  # noqa: BLE001 - RequestNotRead of httpx or httpx2
        return "(streamed request body)"


class ExchangeRecorder:
    """Records the HTTP exchanges of the current check on any number of httpx clients."""

    def __init__(self, limit: int = 20) -> None:
        self.limit = limit
        self.exchanges: list[Exchange] = []
        self.active = False

    def install(self, client: Any) -> None:
        """Hook an httpx client (sync or async), or the one inside an ``openai`` client (idempotent).

        Duck-typed: openai 3.5x ships its own httpx fork (``httpx2``) whose clients are not ``httpx.Client``s.
        """
        http = client if hasattr(client, "event_hooks") else getattr(client, "_client", None)
        if not hasattr(http, "event_hooks") or getattr(http, "_ml4_recorder", None) is self:
            return
        http._ml4_recorder = self
        if inspect.iscoroutinefunction(http.send):
            async def on_request_async(req: Any) -> None:
                self._on_request(req)

            async def on_response_async(resp: Any) -> None:
                self._on_response(resp)

            http.event_hooks["request"].append(on_request_async)
            http.event_hooks["response"].append(on_response_async)
        else:
            http.event_hooks["request"].append(self._on_request)
            http.event_hooks["response"].append(self._on_response)

    def start(self) -> None:
        self.exchanges.clear()
        self.active = True

    def stop(self) -> None:
        self.active = False

    def _on_request(self, req: Any) -> None:
        if self.active and len(self.exchanges) < self.limit:
            self.exchanges.append(Exchange(req.method, str(req.url), dict(req.headers), _body(req)))

    def _on_response(self, resp: Any) -> None:
        if not self.active:
            return
        for ex in reversed(self.exchanges):
            if ex.status is None and ex.url == str(resp.request.url) and ex.method == resp.request.method:
                ex.status, ex.response_headers, ex.response = resp.status_code, dict(resp.headers), resp
                if resp.headers.get("content-type", "").startswith("text/event-stream"):
                    ex.streamed = bytearray()
                    sync_tee, async_tee = _tee_classes(resp)
                    tee = async_tee if hasattr(resp.stream, "__aiter__") else sync_tee
                    resp.stream = tee(resp.stream, ex)
                return

    def attach(self) -> int:
        """Attach every recorded exchange (redacted) to the running Allure test; returns how many."""
        for i, ex in enumerate(self.exchanges, 1):
            allure.attach(ex.render(), name=f"HTTP {i}: {ex.method} {httpx.URL(ex.url).path} -> {ex.status}",
                          attachment_type=allure.attachment_type.TEXT)
        return len(self.exchanges)
