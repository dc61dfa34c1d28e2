"""The plugin's modules import without a circle: ``plugin.py`` imports no ``plugin_*`` module (it lists them in
``pytest_plugins`` by name), so a ``plugin_*`` module importing shared state cannot close a loop through it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_ml4

PKG = Path(pytest_ml4.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions (a lazy import is still a circle)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_plugin_imports_no_plugin_submodule() -> None:
    imported = _imported_modules(PKG / "plugin.py")
    glue = {f"pytest_ml4.{p.stem}" for p in PKG.glob("plugin_*.py")} - {"pytest_ml4.plugin.state"}
    assert not imported & glue, f"plugin.py imports {sorted(imported & glue)}: move what they share to plugin_common"


def test_plugin_restart_does_not_import_plugin() -> None:
    assert "pytest_ml4.plugin" not in _imported_modules(PKG / "plugin_restart.py")


def test_plugin_common_imports_no_plugin_module_at_run_time() -> None:
    tree = ast.parse((PKG / "plugin_common.py").read_text(encoding="utf-8"))
    # Only under TYPE_CHECKING may it name plugin.py (for the state's type); nothing at run time.
    runtime = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(not (getattr(n, "module", "") or "").startswith("pytest_ml4.plugin") for n in runtime)
