"""A scripted HTTP server on a free loopback port for the client/probe tests.

It answers each path with a prepared status, content type and body chunks (optionally paced, or cut short
with a Content-Length that promises more), and records the requests it got, so the probe and the client
factories are tested over real sockets without a simulator.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Scripted:
    status: int = 200
    content_type: str = "text/event-stream"
    chunks: list[bytes] = field(default_factory=list)
    delay_s: float = 0.0
    #: Announce more bytes than are sent, then close: the client sees a truncated body (transport error).
    truncate: bool = False


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class StubServer:
    """``with StubServer({"/v1/chat/completions": Scripted(...)}) as s: s.base_url``"""

    def __init__(self, routes: dict[str, Scripted]) -> None:
        self.routes = routes
        self.seen: list[Seen] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                stub.seen.append(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                script = stub.routes.get(self.path.split("?", 1)[0], Scripted(404, "text/plain", [b"not found"]))
                self.send_response(script.status)
                self.send_header("Content-Type", script.content_type)
                total = sum(len(c) for c in script.chunks)
                if script.truncate:
                    self.send_header("Content-Length", str(total + 1000))
                self.end_headers()
                for chunk in script.chunks:
                    if script.delay_s:
                        time.sleep(script.delay_s)
                    self.wfile.write(chunk)
                    self.wfile.flush()

            do_GET = _serve
            do_POST = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def sse(*payloads: str) -> list[bytes]:
    """Frame each payload as one SSE event (``data: ...`` + blank line)."""
    return [f"data: {p}\n\n".encode() for p in payloads]
