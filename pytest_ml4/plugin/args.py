"""Path-valued options given space-separated must not move pytest's rootdir.

pytest determines its rootdir and ini file from the free arguments of a first parse that knows none of the
plugins' options: in ``--ml4-log-file /tmp/rd/engine.log`` the value is taken for a test path, the rootdir becomes
``/tmp/rd``, the project's ``[tool.pytest.ini_options]`` (``testpaths``, ``--strict-markers``) is not read, and a
run without ``-m`` collects whatever lies under the new rootdir. pytest offers no way to redo that choice, so the
plugin recomputes it without those values (pytest's documented rule, :mod:`pytest_ml4.plugin.rootdir`) and,
where the outcome differs, stops before any conftest is imported with one line naming the option and the fix
(``--opt=PATH``; ``--rootdir`` would not do: pytest still looks for the config file from the free arguments).
Where the outcome is the same (a relative path inside the project, a path that does not exist yet) nothing
happened and the run goes on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import StringConstraints

from pytest_ml4.datafile import DataFileError, Strict, load_yaml
from pytest_ml4.locations import PACKAGE_DIR, SUITES_PACKAGE, data_file, suites_dir
from pytest_ml4.plugin.rootdir import rootdir_and_config

PATH_OPTIONS_FILE = data_file("plugin", "path_options.yaml")


class PathOptions(Strict):
    options: tuple[Annotated[str, StringConstraints(pattern=r"^--")], ...]


def path_options(path: Path = PATH_OPTIONS_FILE) -> tuple[str, ...]:
    """The option names of the table (``pytest_ml4/data/plugin/path_options.yaml``)."""
    try:
        return load_yaml(path, PathOptions).options
    except DataFileError as err:   # read while pytest parses its arguments: a usage error, not a crash
        raise pytest.UsageError(str(err)) from None


def space_separated(args: Sequence[str], options: Sequence[str]) -> list[tuple[str, str]]:
    """(option, value) for each path option written ``--opt VALUE`` (the ``--opt=VALUE`` form is safe)."""
    found = []
    for i, arg in enumerate(args[:-1]):
        if arg == "--":
            break
        if arg in options:
            found.append((arg, args[i + 1]))
    return found


def moved_setup(config: pytest.Config, values: Sequence[str]) -> str | None:
    """What the values changed in pytest's setup (rootdir, config file), or None when nothing changed."""
    ns = config.known_args_namespace  # the second parse: knows every option, so file_or_dir holds no option values
    free = [a for a in ns.file_or_dir if a not in values]
    rootpath, inipath = rootdir_and_config(inifile=ns.inifilename, args=free, rootdir_cmd_arg=ns.rootdir or None,
                                           invocation_dir=config.invocation_params.dir)
    changes = []
    if rootpath != config.rootpath:
        changes.append(f"rootdir {config.rootpath} instead of {rootpath}")
    if inipath != config.inipath:
        changes.append(f"config file {config.inipath or 'none'} instead of {inipath or 'none'}")
    return ", ".join(changes) or None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, args: list[str]) -> None:
    here = early_config.invocation_params.dir
    # Only a value that exists can steer the rootdir (pytest ignores free arguments that are not paths).
    given = [(o, v) for o, v in space_separated(args, path_options()) if (here / v).exists()]
    if not given:
        return
    changed = moved_setup(early_config, [value for _, value in given])
    if changed is None:
        return
    opt, value = given[0]
    # --rootdir is no fix: pytest still looks for the config file from the free arguments.
    raise pytest.UsageError(f"{opt} {value}: pytest took this path for a test path ({changed}); "
                            f"write {opt}={value}")


def _target_given(config: pytest.Config) -> str | None:
    return config.getoption("ml4_target") or config.getini("ml4_target") or os.environ.get("ML4_TARGET")


def pyarg_path(arg: str, suites: Path) -> str:
    """``pytest_ml4.suites[.module][::name]`` as the path it names; any other argument as given. The suites folder
    holds no ``__init__.py`` (a namespace package), which pytest's own ``--pyargs`` does not resolve."""
    name, sep, rest = arg.partition("::")
    if name == SUITES_PACKAGE:
        return f"{suites}{sep}{rest}"
    if name.startswith(SUITES_PACKAGE + "."):
        module = name.removeprefix(SUITES_PACKAGE + ".").replace(".", "/")
        return f"{suites / module}.py{sep}{rest}"
    return arg


def holds_test_modules(folder: Path, patterns: Sequence[str]) -> bool:
    """Whether ``folder`` itself (not its subfolders) holds a file pytest collects as a test module."""
    return any(fnmatch(entry.name, pattern) for entry in folder.iterdir() if entry.is_file() for pattern in patterns)


def pytest_configure(config: pytest.Config) -> None:
    """A team runs the installed suite from its own repository: given a target and no test path (and no
    ``testpaths``), the run collects the suites the package carries instead of the team's folder, unless that
    folder holds test modules of its own at its top (then it runs those, as pytest would: a plugin's own tests
    work that way); ``--pyargs pytest_ml4.suites`` names them from anywhere."""
    suites = suites_dir()
    if suites is not None and config.option.pyargs:
        config.args = [pyarg_path(arg, suites) for arg in config.args]
    if config.args_source is not pytest.Config.ArgsSource.INVOCATION_DIR or not _target_given(config):
        return
    if holds_test_modules(config.invocation_params.dir, config.getini("python_files")):
        return
    if suites is None:
        raise pytest.UsageError(f"--target: the package's suites were not found (import {SUITES_PACKAGE} finds no "
                                f"folder; {PACKAGE_DIR} is the package): reinstall it with pip, or give the "
                                f"suites' folder as a test path")
    config.args = [str(suites)]


def nothing_collected(config: pytest.Config) -> str:
    """Why a run with a target collected no test, in one line: where it looked and what deselected everything."""
    where = ", ".join(config.args) or str(config.invocation_params.dir)
    filters = [f"{flag} {value!r}" for flag, value in (("-m", config.getoption("markexpr")),
                                                        ("-k", config.getoption("keyword"))) if value]
    suites = suites_dir()
    hint = "" if suites is None or str(suites) in config.args else f" (the package's suites are in {suites})"
    if filters:
        return f"ml4: no test under {where} matches {' and '.join(filters)} for target {_target_given(config)}{hint}"
    return f"ml4: no test found under {where} for target {_target_given(config)}{hint}"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A gate that ran nothing is no verdict: say why in one line (the exit status stays pytest's 5)."""
    config = session.config
    if exitstatus != pytest.ExitCode.NO_TESTS_COLLECTED or hasattr(config, "workerinput") or not _target_given(config):
        return
    sys.stderr.write(f"ERROR: {nothing_collected(config)}\n")
