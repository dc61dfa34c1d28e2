"""``--ml4-record-baselines``: a team's first run on its own deployment is not judged (exit 6) and names the
command and the team's path; recording writes the team's ``baselines/`` (never the package) with provenance and
exits 0; the next plain run judges against it. The simulator stands in for the team's deployment as a live
endpoint (its own baseline files are then no baseline for it, as on a real cluster)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.checks.verdict import EXIT_NOT_JUDGED
from pytest_ml4.locations import BUNDLED_TARGETS_DIR, DATA_DIR
from pytest_ml4.target.model import load_target

REPO = Path(__file__).resolve().parent.parent
FAST = {"sim": {"ttft_s": 0.005, "itl_ms": 0.2}}
SHARE = "test_reasoning_share_of_output_is_measured"


def _team(tmp_path: Path) -> Path:
    """A team's repository holding one target: the bundled rtxpro6000-tp8, named ``mine``."""
    team = tmp_path / "team"
    (team / "targets").mkdir(parents=True)
    text = (BUNDLED_TARGETS_DIR / "rtxpro6000-tp8.yaml").read_text()
    (team / "targets" / "mine.yaml").write_text(text.replace("name: rtxpro6000-tp8", "name: mine", 1))
    return team


def _pytest(team: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    cmd = [sys.executable, "-m", "pytest", str(REPO / "suites" / "test_reasoning.py"), "--target", "mine",
           f"--target-dir={team / 'targets'}", f"--endpoint={url}", "--ml4-no-proxy", "-k", "share_of_output",
           f"--ml4-reports={team / 'reports'}", "--ml4-no-allure", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-q", "-s", *args]
    return subprocess.run(cmd, cwd=team, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300, check=False)


def _share_outcomes(team: Path) -> dict[str, str]:
    (newest,) = sorted(team.glob("reports/*/summary.json"), key=lambda p: json.loads(p.read_text())["started"])[-1:]
    checks = json.loads(newest.read_text())["checks"]
    return {c["nodeid"].split("::")[-1]: c["outcome"] for c in checks if SHARE in c["nodeid"]}


def test_first_run_records_into_the_teams_folder_and_the_next_run_judges(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    team = _team(tmp_path)
    target = load_target(team / "targets" / "mine.yaml")
    monkeypatch.setenv(target.endpoint.api_key_env, "sk-record-" + secrets.token_urlsafe(12))
    recorded = team / "baselines" / "reasoning-share-mine.json"
    with SimServer(target, overrides=FAST, log_file=tmp_path / "sim.log") as sim:
        first = _pytest(team, sim.base_url)
        out = first.stdout + first.stderr
        assert first.returncode == EXIT_NOT_JUDGED, out[-3000:]
        assert f"--ml4-record-baselines (writes {recorded})" in out, out[-3000:]
        assert set(_share_outcomes(team).values()) == {"not_judged"}

        record = _pytest(team, sim.base_url, "--ml4-record-baselines")
        assert record.returncode == 0, (record.stdout + record.stderr)[-3000:]
        assert set(_share_outcomes(team).values()) == {"passed"}, "recording passes as recorded"
        doc = json.loads(recorded.read_text())
        prov = doc["provenance"]
        assert (doc["kind"], doc["target"], prov["kind"], prov["deployment"]) == (
            "reasoning-share", "mine", "deployment", "mine")
        assert prov["endpoint"] == sim.base_url.split("//")[1].split("/")[0] and prov["model"]
        assert "--ml4-record-baselines" in prov["command"] and prov["date"] and "vLLM" in prov["image"]
        assert not (DATA_DIR / "baselines" / "reasoning-share-mine.json").exists(), "never into the package"

        plain = _pytest(team, sim.base_url)
        assert plain.returncode == 0, (plain.stdout + plain.stderr)[-3000:]
    assert _share_outcomes(team) == {f"{SHARE}[nonstream]": "passed", f"{SHARE}[stream]": "passed"}
    assert "reasoning  PASS" in plain.stdout, plain.stdout[-2000:]


def test_recording_for_a_bundled_target_is_refused_before_anything_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites/test_reasoning.py", "--target", "rtxpro6000-tp8",
                           "--ml4-record-baselines", "--collect-only", "-q", "-p", "no:cacheprovider",
                           f"--ml4-reports={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert ("--ml4-record-baselines: target rtxpro6000-tp8 is the package's own" in proc.stderr
            and "copy it into your repository's targets/ (targets/rtxpro6000-tp8.yaml)" in proc.stderr), proc.stderr
