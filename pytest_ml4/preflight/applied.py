"""Which rules a lint run could apply, and for the rest why not and what would apply them.

A rule is applied to a document of its kinds when the document has what the rule needs
(``pytest_ml4/data/preflight/rule_needs.yaml``: its hardware, its target). A rule applied to no document is no pass:
it is reported "not applied" with the reason and the flag (``--target NAME``) that would apply it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator

from pytest_ml4.datafile import load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.preflight.model import (
    DgdDocument,
    Document,
    LiteLLMConfig,
    PerfRun,
    Rule,
    VllmLaunch,
)
from pytest_ml4.target.hardware import has_memory_model, no_memory_calibration
from pytest_ml4.target.model import known_targets

NEEDS_FILE = data_file("preflight", "rule_needs.yaml")

#: The document classes a rule kind stands for.
KIND_CLASSES: dict[str, type[Document]] = {"vllm": VllmLaunch, "dgd": DgdDocument, "litellm": LiteLLMConfig,
                                           "perf": PerfRun}

@dataclass(frozen=True)
class Need:
    """What a rule needs of a document: whether the document has it, why not, and what would give it."""

    has: Callable[[Document], bool]
    #: Why not; a callable gives the reason for the first document lacking the need (e.g. naming its family).
    reason: str | Callable[[Document], str]
    #: Whether naming a target (``--target``, ``# ml4-target:``) would meet the need.
    a_target_meets_it: bool = False


def _family_only(family: str, name: str) -> Need:
    """The rule was measured on one GPU family: on another known family it cannot judge (unknown: the "hardware"
    need says so), and no flag would change the document's hardware."""
    return Need(lambda d: d.hardware.family in (None, family),
                f"{name} hardware only; the document runs on other hardware")


#: need -> Need; the names are what pytest_ml4/data/preflight/rule_needs.yaml lists.
NEEDS: dict[str, Need] = {
    "hardware": Need(lambda d: d.hardware.family is not None, "depends on the hardware, which is unknown", True),
    "target": Need(lambda d: d.target is not None,
                   "needs the target's hardware spec and engine defaults, and no target is known", True),
    "rtxpro-hardware": _family_only("rtxpro", "RTX PRO 6000"),
    "vr200-hardware": _family_only("vr200", "VR200"),
    # The memory model is calibrated or estimated per family (pytest_ml4/data/hardware/families.yaml).
    "memory-model": Need(lambda d: d.hardware.family is None or has_memory_model(d.hardware.family),
                         lambda d: no_memory_calibration(d.hardware.family)),
}


@dataclass(frozen=True)
class NotApplied:
    """A rule that judged none (``paths`` empty: no document of its kinds) or only some of the documents."""

    rule_id: str
    reason: str
    paths: tuple[str, ...] = ()
    flag: str | None = None
    judged: int = 0  # documents of its kinds it did judge

    def format(self) -> str:
        where = f" on {', '.join(self.paths)}" if self.paths else ""
        how = f"; {self.flag}" if self.flag else ""
        return f"not applied: {self.rule_id}{where}: {self.reason}{how}"

    def as_dict(self) -> dict[str, object]:
        return {"rule": self.rule_id, "reason": self.reason, "paths": list(self.paths), "flag": self.flag,
                "judged": self.judged}


def grouped(items: Iterable[NotApplied]) -> list[str]:
    """One line per (reason, files, flag), naming the rules it holds for: short enough to read in a terminal."""
    groups: dict[tuple[str, tuple[str, ...], str | None], list[str]] = {}
    for n in items:
        groups.setdefault((n.reason, n.paths, n.flag), []).append(n.rule_id)
    lines = []
    for (reason, paths, flag), ids in groups.items():
        where = f" to {', '.join(paths)}" if paths else ""
        how = f"; {flag}" if flag else ""
        lines.append(f"not applied{where} ({reason}{how}): {', '.join(ids)}")
    return lines


def _known_need(name: str) -> str:
    if name not in NEEDS:
        raise ValueError(f"unknown need; known: {', '.join(sorted(NEEDS))}")
    return name


@cache
def rule_needs(path: Path = NEEDS_FILE) -> dict[str, tuple[str, ...]]:
    """rule id -> its needs, from the table; an unknown need is an error naming the file, the rule and the line."""
    rows = load_yaml(path, dict[str, tuple[Annotated[str, AfterValidator(_known_need)], ...] | None])
    return {rule_id: needs or () for rule_id, needs in rows.items()}


def of_kinds(rule: Rule, documents: Iterable[Document]) -> list[Document]:
    """The documents a rule looks at by its kinds."""
    classes = tuple(KIND_CLASSES[k] for k in rule.kinds if k in KIND_CLASSES)
    return [d for d in documents if isinstance(d, classes)]


def _flag() -> str:
    return (f"pass --target NAME (known: {', '.join(known_targets())}) or put '# ml4-target: NAME' in the file "
            "to apply it")


def not_applied(rule: Rule, documents: list[Document], found_any: bool) -> NotApplied | None:
    """Why ``rule`` judged none or only some of ``documents``; None when it judged every one of its kinds."""
    mine = of_kinds(rule, documents)
    if not mine:
        if found_any:  # e.g. config-parse on an unreadable file: it did judge something
            return None
        kinds = ", ".join(rule.kinds)
        return NotApplied(rule.id, f"no document of their kinds among the files: {kinds}")
    lacking: dict[str, list[str]] = {}  # need -> paths of the documents it could not judge for want of it
    for name in rule_needs().get(rule.id, ()):
        for d in mine:
            if not NEEDS[name].has(d) and not any(d.path in paths for paths in lacking.values()):
                lacking.setdefault(name, []).append(d.path)
    if not lacking:
        return None
    name, paths = next(iter(lacking.items()))
    judged = sum(1 for d in mine if d.path not in {p for ps in lacking.values() for p in ps})
    need = NEEDS[name]
    first = next(d for d in mine if d.path == paths[0])
    reason = need.reason(first) if callable(need.reason) else need.reason
    return NotApplied(rule.id, reason, tuple(paths), _flag() if need.a_target_meets_it else None, judged)
