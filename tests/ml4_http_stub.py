"""A scripted HTTP server on a free loopback port for the client/probe tests.

It answers each path with a prepared status, content type and body chunks (optionally paced, or cut short
with a Content-Length that promises more), and records the requests it got, so the probe and the client
factories are tested over real sockets without a simulator. Hostile answers (stalled, trickling, redirecting,
huge, ...) are data in ``fixtures/bad_input/hostile.yaml``; :func:`hostile` turns one into a :class:`Scripted`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

HOSTILE_FILE = Path(__file__).resolve().parent.parent / "fixtures" / "bad_input" / "hostile.yaml"


@dataclass
class Scripted:
    status: int = 200
    content_type: str = "text/event-stream"
    chunks: list[bytes] = field(default_factory=list)
    delay_s: float = 0.0
    #: Announce more bytes than are sent, then close: the client sees a truncated body (transport error).
    truncate: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    #: Seconds before anything is sent (not even headers): a stalled endpoint.
    stall_s: float = 0.0
    #: The chunks are sent this many times (a trickle that never ends, a 50 MB answer from one 1 MB chunk).
    repeat: int = 1
    #: Seconds the connection stays open, silent, after the last chunk: a stream that stalls mid-way.
    hold_s: float = 0.0


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
        #: Set on exit: stalled and trickling answers stop at once instead of outliving the test.
        self.stopping = threading.Event()
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
                if script.stall_s and stub.stopping.wait(script.stall_s):
                    return
                self.send_response(script.status)
                self.send_header("Content-Type", script.content_type)
                for name, value in script.headers.items():
                    self.send_header(name, value)
                total = sum(len(c) for c in script.chunks) * script.repeat
                if script.truncate:
                    self.send_header("Content-Length", str(total + 1000))
                self.end_headers()
                try:
                    self._body(script)
                except OSError:  # the client gave up (a deadline passed): that is what the test wanted
                    return

            def _body(self, script: Scripted) -> None:
                for _ in range(script.repeat):
                    for chunk in script.chunks:
                        if script.delay_s and stub.stopping.wait(script.delay_s):
                            return
                        self.wfile.write(chunk)
                        self.wfile.flush()
                stub.stopping.wait(script.hold_s)

            do_GET = _serve
            do_POST = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll: shutdown() waits for it, and each test starts and stops its own servers.
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

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
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()


def sse(*payloads: str) -> list[bytes]:
    """Frame each payload as one SSE event (``data: ...`` + blank line)."""
    return [f"data: {p}\n\n".encode() for p in payloads]


def hostile_answers() -> dict[str, dict[str, Any]]:
    """``fixtures/bad_input/hostile.yaml``: name -> the answer and what each client must make of it."""
    return yaml.safe_load(HOSTILE_FILE.read_text())["answers"]


def hostile(name: str, subs: dict[str, str] | None = None) -> Scripted:
    """One hostile answer as a :class:`Scripted` (``$OTHER`` and the like replaced from ``subs``)."""
    spec = hostile_answers()[name]
    encoding = spec.get("encoding", "utf-8")  # latin-1 writes "\xff" as the byte 0xff: invalid UTF-8 on purpose
    headers = {k: _expand(v, subs or {}) for k, v in (spec.get("headers") or {}).items()}
    return Scripted(status=spec.get("status", 200), content_type=spec.get("content_type", "application/json"),
                    chunks=[(c * spec.get("scale", 1)).encode(encoding) for c in spec.get("chunks", [])], delay_s=spec.get("delay_s", 0.0),
                    headers=headers, stall_s=spec.get("stall_s", 0.0), repeat=spec.get("repeat", 1),
                    hold_s=spec.get("hold_s", 0.0))


def _expand(value: str, subs: dict[str, str]) -> str:
    for key, sub in subs.items():
        value = value.replace(key, sub)
    return value
