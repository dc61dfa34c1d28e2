"""Per-category accuracy, the stored baseline, and the regression decision.

A category regresses when its accuracy fell by more than the tolerance AND the fall is statistically significant
(one-sided two-proportion z-test at level ``alpha``): a small sample's noise alone never fails the gate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pytest_ml4.accuracy.score import ItemResult
from pytest_ml4.accuracy.stats import drop_z, wilson
from pytest_ml4.target.baselines import (
    BaselineFile,
    Provenance,
    conditions_differ,
    read_baseline,
    refusal_line,
    write_baseline,
)


@dataclass(frozen=True)
class CategoryScore:
    category: str
    n: int
    passed: int

    @property
    def accuracy(self) -> float:
        return self.passed / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.passed, self.n)

    def as_dict(self) -> dict[str, Any]:
        lo, hi = self.interval
        return {"n": self.n, "passed": self.passed, "accuracy": round(self.accuracy, 4),
                "ci95": [round(lo, 4), round(hi, 4)]}


@dataclass(frozen=True)
class Drop:
    category: str
    base: CategoryScore
    now: CategoryScore
    z: float
    p_value: float

    def describe(self) -> str:
        return (f"{self.category}: {self.now.accuracy:.1%} ({self.now.passed}/{self.now.n}) vs baseline "
                f"{self.base.accuracy:.1%} ({self.base.passed}/{self.base.n}), drop "
                f"{(self.base.accuracy - self.now.accuracy) * 100:.1f} points, z={self.z:.2f}, p={self.p_value:.3g}")


def summarize(results: Iterable[ItemResult], categories: list[str]) -> dict[str, CategoryScore]:
    counts = {c: [0, 0] for c in categories}
    for r in results:
        counts[r.category][0] += 1
        counts[r.category][1] += int(r.valid)
    return {c: CategoryScore(c, n, k) for c, (n, k) in counts.items()}


#: What a category's accuracy depends on besides the deployment; a baseline of other values is not compared.
CONDITION_KEYS = ("benchmark", "bfcl_eval", "size", "seed")
BENCHMARK = "BFCL v4 (bfcl-eval)"


def run_conditions(bfcl_eval: str, size: int | None, seed: int) -> dict[str, Any]:
    """The conditions an accuracy figure is measured under (stored with the baseline and in the summary)."""
    return {"benchmark": BENCHMARK, "bfcl_eval": bfcl_eval, "size": size, "seed": seed}


class CategoryCounts(BaseModel):
    """A category's stored counts (the accuracy and interval a recording writes beside them are derived)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    n: int
    passed: int


class AccuracyBaselineFile(BaselineFile):
    """An accuracy baseline file: ``figures`` maps each BFCL category to its counts."""

    figures: dict[str, CategoryCounts]


@dataclass(frozen=True)
class AccuracyBaseline:
    """``pytest_ml4/data/baselines/accuracy-<target>.json`` (or a team's ``baselines/``): per-category scores, their conditions and provenance
    (:mod:`pytest_ml4.target.baselines`)."""

    path: Path
    provenance: Provenance
    conditions: dict[str, Any]
    scores: dict[str, CategoryScore]

    def refusal(self, conditions: dict[str, Any]) -> str | None:
        """One line when this run's conditions differ from the baseline's, else None."""
        differ = conditions_differ(self.conditions, conditions, CONDITION_KEYS)
        return refusal_line("accuracy", self.path, differ) if differ else None


def save_baseline(path: Path, scores: dict[str, CategoryScore], target: str, conditions: dict[str, Any],
                  provenance: dict[str, Any]) -> None:
    write_baseline(path, "accuracy", target, provenance, conditions, {},
                   {c: s.as_dict() for c, s in scores.items()})


def load_baseline(path: Path) -> AccuracyBaseline:
    """An accuracy baseline (the one format, kind ``accuracy``; ``figures`` maps each category to its counts)."""
    stored = read_baseline(path, "accuracy", AccuracyBaselineFile)
    out = {cat: CategoryScore(cat, fig.n, fig.passed) for cat, fig in stored.figures.items()}
    return AccuracyBaseline(Path(path), stored.provenance.view(), stored.conditions, out)


def compare(now: dict[str, CategoryScore], base: dict[str, CategoryScore], tolerance: float,
            alpha: float) -> list[Drop]:
    """Categories (of those in both) whose accuracy fell by more than ``tolerance`` with p < ``alpha``."""
    drops: list[Drop] = []
    for cat, cur in now.items():
        ref = base.get(cat)
        if ref is None or cur.n == 0 or ref.n == 0:
            continue
        z, p = drop_z(ref.passed, ref.n, cur.passed, cur.n)
        if ref.accuracy - cur.accuracy > tolerance and p < alpha:
            drops.append(Drop(cat, ref, cur, z, p))
    return drops


def table(now: dict[str, CategoryScore], base: dict[str, CategoryScore] | None = None) -> str:
    """Plain-text per-category table (console and Allure)."""
    head = f"{'category':<24} {'n':>5} {'passed':>6} {'accuracy':>8}  {'95% Wilson':<15}"
    head += f" {'baseline':>8} {'n_base':>6}" if base else ""
    lines = [head]
    for cat, s in now.items():
        lo, hi = s.interval
        line = f"{cat:<24} {s.n:>5} {s.passed:>6} {s.accuracy:>8.1%}  [{lo:.3f}, {hi:.3f}]"
        if base:
            ref = base.get(cat)
            line += f" {ref.accuracy:>8.1%} {ref.n:>6}" if ref else f" {'-':>8} {'-':>6}"
        lines.append(line)
    return "\n".join(lines)


def failed_items(results: Iterable[ItemResult]) -> list[dict[str, Any]]:
    """Every failed item: question, expected, got and BFCL's error type (for the Allure attachment)."""
    return [asdict(r) for r in results if not r.valid]
