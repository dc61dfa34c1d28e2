"""Allure ``categories.json``: how failures are grouped on the report's Categories tab.

The definitions are data (``pytest_ml4/data/report/categories.json``): gate failures, protocol violations, endpoint
unreachable, crashed test processes and test defects. :func:`categorize` applies them the way Allure 2 does
(status in ``matchedStatuses`` and the whole message matching ``messageRegex``, dot matching newlines), so the
run summary and the tests can tell which category a failure lands in without generating the HTML.
"""

from __future__ import annotations

import json
import re
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

from pytest_ml4.locations import data_file

CATEGORIES_FILE = data_file("report", "categories.json")


@lru_cache(maxsize=4)
def load_categories(path: Path = CATEGORIES_FILE) -> tuple[dict[str, Any], ...]:
    """The category definitions (validated: every regex compiles, statuses are Allure's)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    for cat in data:
        bad = set(cat.get("matchedStatuses", [])) - {"failed", "broken", "passed", "skipped", "unknown"}
        if bad:
            raise ValueError(f"{path}: category {cat['name']!r} has unknown statuses {sorted(bad)}")
        for key in ("messageRegex", "traceRegex"):
            if key in cat:
                re.compile(cat[key])
    return tuple(data)


def write_categories(alluredir: Path, path: Path = CATEGORIES_FILE) -> Path:
    """Copy the definitions into an Allure results folder (Allure 2 reads ``categories.json`` from there)."""
    load_categories(path)  # fail here, not silently inside the Java report generator
    alluredir.mkdir(parents=True, exist_ok=True)
    dest = alluredir / "categories.json"
    shutil.copyfile(path, dest)
    return dest


def _matches(regex: str | None, text: str | None) -> bool:
    if regex is None:
        return True
    # Allure 2 uses Pattern.compile(regex, DOTALL).matcher(text).matches(): the whole text must match.
    return text is not None and re.fullmatch(regex, text, flags=re.DOTALL) is not None


def categorize(status: str, message: str | None, trace: str | None = None,
               categories: tuple[dict[str, Any], ...] | None = None) -> list[str]:
    """Names of the categories a result with this status/message/trace belongs to (Allure 2 semantics)."""
    cats = load_categories() if categories is None else categories
    out = []
    for cat in cats:
        statuses = cat.get("matchedStatuses") or []
        if statuses and status not in statuses:
            continue
        if _matches(cat.get("messageRegex"), message) and _matches(cat.get("traceRegex"), trace):
            out.append(cat["name"])
    return out
