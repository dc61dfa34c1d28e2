"""The plugin's copy of pytest's rootdir rule (pytest_ml4/plugin/rootdir.py) agrees with pytest's own.

pytest's implementation is private (``_pytest.config.findpaths``); the package must not import it, this test
does, as the oracle: each layout and argument list gets the same rootdir and config file from both.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.config.findpaths import (
    determine_setup,  # the oracle only: the package uses its own copy
)

from pytest_ml4.plugin.rootdir import rootdir_and_config

LAYOUTS: dict[str, dict[str, str]] = {
    "tox_ini": {"proj/tox.ini": "[pytest]\ntestpaths = checks\n", "proj/checks/test_a.py": ""},
    "tox_ini_without_section": {"proj/tox.ini": "[tox]\nenvlist = py\n", "proj/checks/test_a.py": ""},
    "pyproject_with_pytest": {"proj/pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-q'\n",
                              "proj/checks/test_a.py": ""},
    "pyproject_without_pytest": {"proj/pyproject.toml": "[project]\nname = 'x'\n", "proj/checks/test_a.py": ""},
    "setup_cfg": {"proj/setup.cfg": "[metadata]\nname = x\n\n[tool:pytest]\naddopts = -q\n",
                  "proj/checks/test_a.py": ""},
    "pytest_ini_below_pyproject": {"proj/pyproject.toml": "[tool.pytest.ini_options]\n",
                                   "proj/sub/pytest.ini": "", "proj/sub/test_b.py": ""},
    "setup_py_only": {"proj/setup.py": "", "proj/checks/test_a.py": ""},
    "nothing": {"proj/checks/test_a.py": ""},
}
ARGS: dict[str, list[str]] = {
    "none": [],
    "inside": ["checks"],
    "outside_file": ["../elsewhere/engine.log"],
    "inside_and_outside": ["checks", "../elsewhere"],
    "node_id": ["checks/test_a.py::test_x"],
    "missing_path": ["no/such/path"],
}


@pytest.mark.parametrize("args", list(ARGS.values()), ids=list(ARGS))
@pytest.mark.parametrize("layout", list(LAYOUTS.values()), ids=list(LAYOUTS))
def test_same_rootdir_and_config_file_as_pytest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                layout: dict[str, str], args: list[str]) -> None:
    for rel, text in {**layout, "elsewhere/engine.log": "x\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    here = tmp_path / "proj"
    monkeypatch.chdir(here)
    theirs = determine_setup(inifile=None, override_ini=None, args=args, rootdir_cmd_arg=None, invocation_dir=here)
    ours = rootdir_and_config(inifile=None, args=args, rootdir_cmd_arg=None, invocation_dir=here)
    assert ours == theirs[:2]


def test_config_file_option_and_rootdir_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "cfg.ini").write_text("[pytest]\n")
    monkeypatch.chdir(tmp_path / "proj")
    for inifile, rootdir in ((str(tmp_path / "cfg.ini"), None), (None, str(tmp_path)),
                             (str(tmp_path / "cfg.ini"), str(tmp_path / "proj"))):
        theirs = determine_setup(inifile=inifile, override_ini=None, args=["."], rootdir_cmd_arg=rootdir,
                                 invocation_dir=tmp_path / "proj")
        assert rootdir_and_config(inifile=inifile, args=["."], rootdir_cmd_arg=rootdir,
                            invocation_dir=tmp_path / "proj") == theirs[:2]
