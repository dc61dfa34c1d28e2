"""The tool fixtures the tools suite sends exercise every schema shape the tool parser must handle.

Moved from ``suites/test_tools.py``: it checks the repository's data, not the deployment, so
it belongs with the project's own tests."""

from __future__ import annotations

import yaml

from pytest_ml4.checks.tools import load_tools, tool_name
from pytest_ml4.locations import data_file


def test_fixture_tools_cover_the_schema_shapes() -> None:
    """Flat, nested objects, enums, arrays, integers, numbers, booleans, optionals."""
    toolset = load_tools(yaml.safe_load((data_file("prompts", "tools.yaml")).read_text())["toolset"])
    text = yaml.safe_dump([t["function"]["parameters"] for t in toolset])
    for shape in ("type: object", "enum:", "type: array", "type: integer", "type: number", "type: boolean"):
        assert shape in text, f"no tool fixture has {shape!r}"
    nested = [tool_name(t) for t in toolset
              if any(p.get("type") == "object" for p in t["function"]["parameters"]["properties"].values())]
    optional = [tool_name(t) for t in toolset
                if set(t["function"]["parameters"]["properties"]) - set(t["function"]["parameters"]["required"])]
    assert nested and optional
