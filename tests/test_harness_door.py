"""The embedded deployment (``pytest_ml4_sim``, harness/) is a distribution of its own: the suite's package and its
suites reach it through one door, ``pytest_ml4/plugin/embedded.py``, so a live install without it imports nothing
of it. Annotations may name its types under ``if TYPE_CHECKING:``, which never runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from checkout import REPO_ROOT

import pytest_ml4
from pytest_ml4.plugin import embedded

HARNESS = "pytest_ml4_sim"
PACKAGE = Path(pytest_ml4.__file__).parent
ROOTS = (PACKAGE, REPO_ROOT / "suites")
DOOR = PACKAGE / "plugin" / "embedded.py"


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) body."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
        if name == "TYPE_CHECKING":
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def _names_harness(node: ast.AST) -> bool:
    """An import statement of the harness, or an ``import_module``/``__import__`` call naming it."""
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == HARNESS for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] == HARNESS
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        first = node.args[0]
        if isinstance(first, ast.JoinedStr):
            first = first.values[0] if first.values else first
        text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
        return called in ("import_module", "__import__") and text.startswith(HARNESS)
    return False


def harness_imports(path: Path) -> list[int]:
    """Lines of ``path`` that import the harness at run time (outside ``TYPE_CHECKING`` blocks)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skipped = _type_checking_nodes(tree)
    return sorted(n.lineno for n in ast.walk(tree) if _names_harness(n) and id(n) not in skipped)


def test_only_the_door_imports_the_harness_at_run_time() -> None:
    found = [f"{path.relative_to(REPO_ROOT)}:{line}" for root in ROOTS for path in sorted(root.rglob("*.py"))
             if path != DOOR for line in harness_imports(path)]
    assert not found, f"pytest_ml4_sim imported outside pytest_ml4/plugin/embedded.py: {', '.join(found)}"
    assert harness_imports(DOOR), "the door itself imports the harness (the walk above would find none at all)"


@pytest.mark.parametrize("source, lines", [
    ("import pytest_ml4_sim.deploy\n", [1]),
    ("def f():\n    from pytest_ml4_sim.sim import faults\n", [2]),
    ("import importlib\nm = importlib.import_module(f'pytest_ml4_sim.{x}')\n", [2]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pytest_ml4_sim.deploy import dynamo\n", []),
    ("import typing\nif typing.TYPE_CHECKING:\n    import pytest_ml4_sim\nelse:\n    import pytest_ml4_sim.sim\n", [5]),
    ("from pytest_ml4.plugin.embedded import harness_module\nimport pytest_ml4_simulator\n", []),
], ids=["top-level", "lazy", "import_module", "type-checking", "else-branch", "other-names"])
def test_the_walk_tells_run_time_imports_from_annotations(tmp_path: Path, source: str, lines: list[int]) -> None:
    path = tmp_path / "module.py"
    path.write_text(source)
    assert harness_imports(path) == lines


def test_every_sim_only_option_is_one_the_plugin_defines(pytestconfig: pytest.Config) -> None:
    """The door's table names real options: a renamed one would silently stop being checked."""
    for dest in embedded.SIM_ONLY_OPTIONS:
        pytestconfig.getoption(dest)   # ValueError for an option no plugin module defines
