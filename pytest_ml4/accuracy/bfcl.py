"""Loader for BFCL (``bfcl-eval``, installed by ``scripts/install.d/70-bfcl.sh``): its data and its own checker.

Only this module imports ``bfcl_eval``. The package is installed without its dependencies; its one heavy import,
``bfcl_eval.constants.model_config`` (every vendor SDK), is used by the checker only to decide whether ``.`` in a
function name became ``_`` (shared/reference/bfcl.md "Checker"), so a stub module with that one answer is put in
``sys.modules`` before the checker is imported. The same goes for BFCL's Java/JavaScript prompt-output parsers
(they need tree-sitter binaries): the suite reads ``tool_calls``, never parses prompt-mode text. ``BFCL_PROJECT_ROOT`` must point at a writable folder before the
first import (``bfcl_eval.utils`` creates ``result/``, ``score/``, ``.file_locks/`` there), so the first
:func:`load` of a process fixes it.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.runtime.installed import bfcl_site

CATEGORIES_FILE = data_file("accuracy", "categories.yaml")
#: The name the checker is told; the stub maps every name to ``underscore_to_dot=True`` because the tools are
#: converted for an OpenAI-style endpoint (``convert_to_tool`` with ``ModelStyle.OPENAI_COMPLETIONS``).
CHECKER_MODEL = "pytest-ml4"


class CategoryError(ValueError):
    """An unknown BFCL category; the message lists the known ones."""


class CategorySpec(Strict):
    """How a category is scored; ``name`` is the row's key."""

    name: str = Field("", exclude=True)
    #: ``ast`` (BFCL's ast_checker), ``no_call`` (irrelevance) or ``any_call`` (live_relevance).
    scoring: Literal["ast", "no_call", "any_call"]


class CategoriesTable(Strict):
    categories: dict[str, CategorySpec]


@lru_cache(maxsize=2)
def category_specs(path: Path = CATEGORIES_FILE) -> dict[str, CategorySpec]:
    rows = load_yaml(path, CategoriesTable).categories
    return {name: spec.model_copy(update={"name": name}) for name, spec in rows.items()}


def resolve_categories(names: list[str] | None) -> list[str]:
    """The categories to run (all known ones when ``names`` is empty); an unknown name lists the known ones."""
    known = category_specs()
    if not names:
        return list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CategoryError(f"unknown BFCL categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                            f"known: {', '.join(known)}")
    return list(dict.fromkeys(names))


class _AnyModel(dict):  # type: ignore[type-arg]
    """``MODEL_CONFIG_MAPPING`` stand-in: every model name answers ``underscore_to_dot=True``."""

    def __missing__(self, key: str) -> Any:
        return types.SimpleNamespace(underscore_to_dot=True, is_fc_model=True)


def _prompt_mode_parser(*_args: Any, **_kwargs: Any) -> Any:
    """In place of BFCL's Java/JS parsers of prompt-mode answers (tree-sitter, not installed): the suite scores
    the deployment's ``tool_calls`` (function-calling mode), so reaching one is a wrong code path, said as such."""
    raise RuntimeError("BFCL prompt-mode parsing reached: pytest-ml4 scores tool_calls (function-calling mode) only")


def _stubs() -> dict[str, dict[str, Any]]:
    """Modules replaced before import: what of them the suite's code path touches, and nothing else."""
    return {
        "bfcl_eval.constants.model_config": {"MODEL_CONFIG_MAPPING": _AnyModel()},
        "bfcl_eval.model_handler.parser.java_parser": {"parse_java_function_call": _prompt_mode_parser},
        "bfcl_eval.model_handler.parser.js_parser": {"parse_javascript_function_call": _prompt_mode_parser},
    }


@dataclass(frozen=True)
class Bfcl:
    """The handful of bfcl_eval functions the accuracy suite uses."""

    load_dataset_entry: Any
    load_ground_truth_entry: Any
    convert_to_tool: Any
    gorilla_to_openapi: Any
    openai_style: Any
    ast_checker: Any
    language_python: Any
    version: str


def load(project_root: Path) -> Bfcl:
    """Import bfcl_eval from its install folder (ToolMissing names the install step when it is not there)."""
    site = str(bfcl_site())
    if site not in sys.path:
        # Appended, not prepended: the project's own packages win over the copies installed beside bfcl-eval.
        sys.path.append(site)
    if "bfcl_eval.constants.eval_config" not in sys.modules:
        project_root.mkdir(parents=True, exist_ok=True)
        os.environ["BFCL_PROJECT_ROOT"] = str(project_root)
    for name, attrs in _stubs().items():
        stub = types.ModuleType(name)
        stub.__dict__.update(attrs)
        sys.modules.setdefault(name, stub)
    from bfcl_eval.constants.enums import Language, ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.model_handler.utils import convert_to_tool
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    from pytest_ml4.runtime.installed import BFCL_VERSION

    return Bfcl(load_dataset_entry, load_ground_truth_entry, convert_to_tool, GORILLA_TO_OPENAPI,
                ModelStyle.OPENAI_COMPLETIONS, ast_checker, Language.PYTHON, BFCL_VERSION)
