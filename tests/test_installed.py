"""The suite installed by pip runs a platform team's own target from its own repository: the package finds its
data, its bundled suites and the team's ``targets/`` without a checkout, whether pip installed it as a wheel
(``pip install PATH``) or editable (``pip install -e PATH``, what ``scripts/install.sh`` makes), from any folder.

Nothing is downloaded: a copy of the checkout's package sources (without ``fixtures/``, ``tests/`` or ``.git``: what
a wheel may need is there or nowhere) is installed with ``--no-deps`` (its build backend from pip's configured
index, as ``scripts/install.sh`` gets it) into a fresh venv outside the checkout, and the dependencies are this
venv's, made visible by a ``.pth`` file. An install takes a few seconds; the collection runs well under one.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from checkout import REPO_ROOT
from installs import Installed, clean_env, install

from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.plugin.embedded import INSTALL_HINT

TEAM_TARGET = "team-rtx"


def _team_repository(where: Path, targets: str = "targets", name: str = TEAM_TARGET) -> Path:
    """A team's repository: one target of its own (the RTX PRO seed's, renamed) in ``targets``, nothing else."""
    team = where / "team"
    (team / targets).mkdir(parents=True)
    data = yaml.safe_load((BUNDLED_TARGETS_DIR / "rtxpro6000-tp8.yaml").read_text())
    data["name"] = name
    (team / targets / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return team



@pytest.fixture(scope="module", params=["pip", "editable"])
def installed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """``pip install COPY`` (a wheel built and installed) and ``pip install -e COPY`` (the checkout's layout kept:
    ``suites/`` stays beside the package, reached only through the editable finder)."""
    return Installed(tmp_path_factory.mktemp(f"install-{request.param}"), request.param)


def _collected(run: subprocess.CompletedProcess[str]) -> int:
    """The count of ``N tests collected`` (0 when the line is missing)."""
    found = re.search(r"^(\d+) tests? collected", run.stdout, re.MULTILINE)
    return int(found.group(1)) if found else 0


def test_each_install_places_its_suites_where_only_the_import_system_knows(installed: Installed) -> None:
    """Caught: the suites were looked for at ``pytest_ml4/suites`` only, which an editable install never has."""
    assert (installed.suites / "test_smoke.py").is_file(), installed.suites
    if installed.kind == "pip":
        assert installed.suites == installed.package / "suites" and installed.package.is_relative_to(installed.where)
    else:
        assert not (installed.package / "suites").exists(), "an editable install leaves suites/ beside the package"
        assert installed.suites == installed.package.parent / "suites" != REPO_ROOT / "suites"


def test_a_team_folder_collects_the_installed_suites(installed: Installed, tmp_path: Path) -> None:
    """Caught: under an editable install ``pytest --target mine --collect-only`` in a team's repository said
    ``no tests collected`` and exited 5."""
    team = _team_repository(tmp_path)
    run = installed.pytest("--target", TEAM_TARGET, "--collect-only", "-q", cwd=team)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert _collected(run) > 0 and "test_smoke.py::test_health" in run.stdout, run.stdout[-2000:]
    pyargs = installed.pytest("--target", TEAM_TARGET, "--collect-only", "-q", "--pyargs", "pytest_ml4.suites",
                              cwd=team)
    assert pyargs.returncode == 0, pyargs.stdout[-2000:] + pyargs.stderr[-2000:]
    assert _collected(pyargs) == _collected(run)
    module = installed.pytest("--collect-only", "-q", "--pyargs", "pytest_ml4.suites.test_smoke::test_health",
                              cwd=team)
    # pytest names a test of a lone file argument outside the rootdir "::name" (the file is the argument).
    assert _collected(module) == 1 and "::test_health" in module.stdout, module.stdout[-2000:]


def test_target_dir_is_relative_to_the_current_folder_not_the_rootdir(installed: Installed, tmp_path: Path) -> None:
    """The team's ini sits at its repository's top (pytest's rootdir); the gate runs from ``gate/``, whose own
    ``targets/`` holds the target: ``--target-dir=targets`` means ``gate/targets``, as a shell user reads it."""
    team = _team_repository(tmp_path, targets="gate/targets", name="gate-rtx")
    (team / "pytest.ini").write_text("[pytest]\n")
    run = installed.pytest("--target", "gate-rtx", "--target-dir=targets", "--collect-only", cwd=team / "gate")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"rootdir: {team}" in run.stdout and "<Function test_health>" in run.stdout, run.stdout[:2000]


def test_a_run_that_collects_nothing_says_why_in_one_line(installed: Installed, tmp_path: Path) -> None:
    team = _team_repository(tmp_path)
    run = installed.pytest("--target", TEAM_TARGET, "--collect-only", "-q", "-m", "no_such_marker", cwd=team)
    assert run.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, run.stdout[-2000:] + run.stderr[-2000:]
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("ERROR:")]
    expected = f"ERROR: ml4: no test under {installed.suites} matches -m 'no_such_marker' for target {TEAM_TARGET}"
    assert lines == [expected], run.stderr


def test_a_live_install_carries_no_embedded_deployment(installed: Installed, tmp_path: Path) -> None:
    """``pip install`` of the suite alone: no module of the embedded deployment (``harness/``) comes with it, and a
    run with ``--sim`` or any option only the embedded deployment reads says in one line what to install, naming
    the option. (That the live suites run from such an install, against a deployment it did not start, is
    tests/test_team_flow.py's.)"""
    probe = installed.command("python", "-c", "import importlib.util as u; print(u.find_spec('pytest_ml4_sim'))",
                              cwd=tmp_path)
    assert probe.stdout.strip() == "None", probe.stdout + probe.stderr
    modules = {p.relative_to(installed.package).parts[0] for p in installed.package.rglob("*.py")}
    assert not modules & {"deploy", "sim", "realvllm", "realdynamo"}, sorted(modules)
    team = _team_repository(tmp_path)
    for option in (["--sim"], ["--ml4-fault", "workers_down"], ["--sim-engine", "vllm"], ["--ml4-no-dynamo-bridge"]):
        run = installed.pytest("--target", TEAM_TARGET, *option, "-m", "smoke", cwd=team)
        assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout[-2000:] + run.stderr[-2000:]
        errors = [ln for ln in run.stderr.splitlines() if ln.startswith("ERROR:")]
        expected = f"ERROR: {option[0]} needs the embedded deployment (pytest-ml4-sim), which is not installed " \
                   f"here: {INSTALL_HINT}"
        assert errors == [expected], run.stderr[-2000:]


@pytest.mark.nightly
def test_the_pip_installed_suite_runs_a_teams_own_target_from_its_repository(tmp_path: Path) -> None:
    """Caught: the package found its tables, targets and suites only through the checkout (``REPO_ROOT``). The
    embedded deployment (``--sim``) is installed beside it from ``harness/``, as the ``sim`` extra does.
    Nightly: it takes about two minutes on two busy cores (a wheel build, an install, LiteLLM and the simulator
    starting), over CI's budget for one test."""
    python = install(tmp_path, editable=False, with_harness=True)
    env = clean_env()
    where = subprocess.run([str(python), "-c", "import pytest_ml4.locations as l; print(l.PACKAGE_DIR)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    package = Path(where.stdout.strip())
    assert package.is_relative_to(tmp_path / "venv") and (package / "suites" / "test_smoke.py").is_file(), package

    team = _team_repository(tmp_path)
    run = subprocess.run([str(python), "-m", "pytest", "--target", TEAM_TARGET, "--sim", "-m", "smoke", "-p",
                          "no:cacheprovider", "-v"], env=env, cwd=team, capture_output=True, text=True,
                         timeout=900, check=False)
    out = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, out
    # The team's folder holds no tests: what ran are the suites the installed copy carries.
    assert "test_smoke.py::test_health PASSED" in run.stdout and not re.search(r"\b\d+ failed\b", run.stdout), out
    (summary,) = (team / "reports").glob(f"*-{TEAM_TARGET}-*/summary.json")
    assert json.loads(summary.read_text())["target"] == TEAM_TARGET
