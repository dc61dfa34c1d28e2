"""A team's repository (the folder holding its targets/) overlays the package's data: its baselines/, its
dynamo/versions.yaml rows and its LiteLLM configs come first; a Dynamo release in no table is an assumed estimate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ml4.locations import BUNDLED_TARGETS_DIR, DATA_DIR
from pytest_ml4.report.environment import read_environment
from pytest_ml4.stacks.dynamo_versions import behaviour, row_for, target_row
from pytest_ml4.target.baselines import default_baseline
from pytest_ml4.target.model import load_target

PACKAGE_ROW = behaviour("1.6.1")
SEED_RELEASE = "1.7.0-mistral-large-4-dev.1"


def team_repo(tmp_path: Path, name: str = "gb300-agg", **serving: Any) -> Path:
    """A team repository: ``targets/<name>.yaml`` copied from the bundled target (``serving`` changed)."""
    data = yaml.safe_load((BUNDLED_TARGETS_DIR / f"{name}.yaml").read_text())
    data["serving"].update(serving)
    (tmp_path / "targets").mkdir(parents=True, exist_ok=True)
    (tmp_path / "targets" / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return tmp_path


def team_rows(repo: Path, rows: dict[str, dict[str, Any]]) -> None:
    (repo / "dynamo").mkdir(exist_ok=True)
    (repo / "dynamo" / "versions.yaml").write_text(yaml.safe_dump({"versions": rows}))


def row(**over: Any) -> dict[str, Any]:
    base = {"status": "verified", "public": True, "mistral_v11_tool_calls_parsed": True,
            "mistral_legacy_tool_calls_parsed": True, "mistral_parser_v2": True, "reasoning_split_needs_effort": False,
            "reasoning_efforts": ["low", "high"], "guided_json_refused_keywords": [],
            "source": "platform team transcripts 2026-11 (our cluster)"}
    return {**base, **over}


def test_a_team_row_overrides_the_packages_row_of_the_same_release(tmp_path: Path) -> None:
    repo = team_repo(tmp_path, dynamo_version="1.6.1")
    team_rows(repo, {"1.6.1": row()})
    target = load_target(str(repo / "targets" / "gb300-agg.yaml"))
    mine = target_row(target)
    assert mine is not None and mine.mistral_v11_tool_calls_parsed and mine.reasoning_efforts == ("low", "high")
    assert mine.source.startswith("platform team transcripts")
    assert PACKAGE_ROW is not None and not PACKAGE_ROW.mistral_v11_tool_calls_parsed, "the package's row is kept"
    assert target_row(load_target("gb300-agg", overrides={"serving": {"dynamo_version": "1.6.1"}})) == PACKAGE_ROW


def test_a_team_only_release_is_accepted_with_the_teams_row(tmp_path: Path) -> None:
    repo = team_repo(tmp_path, dynamo_version="1.8.0")
    team_rows(repo, {"1.8.0": row(status="estimate", source="release notes 1.8.0 (not yet observed)")})
    mine = target_row(load_target(str(repo / "targets" / "gb300-agg.yaml")))
    assert mine is not None and mine.version == "1.8.0" and mine.status == "estimate"
    assert mine.describe() == "1.8.0 (estimate: release notes 1.8.0 (not yet observed))"


@pytest.mark.parametrize("release, assumed, why", [
    ("1.9.2", SEED_RELEASE, "the nearest lower known release"),          # above every known release
    ("1.6.5", "1.6.1", "the nearest lower known release"),               # between two
    ("0.9.0", "1.6.1", "the lowest known release: none is lower"),       # below every known release
])
def test_an_unknown_release_is_an_estimate_naming_the_row_it_is_assumed_from(tmp_path: Path, release: str,
                                                                             assumed: str, why: str) -> None:
    target = load_target(str(team_repo(tmp_path, dynamo_version=release) / "targets" / "gb300-agg.yaml"))
    got = target_row(target)
    base = behaviour(assumed)
    assert got is not None and base is not None
    assert got.version == release and got.status == "estimate" and not got.verified
    assert f"taken to behave as {assumed} ({why}, {base.status})" in got.source
    assert "dynamo/versions.yaml of your repository" in got.source
    assert got.mistral_v11_tool_calls_parsed == base.mistral_v11_tool_calls_parsed
    assert got.reasoning_efforts == base.reasoning_efforts
    assert behaviour(release, root=target.root) is None, "the lookup itself still says unknown"


def test_a_team_row_is_preferred_as_the_base_of_an_assumed_estimate(tmp_path: Path) -> None:
    repo = team_repo(tmp_path, dynamo_version="1.8.3")
    team_rows(repo, {"1.8.0": row()})
    got = row_for("1.8.3", repo)
    assert "taken to behave as 1.8.0 (the nearest lower known release, verified)" in got.source
    assert got.mistral_parser_v2 is True


def test_the_report_names_the_assumed_estimate(pytester: pytest.Pytester) -> None:
    """summary.json ``versions.dynamo_behaviour`` and the Allure environment say which row an unknown release is
    assumed to behave as."""
    team_repo(pytester.path, dynamo_version="1.9.2")
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess("--target", "gb300-agg", "--ml4-reports", str(reports),
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    (run_dir,) = list(reports.iterdir())
    named = json.loads((run_dir / "summary.json").read_text())["versions"]["dynamo_behaviour"]
    assert named.startswith(f"1.9.2 (estimate: assumed: 1.9.2 is in no versions table, taken to behave as "
                            f"{SEED_RELEASE} ")
    env = read_environment(run_dir / "allure-results" / "environment.properties")
    assert env["Dynamo behaviour"] == named


def test_a_teams_baseline_comes_first_else_the_packages_else_the_teams_path(tmp_path: Path) -> None:
    repo = team_repo(tmp_path)
    target = load_target(str(repo / "targets" / "gb300-agg.yaml"))
    package = DATA_DIR / "baselines" / "accuracy-gb300-agg.json"
    assert default_baseline("accuracy", target.name, target.root) == package
    (repo / "baselines").mkdir()
    mine = repo / "baselines" / "accuracy-gb300-agg.json"
    shutil.copy(package, mine)
    assert default_baseline("accuracy", target.name, target.root) == mine
    # A team baselines/ folder without this target's file still falls back to the package's.
    assert default_baseline("reasoning-share", target.name, target.root) == (
        DATA_DIR / "baselines" / "reasoning-share-gb300-agg.json")
    assert default_baseline("accuracy", "mine", target.root) == repo / "baselines" / "accuracy-mine.json"


def test_a_teams_litellm_config_comes_first(tmp_path: Path) -> None:
    repo = team_repo(tmp_path, "rtxpro6000-tp8")
    target = load_target(str(repo / "targets" / "rtxpro6000-tp8.yaml"))
    assert target.serving.proxy is not None
    config = target.serving.proxy.config
    assert target.resolve(config) == DATA_DIR / config
    (repo / config).parent.mkdir(parents=True)
    (repo / config).write_text((DATA_DIR / config).read_text())
    assert target.resolve(config) == repo / config
