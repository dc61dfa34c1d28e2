"""pytest's rootdir and config-file rule, as its documentation states it, for the arguments the plugin chooses.

:mod:`pytest_ml4.plugin.args` asks what rootdir and config file pytest would have picked without some free
arguments; pytest computes that only inside its private ``_pytest.config.findpaths``. The rule is documented
(https://docs.pytest.org/en/stable/reference/customize.html, "Finding the rootdir"): from the common ancestor of
the path arguments, walk up to the first folder holding a config file that carries pytest's section
(``pytest.toml``, ``.pytest.toml``, ``pytest.ini``, ``.pytest.ini`` always; ``pyproject.toml`` with
``[tool.pytest]``/``[tool.pytest.ini_options]``; ``tox.ini`` with ``[pytest]``; ``setup.cfg`` with
``[tool:pytest]``), else the first ``pyproject.toml``; without one, the first folder with ``setup.py``, then each
argument's own folders, then the common ancestor with the invocation folder. ``-c FILE`` fixes the config file
and roots at its folder; ``--rootdir`` overrides the rootdir.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path


def _always(_: Path) -> bool:
    return True


def _ini_section(name: str) -> Callable[[Path], bool]:
    header = re.compile(rf"^\[{re.escape(name)}\][ \t]*$", re.MULTILINE)

    def holds(path: Path) -> bool:
        try:
            return header.search(path.read_text(encoding="utf-8", errors="replace")) is not None
        except OSError:
            return False

    return holds


def _pyproject_holds(path: Path) -> bool:
    try:
        tool = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False  # pytest stops on a broken file itself
    return isinstance(tool, dict) and bool(tool.get("pytest"))


#: The config files pytest discovers, in its order of precedence, and whether a file carries pytest's section.
CONFIG_FILES: dict[str, Callable[[Path], bool]] = {
    "pytest.toml": _always,
    ".pytest.toml": _always,
    "pytest.ini": _always,
    ".pytest.ini": _always,
    "pyproject.toml": _pyproject_holds,
    "tox.ini": _ini_section("pytest"),
    "setup.cfg": _ini_section("tool:pytest"),
}


def locate_config(dirs: Iterable[Path]) -> tuple[Path | None, Path | None]:
    """(rootdir, config file) of the first folder, walking up from each of ``dirs``, with a config file carrying
    pytest's section; else the first ``pyproject.toml`` met; else (None, None)."""
    first_pyproject: Path | None = None
    for start in dirs:
        for base in (start, *start.parents):
            for name, holds in CONFIG_FILES.items():
                candidate = base / name
                if not candidate.is_file():
                    continue
                if name == "pyproject.toml" and first_pyproject is None:
                    first_pyproject = candidate
                if holds(candidate):
                    return base, candidate
    if first_pyproject is not None:
        return first_pyproject.parent, first_pyproject
    return None, None


def common_ancestor(invocation_dir: Path, paths: Iterable[Path]) -> Path:
    """The deepest folder holding every existing path (the invocation folder when none exists)."""
    existing = [p for p in paths if p.exists()]
    if not existing:
        return invocation_dir
    shared = Path(os.path.commonpath([str(p) for p in existing]))
    return shared.parent if shared.is_file() else shared


def arg_dirs(args: Iterable[str], invocation_dir: Path) -> list[Path]:
    """The folder of each free argument naming an existing path (``path::name`` node ids included)."""
    out = []
    for arg in args:
        if arg.startswith("-"):
            continue
        path = Path(os.path.abspath(invocation_dir / arg.split("::", 1)[0]))
        if path.exists():
            out.append(path if path.is_dir() else path.parent)
    return out


def rootdir_and_config(*, inifile: str | None, args: Sequence[str], rootdir_cmd_arg: str | None,
                 invocation_dir: Path) -> tuple[Path, Path | None]:
    """(rootdir, config file) pytest picks for these free arguments and options."""
    dirs = arg_dirs(args, invocation_dir)
    ancestor = common_ancestor(invocation_dir, dirs)
    if inifile:
        inipath: Path | None = Path(os.path.abspath(invocation_dir / inifile))
        rootdir = inipath.parent if inipath.is_file() else ancestor
        if rootdir == Path(rootdir.anchor):
            rootdir = invocation_dir
    else:
        rootdir_found, inipath = locate_config([ancestor])
        rootdir = rootdir_found or ancestor
        if rootdir_found is None and rootdir_cmd_arg is None:
            with_setup_py = next((d for d in (ancestor, *ancestor.parents) if (d / "setup.py").is_file()), None)
            if with_setup_py is not None:
                rootdir = with_setup_py
            else:
                if dirs != [ancestor]:
                    rootdir_found, inipath = locate_config(dirs)
                rootdir = rootdir_found or common_ancestor(invocation_dir, [invocation_dir, ancestor])
                if rootdir == Path(rootdir.anchor):
                    rootdir = ancestor
    if rootdir_cmd_arg:
        rootdir = Path(os.path.abspath(os.path.expandvars(rootdir_cmd_arg)))
    return rootdir, inipath
