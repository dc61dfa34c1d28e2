"""Path-valued options given space-separated cannot silently move pytest's rootdir.

For every option of ``pytest_ml4/data/plugin/path_options.yaml``: ``--opt PATH`` with a path outside the project stops
with one line naming the option and ``--opt=PATH``; ``--opt=PATH`` runs with the project's rootdir and config.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.plugin.args import path_options, space_separated

REPO = Path(__file__).resolve().parent.parent
OPTIONS = path_options()
_PATHLIKE = re.compile(r"PATH|DIR|FILE")


def _registered_options(pytester: pytest.Pytester) -> dict[str, str]:
    """Every long option pytest knows in a run with the plugin, with its metavar ('' when none)."""
    config = pytester.parseconfig()
    out: dict[str, str] = {}
    for group in config._parser._groups:  # test-only look at the parser: no public listing exists
        for option in group.options:
            for name in option.names():
                if name.startswith("--"):
                    out[name] = str(option.attrs().get("metavar") or "")
    return out


def test_every_path_valued_ml4_option_is_in_the_table(pytester: pytest.Pytester) -> None:
    registered = _registered_options(pytester)
    unknown = [o for o in OPTIONS if o not in registered]
    assert not unknown, f"pytest_ml4/data/plugin/path_options.yaml lists options that do not exist: {unknown}"
    pathlike = {name for name, metavar in registered.items()
                if _PATHLIKE.search(metavar) and name.startswith(("--ml4", "--perf", "--preflight", "--target",
                                                                  "--accuracy", "--sim"))}
    missing = sorted(pathlike - set(OPTIONS))
    assert not missing, f"path-valued options missing from pytest_ml4/data/plugin/path_options.yaml: {missing}"


def test_space_separated_finds_only_the_table_options() -> None:
    args = ["-q", "--ml4-log-file", "/x/engine.log", "--perf-save=/y.json", "-m", "smoke", "--", "--target", "z"]
    assert space_separated(args, OPTIONS) == [("--ml4-log-file", "/x/engine.log")]


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project with its own config: testpaths and a marker that only that config declares."""
    pytester.makeini("[pytest]\ntestpaths = checks\naddopts = --strict-markers\nmarkers =\n    mine: declared here\n")
    (pytester.path / "checks").mkdir()
    (pytester.path / "checks" / "test_mine.py").write_text("import pytest\n\n@pytest.mark.mine\ndef test_x():\n"
                                                          "    pass\n")
    return pytester


def _outside_value(option: str, where: Path) -> Path:
    """An existing path outside the project that the option accepts."""
    if option == "--target":
        shutil.copy(BUNDLED_TARGETS_DIR / "rtxpro6000-tp8.yaml", where / "my-target.yaml")
        return where / "my-target.yaml"
    if option in ("--ml4-log-file", "--perf-baseline", "--perf-save", "--preflight-path"):
        (where / "file.txt").write_text("x\n")
        return where / "file.txt"
    return where  # a folder: --ml4-reports, --ml4-run-dir (empty), --alluredir


@pytest.mark.parametrize("option", OPTIONS)
def test_space_form_with_a_path_outside_stops_with_one_line(project: pytest.Pytester, option: str,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    value = _outside_value(option, tmp_path_factory.mktemp("elsewhere"))
    result = project.runpytest("--collect-only", option, str(value))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [ln for ln in (result.stdout.lines + result.stderr.lines) if ln.startswith("ERROR:")]
    assert len(lines) == 1, result.stderr.lines
    assert lines[0].startswith(f"ERROR: {option} {value}: pytest took this path for a test path (")
    assert lines[0].endswith(f"; write {option}={value}")
    assert "config file none instead of" in lines[0] and str(project.path / "tox.ini") in lines[0]
    assert "test_mine.py" not in result.stdout.str(), "stopped before collection"


@pytest.mark.parametrize("option", OPTIONS)
def test_equals_form_keeps_the_projects_rootdir_and_config(project: pytest.Pytester, option: str,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    value = _outside_value(option, tmp_path_factory.mktemp("elsewhere"))
    result = project.runpytest("--collect-only", f"{option}={value}", "-m", "mine")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-1500:]
    result.stdout.fnmatch_lines([f"rootdir: {project.path}", "configfile: tox.ini", "testpaths: checks",
                                 "*<Function test_x>*"])


def test_space_form_with_a_path_inside_the_project_is_harmless(project: pytest.Pytester) -> None:
    (project.path / "reports").mkdir()
    result = project.runpytest("--collect-only", "--ml4-reports", "reports", "-m", "mine")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"rootdir: {project.path}", "configfile: tox.ini", "*<Function test_x>*"])


def test_the_issue_command_line_on_the_project(tmp_path: Path) -> None:
    """The rootdir-moving command line on this repository: the space form stops, the = form keeps the project's
    pyproject.toml (testpaths = suites)."""
    log = tmp_path / "rd" / "engine.log"
    log.parent.mkdir()
    log.write_text("INFO started\n")
    env = dict(os.environ, PYTEST_ADDOPTS="")
    base = [sys.executable, "-m", "pytest", "--collect-only", "--target", "rtxpro6000-tp8", "-m", "smoke"]
    space = subprocess.run(base + ["--ml4-log-file", str(log)], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=120, check=False)
    assert space.returncode == pytest.ExitCode.USAGE_ERROR
    # Which rootdir pytest picks from the stray path depends on where the checkout and the temp folder are (a clone
    # under /tmp shares an ancestor with them): the line names the option, the project's rootdir it lost and the fix.
    line = next((ln for ln in space.stderr.splitlines() if ln.startswith("ERROR: --ml4-log-file")), "")
    assert line.startswith(f"ERROR: --ml4-log-file {log}: pytest took this path for a test path (rootdir "), space.stderr
    assert f" instead of {REPO}" in line and line.endswith(f"; write --ml4-log-file={log}"), line
    equals = subprocess.run(base + [f"--ml4-log-file={log}"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert equals.returncode == 0, equals.stdout[-1500:]
    assert f"rootdir: {REPO}" in equals.stdout and "configfile: pyproject.toml" in equals.stdout
    assert "<Module test_smoke.py>" in equals.stdout and "<Dir tests>" not in equals.stdout
