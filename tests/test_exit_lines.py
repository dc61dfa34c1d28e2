"""The session's own lines leak no secret and tell what happened: a refused key echoed
back by the endpoint is masked in the exit line, whatever its shape; a key in ``engine.extra_args`` stays out of
the run folder and the simulator's command line; a slow ``/models`` is not called unreachable."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.client import endpoint as client
from pytest_ml4.client.endpoint import Endpoint, check_reachable
from pytest_ml4.target.model import load_target

REPO = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]
#: Not shaped like any key the redactor knows (no sk-, no Bearer in the echo): only registration finds it.
PLAIN_KEY = "plainkey0123456789abcdefXYZ"


class _Handler(http.server.BaseHTTPRequestHandler):
    delay_s = 0.0

    def do_GET(self) -> None:
        time.sleep(self.delay_s)
        if self.path.endswith("/models") and self.headers.get("Authorization", "").endswith(PLAIN_KEY):
            body = (b'{"object": "list", "data": [{"id": "mistral-large-4", "object": "model"}]}')
            self.send_response(200)
        else:  # refuse, echoing what was sent (some gateways do)
            body = f'{{"error": "invalid key {self.headers.get("Authorization", "")[7:]}"}}'.encode()
            self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the stalled-answer test hangs up before the answer: a broken pipe here is expected


@pytest.fixture
def echo_server(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("H", (_Handler,), {"delay_s": getattr(request, "param", 0.0)})
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_a_refused_key_echoed_back_is_masked_in_the_exit_line(echo_server: str, tmp_path: Path) -> None:
    wrong = "wrongkey0123456789abcdefXYZ"
    env = dict(os.environ, PYTEST_ADDOPTS="", MY_GATEWAY_KEY=wrong)
    proc = subprocess.run([*PYTEST, f"--ml4-reports={tmp_path}", "--target", "rtxpro6000-tp8", "--endpoint",
                           echo_server, "--api-key-env", "MY_GATEWAY_KEY", "suites/test_smoke.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
    out = proc.stdout + proc.stderr
    line = f"ml4: endpoint {echo_server}/models refused the API key from MY_GATEWAY_KEY: HTTP 401: "
    assert line in out, out[-3000:]
    assert "invalid key ***" in out, "the echo is quoted, the key in it masked"
    assert wrong not in out and wrong[:12] not in out, "the refused key is printed in clear"
    assert proc.returncode == 3


@pytest.mark.parametrize("echo_server", [1.5], indirect=True)
def test_a_slow_models_answer_is_not_unreachable(echo_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ep = Endpoint(base_url=echo_server, api_key=PLAIN_KEY)
    # The connection is held to `timeout`; the answer may take longer (1.5 s here, 10 s on a loaded deployment).
    assert check_reachable(ep, timeout=1.0) is None


@pytest.mark.parametrize("echo_server", [5.0], indirect=True)
def test_a_stalled_models_answer_is_told_apart_from_unreachable(echo_server: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "PROBE_ANSWER_TIMEOUT_S", 1.0)
    problem = check_reachable(Endpoint(base_url=echo_server, api_key=PLAIN_KEY), timeout=0.5)
    assert problem == (f"endpoint {echo_server}/models accepted the connection but sent no answer within 1 s "
                       f"(reachable, but stalled or overloaded)")


def test_control_a_closed_port_is_unreachable() -> None:
    problem = check_reachable(Endpoint(base_url="http://127.0.0.1:9/v1", api_key=PLAIN_KEY), timeout=1.0)
    assert problem is not None and problem.startswith("endpoint http://127.0.0.1:9/v1/models is unreachable: ")


def test_a_key_in_engine_extra_args_is_masked_in_the_run_folder_and_the_command_line(tmp_path: Path) -> None:
    key = "extrakey0123456789abcdefXYZ"
    extra = ["--enable-prompt-tokens-details", "--api-key", key, f"--hf-token={key}"]
    target = load_target("rtxpro6000-tp8", overrides={"engine": {"extra_args": extra}})
    sim = SimServer(target, overrides={"engine": {"extra_args": extra}}, log_file=tmp_path / "engine.log")
    written = Path(sim.target_ref).read_text()
    assert key not in written and key not in " ".join(sim.argv())
    args = yaml.safe_load(written)["engine"]["extra_args"]
    assert args == ["--enable-prompt-tokens-details", "--api-key", "***", "--hf-token=***"], \
        "the flags stay (the simulator reads them), their values are masked"


WARNS_WITH_KEY = '''
import os
import warnings


def test_warns_with_the_key():
    warnings.warn(f"retrying with Authorization: Bearer {os.environ['LLM_API_KEY']}", UserWarning)
'''


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_key_in_a_warning_is_masked_in_the_warnings_summary(pytester: pytest.Pytester, echo_server: str,
                                                             monkeypatch: pytest.MonkeyPatch, xdist: list[str]) -> None:
    """Under xdist a worker's warnings reach the controller's summary: the key is masked in both."""
    monkeypatch.setenv("LLM_API_KEY", PLAIN_KEY)
    pytester.makepyfile(test_w=WARNS_WITH_KEY)
    result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--endpoint", echo_server,
                                           "--ml4-reports", "reports", "-p", "no:cacheprovider", *xdist)
    out = result.stdout.str() + result.stderr.str()
    assert "retrying with Authorization: Bearer" in out, out[-2000:]   # the warning itself is shown
    assert PLAIN_KEY not in out, "the key reached the warnings summary"
