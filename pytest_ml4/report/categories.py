"""Allure ``categories.json``: how failures are grouped on the report's Categories tab.

The definitions are data (``pytest_ml4/data/report/categories.json``): gate failures, protocol violations, endpoint
unreachable, crashed test processes and test defects. :func:`categorize` applies them the way Allure 2 does
(status in ``matchedStatuses`` and the whole message matching ``messageRegex``, dot matching newlines), so the
run summary and the tests can tell which category a failure lands in without generating the HTML.
"""

from __future__ import annotations

import re
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from pytest_ml4.datafile import Strict, load_json
from pytest_ml4.locations import data_file

CATEGORIES_FILE = data_file("report", "categories.json")


def _compiles(regex: str | None) -> str | None:
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as err:
            raise ValueError(f"not a regular expression: {err}") from None
    return regex


Regex = Annotated[str | None, AfterValidator(_compiles)]


class Category(Strict):
    """One Allure category, in Allure 2's own keys (the file is copied into the results folder as it is)."""

    name: str
    description: str = ""
    matched_statuses: tuple[Literal["failed", "broken", "passed", "skipped", "unknown"], ...] = Field(
        (), alias="matchedStatuses")
    message_regex: Regex = Field(None, alias="messageRegex")
    trace_regex: Regex = Field(None, alias="traceRegex")


@lru_cache(maxsize=4)
def load_categories(path: Path = CATEGORIES_FILE) -> tuple[Category, ...]:
    """The category definitions (validated: every regex compiles, statuses are Allure's)."""
    return load_json(Path(path), tuple[Category, ...])


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
               categories: tuple[Category, ...] | None = None) -> list[str]:
    """Names of the categories a result with this status/message/trace belongs to (Allure 2 semantics)."""
    cats = load_categories() if categories is None else categories
    out = []
    for cat in cats:
        if cat.matched_statuses and status not in cat.matched_statuses:
            continue
        if _matches(cat.message_regex, message) and _matches(cat.trace_regex, trace):
            out.append(cat.name)
    return out
