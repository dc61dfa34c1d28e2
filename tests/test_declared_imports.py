"""Every third-party module the shipped code imports comes from a distribution its pyproject.toml declares.

An import that works only because some other dependency happens to pull its distribution in (``websocket`` through
the Kubernetes client, ``allure_commons`` through allure-pytest) breaks the day that dependency drops it. The
imports are read with :mod:`ast` (every ``import`` anywhere in a module: the lazy ones inside functions too) and
mapped to their distributions with :func:`importlib.metadata.packages_distributions`.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "pyproject.toml"
HARNESS = ROOT / "harness" / "pyproject.toml"

#: Modules imported only by code that runs inside an external tool's own environment (installed under
#: ~/.cache/pytest-ml4 by scripts/install.sh, never by pip from these pyproject files), with that tool.
TOOL_ENVIRONMENTS = {
    "bfcl_eval": "bfcl-eval (accuracy/bfcl.py appends its site-packages at run time)",
    "vllm": "real vLLM (realvllm/scripted.py is loaded by the vLLM server)",
    "torch": "real vLLM (realvllm/scripted.py's logits processor)",
    "transformers": "Dynamo's vLLM worker (deploy/dynamo_model.py runs under its Python)",
    "dynamo": "Dynamo (sim/dynamo_worker.py registers with its runtime)",
}


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(pyproject: Path) -> set[str]:
    """The distributions a pyproject.toml names: its dependencies and every extra's."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    out = {normalized(project["name"])}
    for req in reqs:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        assert match, f"{pyproject}: unreadable requirement {req!r}"
        out.add(normalized(match.group(1)))
    return out


def imported(folders: list[Path]) -> dict[str, str]:
    """Top-level module -> the first file (relative to the checkout) that imports it absolutely."""
    out: dict[str, str] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                         else [])
                for name in names:
                    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    out.setdefault(name.split(".")[0], str(shown))
    return out


def undeclared(folders: list[Path], allowed: set[str]) -> list[str]:
    """``module (file): from <distributions>`` for each third-party module no declared distribution provides."""
    providers = packages_distributions()
    bad = []
    for module, where in sorted(imported(folders).items()):
        if module in sys.stdlib_module_names or module in TOOL_ENVIRONMENTS:
            continue
        dists = {normalized(d) for d in providers.get(module, [])}
        if not dists & allowed:
            bad.append(f"{module} ({where}): from {', '.join(sorted(dists)) or 'no installed distribution'}")
    return bad


def test_the_core_and_the_suites_import_only_what_pyproject_declares() -> None:
    assert undeclared([ROOT / "pytest_ml4", ROOT / "suites"], declared(CORE)) == []


def test_the_harness_imports_only_what_its_pyproject_and_the_core_declare() -> None:
    assert undeclared([ROOT / "harness"], declared(HARNESS) | declared(CORE)) == []


def test_an_undeclared_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import yaml\n\ndef f():\n    from attr import define\n")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["PyYAML>=6"]\n')
    found = undeclared([tmp_path], declared(pyproject))
    assert found == [f"attr ({tmp_path / 'm.py'}): from attrs"]


@pytest.mark.parametrize("module", sorted(TOOL_ENVIRONMENTS))
def test_a_tool_environment_module_is_imported_somewhere(module: str) -> None:
    # A stale entry would hide a real undeclared import of the same name later.
    assert module in imported([ROOT / "pytest_ml4", ROOT / "suites", ROOT / "harness"])
