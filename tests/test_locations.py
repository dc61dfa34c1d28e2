"""Where things are (``pytest_ml4.locations``): the package's data, the targets directory a run looks names up
in, and where a team's target finds the files its YAML names. Cheap (no process, one in-process pytester run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_ml4.locations import (
    BUNDLED_TARGETS_DIR,
    DATA_DIR,
    baselines_dir,
    resolve_from,
    suites_dir,
    target_root,
    targets_dir,
)
from pytest_ml4.target.model import known_targets, load_target


def _team(tmp_path: Path, name: str = "team-rtx") -> Path:
    """A team repository holding one target: the RTX PRO seed's YAML under another name."""
    (tmp_path / "targets").mkdir()
    data = yaml.safe_load((BUNDLED_TARGETS_DIR / "rtxpro6000-tp8.yaml").read_text())
    data["name"] = name
    (tmp_path / "targets" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return tmp_path


def test_the_targets_directory_is_the_given_one_then_the_rootdirs_then_the_bundled(tmp_path: Path) -> None:
    assert targets_dir("mine", Path("/root-dir"), relative_to=tmp_path) == tmp_path / "mine"
    assert targets_dir(tmp_path / "abs", Path("/elsewhere"), relative_to=Path("/cwd")) == tmp_path / "abs"
    assert targets_dir(None, tmp_path) == BUNDLED_TARGETS_DIR  # no targets/ in the rootdir
    _team(tmp_path)
    assert targets_dir(None, tmp_path) == tmp_path / "targets"
    assert known_targets(targets_dir(None, tmp_path)) == ["team-rtx"]


def test_a_targets_relative_paths_start_at_the_folder_holding_its_targets_folder(tmp_path: Path) -> None:
    assert target_root(tmp_path / "targets" / "a.yaml") == tmp_path
    assert target_root(tmp_path / "targets" / "variants" / "a.yaml") == tmp_path
    assert target_root(tmp_path / "loose" / "a.yaml") == tmp_path / "loose"
    assert load_target("rtxpro6000-tp8").root == DATA_DIR


def test_a_teams_file_wins_then_the_package_data_then_the_teams_path_is_named(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "own.jsonl").write_text("{}\n")
    assert resolve_from(tmp_path, "traces/own.jsonl") == tmp_path / "traces" / "own.jsonl"
    assert resolve_from(tmp_path, "traces/agentic-mooncake.jsonl") == DATA_DIR / "traces" / "agentic-mooncake.jsonl"
    assert resolve_from(tmp_path, "traces/missing.jsonl") == tmp_path / "traces" / "missing.jsonl"
    assert resolve_from(tmp_path, "/abs/x.yaml") == Path("/abs/x.yaml")


def test_a_teams_copy_of_a_bundled_target_reaches_the_bundled_proxy_config(tmp_path: Path) -> None:
    team = _team(tmp_path)
    target = load_target("team-rtx", team / "targets")
    assert target.root == team
    assert target.resolve(target.serving.proxy.config) == BUNDLED_TARGETS_DIR / "rtxpro6000-tp8" / "litellm.yaml"


def test_stored_baselines_are_the_teams_when_it_keeps_them_else_the_projects(tmp_path: Path) -> None:
    assert baselines_dir(tmp_path) == DATA_DIR / "baselines"
    assert (DATA_DIR / "baselines" / "rtxpro6000-tp8.json").is_file()
    (tmp_path / "baselines").mkdir()
    assert baselines_dir(tmp_path) == tmp_path / "baselines"


def test_target_dir_option_looks_names_up_in_the_teams_folder(pytester: pytest.Pytester, tmp_path: Path) -> None:
    team = _team(tmp_path)
    test_file = str(pytester.makepyfile("def test_x(ml4_target):\n    assert ml4_target.name == 'team-rtx'\n"))
    pytester.runpytest(test_file, f"--target-dir={team / 'targets'}", "--target", "team-rtx").assert_outcomes(passed=1)
    result = pytester.runpytest(test_file, "--target", "team-rtx")  # no targets/ in the rootdir: the bundled ones
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*unknown target 'team-rtx'; known targets: gb300-agg, *(in {BUNDLED_TARGETS_DIR})"])


def test_a_relative_target_dir_is_the_current_folders_and_the_ini_ones_the_ini_files(pytester: pytest.Pytester,
                                                                                      tmp_path: Path) -> None:
    """``--target-dir=gate`` from ``sub/`` is ``sub/gate``, not the rootdir's ``gate``; ``ml4_target_dir = gate`` in
    the rootdir's ini is the ini's ``gate``, wherever pytest starts."""
    test_file = str(pytester.makepyfile("def test_x(ml4_target):\n    assert ml4_target.name == 'team-rtx'\n"))
    pytester.makeini("[pytest]\n")
    (pytester.path / "sub").mkdir()
    _team(pytester.path / "sub")
    (pytester.path / "sub" / "targets").rename(pytester.path / "sub" / "gate")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(pytester.path / "sub")
        pytester.runpytest(test_file, "--target-dir=gate", "--target", "team-rtx").assert_outcomes(passed=1)
    (pytester.path / "sub" / "gate").rename(pytester.path / "gate")
    pytester.makeini("[pytest]\nml4_target_dir = gate\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        pytester.runpytest(test_file, f"--rootdir={pytester.path}", "-c", str(pytester.path / "tox.ini"),
                           "--target", "team-rtx").assert_outcomes(passed=1)


def test_the_suites_are_found_through_the_import_system() -> None:
    """In a checkout the import system (an editable install's finder) or ``setup.py``'s mapping names
    ``suites/``; installed copies are proven in ``test_installed.py``."""
    found = suites_dir()
    assert found is not None and (found / "test_smoke.py").is_file() and found.name == "suites"


def test_a_folder_without_test_modules_collects_the_suites_one_with_them_its_own(pytester: pytest.Pytester) -> None:
    # In a subprocess: the suites' module names (test_accuracy, ...) are also the project's own tests' names, which
    # an xdist worker may have imported already.
    suites = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--collect-only", "-q")
    assert suites.ret == pytest.ExitCode.OK
    suites.stdout.fnmatch_lines(["*test_smoke.py::test_health", "* tests collected*"])
    pytester.makepyfile("def test_own():\n    pass\n")
    own = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--collect-only", "-q")
    own.stdout.fnmatch_lines(["*::test_own", "1 test collected*"])


def test_a_target_run_that_collects_nothing_names_where_it_looked_and_the_filter(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--collect-only", "-q", "-k", "no_such")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    errors = [ln for ln in result.stderr.lines if ln.startswith("ERROR:")]
    assert errors == [f"ERROR: ml4: no test under {suites_dir()} matches -k 'no_such' for target rtxpro6000-tp8"]
    empty = pytester.mkdir("empty")
    result = pytester.runpytest_subprocess(str(empty), "--target", "rtxpro6000-tp8", "--collect-only")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    errors = [ln for ln in result.stderr.lines if ln.startswith("ERROR:")]
    hint = f"(the package's suites are in {suites_dir()})"
    assert errors == [f"ERROR: ml4: no test found under {empty} for target rtxpro6000-tp8 {hint}"]
