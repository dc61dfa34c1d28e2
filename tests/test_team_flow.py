"""A platform team's first afternoon, end to end, with the suite pip-installed into a venv of its own.

The team's install is the suite alone (``pip install`` of the core: no embedded deployment in it). Its deployment
is the embedded simulator started with this checkout's ``ml4-sim`` (the ``harness/`` distribution: a live
endpoint to the suite, no ``--sim``), at a fast pace so three gate runs fit CI. In the team's folder, with the install's
console scripts only: ``ml4-target new mine --hardware h200 --gpus 8`` describes it; ``--collect-only`` collects
the package's suites; the first gate run is not signed (exit 6: the reasoning share has no baseline of this
deployment); ``--ml4-record-baselines`` records it into the team's ``baselines/`` and exits 0; the next plain run
exits 0 with the share judged against that file.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from installs import Installed, clean_env

from pytest_ml4.checks.verdict import EXIT_NOT_JUDGED
from pytest_ml4.runtime import processes
from pytest_ml4.target.model import load_target

KEY_VAR = "ML4_TEAM_KEY"
GATE = "smoke or tools or reasoning"
SHARE = "test_reasoning_share_of_output_is_measured"
#: The simulator's pace for this test only: the checks judge answers, not the bundled target's timing.
FAST = ("--set", "sim.ttft_s=0.005", "--set", "sim.itl_ms=0.2", "--set", "sim.extra.prefill_tok_s=1000000")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return Installed(tmp_path_factory.mktemp("team-install"), "pip")


@pytest.fixture(scope="module")
def deployment(install: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The team's deployment: this checkout's ``ml4-sim`` (the install has none) on a free port; (its /v1 URL, its
    key)."""
    where = tmp_path_factory.mktemp("deployment")
    key = "sk-team-" + secrets.token_urlsafe(12)
    port = _free_port()
    argv = [str(Path(sys.executable).parent / "ml4-sim"), "--target", "rtxpro6000-tp8", "--port", str(port),
            "--log-file", str(where / "engine.log"), *FAST]
    # The bundled target names the key's variable; the team's own variable holds the same key.
    env = {**clean_env(), "LLM_API_KEY": key}
    proc = processes.popen(argv, env=env, cwd=where, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (where / "engine.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "ml4-sim did not answer /health within 180 s"
            time.sleep(0.5)
        yield f"{url}/v1", key
    finally:
        processes.stop(proc)


def _share_outcomes(team: Path) -> set[str]:
    newest = max(team.glob("reports/*/summary.json"), key=lambda p: json.loads(p.read_text())["started"])
    return {c["outcome"] for c in json.loads(newest.read_text())["checks"] if SHARE in c["nodeid"]}


def test_a_team_describes_its_deployment_runs_the_gate_records_and_signs(install: Installed,
                                                                         deployment: tuple[str, str],
                                                                         tmp_path: Path) -> None:
    url, key = deployment
    team = tmp_path / "team"
    team.mkdir()
    env = {KEY_VAR: key}

    new = install.command("ml4-target", "new", "mine", "--endpoint", url, "--api-key-env", KEY_VAR,
                          "--hardware", "h200", "--gpus", "8", cwd=team, env=env, timeout=120)
    assert new.returncode == 0, new.stdout[-2000:] + new.stderr[-2000:]
    target = load_target(team / "targets" / "mine.yaml")
    assert (target.hardware.family, target.hardware.count) == ("h200", 8)
    assert key not in (team / "targets" / "mine.yaml").read_text() + new.stdout + new.stderr

    collected = install.pytest("--target", "mine", "--collect-only", "-q", cwd=team, env=env)
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    for suite in ("test_smoke.py", "test_tools.py", "test_reasoning.py"):
        assert f"{suite}::" in collected.stdout, collected.stdout[-2000:]

    gate = ("--target", "mine", "-m", GATE, "-n", "2", "--ml4-no-allure")
    first = install.pytest(*gate, cwd=team, env=env, timeout=900)
    assert first.returncode == EXIT_NOT_JUDGED, first.stdout[-4000:] + first.stderr[-2000:]
    assert "--ml4-record-baselines" in first.stdout, first.stdout[-4000:]
    assert _share_outcomes(team) == {"not_judged"}

    record = install.pytest(*gate, "--ml4-record-baselines", cwd=team, env=env, timeout=900)
    assert record.returncode == 0, record.stdout[-4000:] + record.stderr[-2000:]
    assert (team / "baselines" / "reasoning-share-mine.json").is_file()
    assert not list(install.package.glob("data/baselines/*mine*")), "never written into the installed package"

    signed = install.pytest(*gate, cwd=team, env=env, timeout=900)
    assert signed.returncode == 0, signed.stdout[-4000:] + signed.stderr[-2000:]
    assert _share_outcomes(team) == {"passed"}
    assert "reasoning  PASS" in signed.stdout, signed.stdout[-3000:]
