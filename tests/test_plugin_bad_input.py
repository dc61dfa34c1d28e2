"""Bad input fails fast with one clear line naming the URL, file, field or variable.

The cases the README promises are data (``fixtures/bad_input/cases.yaml``), each run as a user would run it, in
the project folder; the HTML endpoint and Ctrl-C during the perf sweep need a scripted server or a signal and
are tests of their own. Lines are asserted, never times (the box is shared).
"""

from __future__ import annotations

import fnmatch
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_sim_support import kill_processes_mentioning, processes_mentioning

from pytest_ml4.runtime.installed import tools_dir

REPO = Path(__file__).resolve().parent.parent
CASES = yaml.safe_load((REPO / "fixtures" / "bad_input" / "cases.yaml").read_text())["cases"]
SMOKE = "suites/test_smoke.py"
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]


def _tools_without(names: list[str], where: Path) -> Path:
    """An $ML4_TOOLS that links every installed tool except ``names`` (so only that one is missing)."""
    where.mkdir()
    for entry in tools_dir().iterdir():
        if not any(entry.name.startswith(f"{n}-") or entry.name == n for n in names):
            (where / entry.name).symlink_to(entry)
    return where


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def keyed_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A simulated rtxpro6000-tp8 engine holding a key of its own: the session's key is the wrong one."""
    from pytest_ml4_sim.deploy.simulator import SimServer

    sim = SimServer("rtxpro6000-tp8", env={"LLM_API_KEY": "sk-the-right-key-0123456789"},
                    log_file=tmp_path_factory.mktemp("keyed-sim") / "engine.log")
    sim.start(timeout=60)
    yield sim.base_url
    sim.stop()


def _expand(value: str, subs: dict[str, str]) -> str:
    for key, sub in subs.items():
        value = value.replace(key, sub)
    return value


def _message(line: str) -> str:
    """A line without pytest's framing: ``pytest.exit`` in sessionstart prints ``Exit: MSG`` on stderr and
    ``! _pytest.outcomes.Exit: MSG !`` in the summary, one message twice."""
    text = line.strip().strip("!").strip()
    for prefix in ("_pytest.outcomes.Exit: ", "Exit: "):
        text = text.removeprefix(prefix)
    return text


def _command(case: dict[str, Any], tmp: Path, subs: dict[str, str]) -> list[str]:
    if "command" not in case:
        return [*PYTEST, f"--ml4-reports={tmp / 'reports'}", *(_expand(a, subs) for a in case["args"])]
    argv = [_expand(str(a), subs) for a in case["command"]]
    if argv[0] == "python":
        argv[0] = sys.executable
    elif argv[0] == "ml4-report":
        argv[:1] = [sys.executable, "-m", "pytest_ml4.report.cli"]
    return argv


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_ends_in_one_line(case: dict[str, Any], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    subs = {"$TMP": str(tmp_path)}
    env = dict(os.environ, PYTEST_ADDOPTS="")
    if "tools_without" in case:
        subs["$TOOLS"] = str(_tools_without(case["tools_without"], tmp_path / "tools"))
        env["ML4_TOOLS"] = subs["$TOOLS"]
    if any("$BUSY_PORT" in str(a) for a in case.get("command", [])):
        subs["$BUSY_PORT"] = str(request.getfixturevalue("busy_port"))
    if any("$SIM_URL" in str(a) for a in case.get("args", [])):
        subs["$SIM_URL"] = request.getfixturevalue("keyed_sim")
    for name, value in (case.get("env") or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = _expand(str(value), subs)
    for folder in case.get("mkdir", []):
        (tmp_path / folder).mkdir(parents=True)
    proc = subprocess.run(_command(case, tmp_path, subs), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180, check=False)
    out = proc.stdout + proc.stderr
    pattern = _expand(case["line"], subs)
    hits = [ln for ln in out.splitlines() if fnmatch.fnmatchcase(ln, pattern)]
    assert hits, f"{case['promise']}: no line matches {pattern!r}:\n{out[-3000:]}"
    if case.get("count", 1) != "any":
        messages = {_message(ln) for ln in hits}
        assert len(messages) == case.get("count", 1), f"one line, not {len(messages)}:\n" + "\n".join(hits)
    if "lines" in case:
        assert len(hits) == case["lines"], f"{case['lines']} line(s), not {len(hits)}:\n" + "\n".join(hits)
    assert proc.returncode == case["rc"], f"exit {proc.returncode}, expected {case['rc']}:\n{out[-3000:]}"
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]


def test_every_case_names_the_promise_it_checks() -> None:
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))
    assert all(c.get("promise") and c.get("line") and "rc" in c for c in CASES)


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
    # Each failure is one line naming the URL and quoting what came back, so a proxy's HTML page is visible.
    lines = [ln for ln in result.outlines if ln.startswith("E ") and "<h1>502 Bad Gateway</h1>" in ln]
    assert len(lines) >= 2 and all(f"{html_server}/" in ln and "502" in ln for ln in lines), \
        "\n".join(result.outlines[-40:])


def _sigint_as_in_a_terminal() -> None:
    """A shell starts background jobs with SIGINT ignored, and the ignore is inherited: a CI launched that way
    (``nohup ... &``) gave pytest no KeyboardInterrupt at all. A user at a terminal has the default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_the_perf_sweep_keeps_a_valid_partial_report(tmp_path: Path) -> None:
    """SIGINT once the first point has finished: pytest stops (exit 2), the run folder keeps summary.json and
    perf-summary.json with that point, marked interrupted, and every aiperf export so far; nothing is left running."""
    run = tmp_path / "run"
    proc = subprocess.Popen([*PYTEST, "--target", "rtxpro6000-tp8", "--sim", "--ml4-no-proxy", "-m", "perf",
                             "--perf-short", "--perf-concurrencies=1,2", "--perf-duration=2", f"--ml4-run-dir={run}",
                             "suites/test_perf.py"], cwd=REPO, env=dict(os.environ, PYTEST_ADDOPTS=""),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_sigint_as_in_a_terminal)  # noqa: PLW1509 (one signal call, no lock)
    try:
        # The second point's folder appears once the first point is done (a state, not a time, is awaited).
        deadline = time.monotonic() + 240
        while not list(run.glob("perf/sweep-*/c2")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, f"the sweep ended before it could be interrupted:\n{proc.stdout.read()[-3000:]}"
        assert list(run.glob("perf/sweep-*/c2")), "the first point never finished"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert "perf sweep interrupted at c2 after 1 finished point(s)" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["exit_status"] == 2
    assert set(summary["perf"]) == {"1"} and summary["perf"]["1"]["tok_s_user"] > 0
    sweep = json.loads((run / "perf-summary.json").read_text())["sweep"]
    assert sweep["interrupted_at_concurrency"] == 2 and sweep["passed"] is False
    (point,) = sweep["points"]
    assert point["concurrency"] == 1 and point["ok"] is True
    export = run / point["artifact_dir"] / "profile_export_aiperf.json"
    assert json.loads(export.read_text()), "the finished point's aiperf export is kept, valid JSON"
    assert (run / "allure-results" / "environment.properties").is_file()
    deadline = time.monotonic() + 5  # the children are reaped just after pytest exits
    while processes_mentioning(str(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = kill_processes_mentioning(str(run))  # ended here either way: nothing may outlive this test
    assert not left, "processes of the interrupted run are still running:\n" + "\n".join(left)
