"""BFCL items as the suite sends them: prompts and tools (BFCL's own conversion), possible answers kept apart.

Loading is separate from scoring (:mod:`pytest_ml4.accuracy.score`), as in BFCL's own pipeline: the request side
never sees an answer, so nothing that answers the prompts (the simulator included) can read them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from pytest_ml4.accuracy.bfcl import Bfcl, category_specs


@dataclass(frozen=True)
class Item:
    id: str
    category: str
    #: The single turn's messages, as ``bfcl_eval.utils.load_dataset_entry`` returns them.
    messages: list[dict[str, Any]]
    #: BFCL's function documents (for the checker) and the OpenAI tools built from them (for the request).
    functions: list[dict[str, Any]]
    tools: list[dict[str, Any]]


@dataclass(frozen=True)
class Dataset:
    items: list[Item]
    #: id -> BFCL ground truth (only for ``ast`` categories); read by the scorer alone.
    answers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: category -> entries in the whole set (the sample's denominator for the report).
    totals: dict[str, int] = field(default_factory=dict)


def _tools(bfcl: Bfcl, functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return bfcl.convert_to_tool(functions, bfcl.gorilla_to_openapi, bfcl.openai_style) if functions else []


def sample_ids(ids: list[str], size: int | None, seed: int, category: str) -> list[str]:
    """``size`` ids of one category, drawn with a generator seeded by (seed, category): the same sample every
    run, independent of which other categories run; ``None`` or a size >= the category keeps them all."""
    if size is None or size >= len(ids):
        return list(ids)
    chosen = set(random.Random(f"{seed}:{category}").sample(ids, size))
    return [i for i in ids if i in chosen]


def load_dataset(bfcl: Bfcl, categories: list[str], size: int | None, seed: int) -> Dataset:
    """A stratified sample: ``size`` items per category (the statistics are per category, so each one gets the
    same number of items; a category with fewer entries runs whole)."""
    items: list[Item] = []
    answers: dict[str, list[dict[str, Any]]] = {}
    totals: dict[str, int] = {}
    specs = category_specs()
    for cat in categories:
        entries = bfcl.load_dataset_entry(cat)
        totals[cat] = len(entries)
        keep = set(sample_ids([e["id"] for e in entries], size, seed, cat))
        for e in entries:
            if e["id"] not in keep:
                continue
            items.append(Item(e["id"], cat, list(e["question"][0]), e["function"], _tools(bfcl, e["function"])))
        if specs[cat].scoring == "ast":
            answers.update({a["id"]: a["ground_truth"] for a in bfcl.load_ground_truth_entry(cat)
                            if a["id"] in keep})
    return Dataset(items, answers, totals)
