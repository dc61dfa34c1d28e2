"""Allure labels and titles for the checks, in terms a release manager reads.

* epic = the deployment target (``rtxpro6000-tp8``), feature = the suite ("Tool calling"), story = the check
  ("Parallel tool calls are returned in order"), severity = what a failure blocks (``pytest_ml4/data/report/suites.yaml``).
* Titles come from the test's docstring (first line), else from its name made readable.

Plain functions over marker names and test names so they work without pytest; ``plugin_report`` applies them.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file

SUITES_FILE = data_file("report", "suites.yaml")


Severity = Literal["blocker", "critical", "normal", "minor", "trivial"]
SEVERITIES: tuple[str, ...] = get_args(Severity)


class SuiteInfo(Strict):
    """One suite as the report presents it; ``marker`` is the row's key."""

    marker: str = Field("", exclude=True)
    title: str
    severity: Severity
    blocks: str


def _has_default(rows: dict[str, SuiteInfo]) -> dict[str, SuiteInfo]:
    if "default" not in rows:
        raise ValueError("needs a 'default' entry for checks without a suite marker")
    return rows


@lru_cache(maxsize=4)
def load_suites(path: Path = SUITES_FILE) -> dict[str, SuiteInfo]:
    """Suite catalogue keyed by marker name (plus ``default`` for unmarked checks)."""
    rows = load_yaml(Path(path), Annotated[dict[str, SuiteInfo], AfterValidator(_has_default)])
    return {marker: row.model_copy(update={"marker": marker}) for marker, row in rows.items()}


def suite_of(marker_names: set[str] | list[str], module: str = "") -> SuiteInfo:
    """The suite a check belongs to: its suite marker, else its module name (``test_tools.py`` -> tools)."""
    suites = load_suites()
    stem = Path(module).stem.removeprefix("test_")
    # The most severe matching suite wins, so a smoke check also marked tools counts as smoke; between equally
    # severe ones the check's own module's, then the catalogue's order: never the order of a set of markers, which
    # changes from one process to the next (a tools check marked reasoning was counted in either suite at random).
    found = [row for marker, row in suites.items() if marker in marker_names and marker != "default"]
    if found:
        return min(found, key=lambda s: (SEVERITIES.index(s.severity), s.marker != stem))
    return suites.get(stem, suites["default"])


def humanize(name: str) -> str:
    """``test_parallel_tool_calls_in_order`` -> ``Parallel tool calls in order``."""
    words = re.sub(r"^test_?", "", name).replace("_", " ").strip()
    return (words[:1].upper() + words[1:]) if words else name


def check_title(func: Callable[..., Any] | None, name: str) -> str:
    """Title of a check: the first docstring line, else the humanized function name."""
    doc = inspect.getdoc(func) if func is not None else None
    if doc:
        first = doc.strip().splitlines()[0].strip().rstrip(".")
        if first:
            return first
    return humanize(name)


def check_labels(target_name: str | None, marker_names: set[str] | list[str], module: str,
                 func_name: str) -> dict[str, str]:
    """Allure labels for one check: epic (target), feature (suite), story (check), severity, suite tree."""
    suite = suite_of(marker_names, module)
    # parentSuite/suite shape the Suites tab and the Overview's Suites widget: suite titles, then test modules
    # (allure-pytest's default would show the folder name "suites" as the only top-level entry).
    labels = {"feature": suite.title, "story": humanize(func_name), "severity": suite.severity,
              "parentSuite": suite.title, "suite": Path(module).stem}
    if target_name:
        labels["epic"] = target_name
    return labels
