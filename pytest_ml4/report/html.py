"""Generate the Allure 2 HTML report offline, and render it in headless Chromium.

``generate_report(results, out)`` runs the npm ``allure-commandline`` (Allure 2, Java) as
``allure generate RESULTS -o OUT --clean --single-file --name NAME`` with ``ALLURE_NO_ANALYTICS=true`` (only
``true`` disables the Google Analytics tag in 2.46.1, tooling.md §1.3) and then removes any remaining gtag
script, so the report opens offline and phones nowhere. Before generating it seeds the results with the
previous report's history (:mod:`pytest_ml4.report.history`) so the trend spans runs.

``render_report(index_html, screenshot)`` drives Debian's ``chromium`` headless over the DevTools protocol
(flags from tooling.md §4): loads the report from ``file://``, expands every tree node, and returns the text
of the Overview and the names of the tests, plus a PNG screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websocket  # websocket-client, installed with the kubernetes client

from pytest_ml4.report.history import seed_history
from pytest_ml4.runtime import processes
from pytest_ml4.runtime.installed import (
    allure_executable,
    chromium_executable,
    java_executable,
)

_GTAG_RE = re.compile(r"<script[^>]*googletagmanager\.com[^>]*>\s*</script>\s*<script>[^<]*gtag\([^<]*</script>",
                      re.DOTALL)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1600,1000"]


class ReportError(RuntimeError):
    """Generating or rendering the report failed; the message carries the tool's output tail."""


def generate_report(results_dir: Path, out_dir: Path, *, name: str = "pytest-ml4 release sign-off",
                    previous_report: Path | None = None, timeout: float = 300) -> Path:
    """Write a single-file Allure 2 report for ``results_dir`` to ``out_dir/index.html`` and return its path."""
    if not results_dir.is_dir():
        raise ReportError(f"no Allure results at {results_dir}")
    out, res = out_dir.resolve(), results_dir.resolve()
    if out == res or out in res.parents:
        # allure generate --clean deletes the output folder first: never point it at the results or the run.
        raise ReportError(f"report folder {out_dir} would contain the results {results_dir}; choose another -o")
    seed_history(results_dir, previous_report)
    java = java_executable()
    env = dict(os.environ, ALLURE_NO_ANALYTICS="true")
    env.setdefault("JAVA_HOME", str(Path(os.path.realpath(java)).parent.parent))
    cmd = [str(allure_executable()), "generate", str(results_dir), "-o", str(out_dir), "--clean",
           "--single-file", "--name", name]
    proc = processes.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env)
    index = out_dir / "index.html"
    if proc.returncode != 0 or not index.is_file():
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise ReportError(f"allure generate exited {proc.returncode}: {tail}")
    html = index.read_text(encoding="utf-8")
    stripped = _GTAG_RE.sub("", html)
    if stripped != html:
        index.write_text(stripped, encoding="utf-8")
    return index


def embedded_files(index_html: Path, prefix: str = "data/") -> dict[str, Any]:
    """Decoded JSON files embedded in a single-file report (``d('data/x.json','BASE64')``), by name."""
    html = index_html.read_text(encoding="utf-8")
    out = {}
    for name, data in re.findall(r"d\('(" + re.escape(prefix) + r"[^']+\.json)','([A-Za-z0-9+/=]*)'\)", html):
        out[name] = json.loads(base64.b64decode(data))
    return out


# ------------------------------------------------------------------------------------------------ rendering
@dataclass
class RenderedReport:
    """What a browser showed: the Overview's text, the test names in the expanded tree, screenshots taken."""

    overview_text: str
    tree_names: list[str]
    tree_text: str
    screenshots: list[Path] = field(default_factory=list)


# Expands every collapsed tree node (clicking a title expands it and renders its children), repeatedly,
# because children appear only after their parent is expanded.
_EXPAND_JS = """
(async () => {
  for (let round = 0; round < 30; round++) {
    const closed = [...document.querySelectorAll('.node:not(.node__leaf):not(.node__expanded) > .node__title')];
    if (!closed.length) break;
    closed.forEach(t => t.click());
    await new Promise(r => setTimeout(r, 150));
  }
  return [...document.querySelectorAll('.node__name')].map(e => e.textContent.trim());
})()
"""


class _Cdp:
    """The few DevTools protocol calls needed: navigate, evaluate, screenshot."""

    def __init__(self, ws_url: str) -> None:
        self._ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self._id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self._ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise ReportError(f"chromium {method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expr: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in res:
            raise ReportError(f"chromium evaluate failed: {res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")

    def wait_for(self, expr: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.evaluate(expr):
                return
            time.sleep(0.2)
        raise ReportError(f"report page never satisfied {expr!r} within {timeout:.0f}s")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        self._ws.close()


def _start_chromium(profile: Path, timeout: float) -> tuple[subprocess.Popen[bytes], int]:
    exe = chromium_executable()
    # Port 0: Chromium picks a free loopback port and writes it to DevToolsActivePort in the profile.
    cmd = [str(exe), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
           "--remote-debugging-port=0", "about:blank"]
    proc = processes.popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_file.is_file() and port_file.read_text().strip():
            return proc, int(port_file.read_text().split()[0])
        if proc.poll() is not None:
            raise ReportError(f"chromium exited {proc.returncode} before opening its DevTools port")
        time.sleep(0.1)
    proc.kill()
    raise ReportError(f"chromium opened no DevTools port within {timeout:.0f}s")


def render_report(index_html: Path, shots_dir: Path | None = None, *, timeout: float = 60) -> RenderedReport:
    """Open the report in headless Chromium; return the Overview text and all test names of the Behaviors tree."""
    profile = Path(tempfile.mkdtemp(prefix="ml4-chromium-"))
    proc, port = _start_chromium(profile, timeout)
    cdp = None
    try:
        pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(p for p in pages if p.get("type") == "page")
        cdp = _Cdp(page["webSocketDebuggerUrl"])
        url = index_html.resolve().as_uri()
        cdp.call("Page.enable")
        cdp.call("Page.navigate", url=url)
        cdp.wait_for("document.querySelectorAll('.widget__title').length >= 4", timeout)
        time.sleep(1.0)  # charts animate in; give the screenshot a settled page
        overview = cdp.evaluate("document.body.innerText") or ""
        shots = [cdp.screenshot(shots_dir / "report-overview.png")] if shots_dir else []
        cdp.call("Page.navigate", url=url + "#behaviors")
        cdp.wait_for("document.querySelectorAll('.node__name').length > 0", timeout)
        names = cdp.evaluate(_EXPAND_JS) or []
        tree_text = cdp.evaluate("document.body.innerText") or ""
        if shots_dir:
            shots.append(cdp.screenshot(shots_dir / "report-behaviors.png"))
        return RenderedReport(overview, list(names), tree_text, shots)
    finally:
        if cdp is not None:
            cdp.close()
        processes.stop(proc, 10)  # the whole group: Chromium's renderer and GPU processes too
        shutil.rmtree(profile, ignore_errors=True)
