"""The plugin package's shape: no import circle among its modules, one place that creates the ``ml4`` option group
and one option reader, and no plugin module that starts a process (``deploy/`` does)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_ml4

PKG = Path(pytest_ml4.__file__).parent
PLUGIN = PKG / "plugin"


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions (a lazy import is still a circle)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _cycle_from(start: str, edges: dict[str, set[str]]) -> list[str] | None:
    """A path of imports from ``start`` back to itself, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in edges.get(node, ()):
            if nxt == start:
                return [*path, nxt]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_cycle_among_the_plugin_modules() -> None:
    mods = {_module(p): p for p in PLUGIN.glob("*.py")}
    edges = {m: {n for n in _imported_modules(p) if n in mods and n != m} for m, p in mods.items()}
    cycles = [c for m in mods if (c := _cycle_from(m, edges))]
    assert not cycles, f"import cycles in pytest_ml4.plugin: {cycles}"


def test_the_ml4_option_group_is_created_in_one_place() -> None:
    creators = sorted(p.name for p in PLUGIN.glob("*.py") if "getgroup(" in p.read_text(encoding="utf-8"))
    assert creators == ["option_group.py"], f"modules creating the ml4 group themselves: {creators}"


def test_one_option_reader() -> None:
    own = sorted(p.name for p in PLUGIN.glob("*.py")
                 if any(isinstance(n, ast.FunctionDef) and n.name in ("opt", "_opt")
                        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))))
    assert own == ["option_group.py"], f"modules with their own option reader: {own}"


def test_no_plugin_module_starts_a_process() -> None:
    starters = sorted(p.name for p in PLUGIN.glob("*.py") if "subprocess" in _imported_modules(p))
    assert not starters, f"plugin modules importing subprocess (processes start in pytest_ml4_sim.deploy): {starters}"
