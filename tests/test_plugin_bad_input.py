"""Bad input fails fast and clearly: unreachable endpoint, missing API key, an endpoint answering HTML."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

SMOKE = "suites/test_smoke.py"


def test_unreachable_endpoint_stops_the_session_in_seconds(pytester: pytest.Pytester, smoke_copy, monkeypatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", "sk-not-used")
    start = time.monotonic()
    result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--endpoint", "http://127.0.0.1:9/v1",
                                           "-n", "2", SMOKE)
    elapsed = time.monotonic() - start
    assert elapsed < 30, f"took {elapsed:.1f}s"  # generous: process start-up on a loaded 2-core box
    assert result.ret == 3
    out = result.stdout.str() + result.stderr.str()
    assert "ml4: endpoint http://127.0.0.1:9/v1/models is unreachable: ConnectError" in out
    assert "INTERNALERROR" not in out
    assert out.count("unreachable") <= 2, "one line, not one per test"


def test_missing_api_key_is_one_clear_line(pytester: pytest.Pytester, smoke_copy, monkeypatch) -> None:
    monkeypatch.delenv("LLM_API_KEY", raising=False)
    result = pytester.runpytest("--target", "rtxpro6000-tp8", "--endpoint", "http://127.0.0.1:9/v1", SMOKE)
    assert result.ret == 4
    result.stdout.fnmatch_lines(["*ml4: target rtxpro6000-tp8 needs an API key: environment variable LLM_API_KEY "
                                 "is not set*"])


class _HtmlHandler(http.server.BaseHTTPRequestHandler):
    def _html(self) -> None:
        body = b"<html><body><h1>502 Bad Gateway</h1>nginx</body></html>"
        self.send_response(502)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _html

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def html_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HtmlHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_html_answer_fails_tests_quoting_it(pytester: pytest.Pytester, smoke_copy, html_server: str,
                                            monkeypatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", "sk-not-used")
    result = pytester.runpytest("--target", "rtxpro6000-tp8", "--endpoint", html_server, SMOKE,
                                "-k", "models_lists or unknown_model")
    result.assert_outcomes(failed=2)
    # Each failure quotes what came back, so a proxy's HTML error page is visible in the report.
    assert result.stdout.str().count("<h1>502 Bad Gateway</h1>") >= 2
