"""Capacity: the highest request rate whose goodput meets the floor, by a bounded bisection over aiperf runs
(repeated runs pooled per rate), the core without pytest.

Each rate is judged from pooled repeated runs with a one-sided 95 % Wilson bound on the share of good requests,
as the accuracy gate judges its pass rates (:mod:`pytest_ml4.accuracy.stats`): the rate **meets** the floor when
the lower bound is at or above it, **misses** it when the upper bound is below it, and is **inconclusive**
otherwise, after at most ``repeats`` runs. So a few unlucky requests never fail a rate, and a lucky short run never
passes one: noise alone gives "inconclusive", which the gate reports as not judged.

The gate: the target's declared ``capacity_rps`` meets the floor. The search then bisects above it (between the
last rate that met the floor and the first that missed, starting at ``CEILING_FACTOR`` x the declared rate) for at
most ``probes`` more rates, and reports the highest rate that met it: what the deployment has to spare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_ml4.accuracy.stats import wilson
from pytest_ml4.perf.gates import GateResult
from pytest_ml4.perf.goodput import Goodput

#: z of a one-sided 95 % bound (each side of the interval is a one-sided test at 5 %).
Z_ONE_SIDED_95 = 1.6448536269514722
#: The first probe above the declared capacity.
CEILING_FACTOR = 2.0

Verdict = Literal["meets", "misses", "inconclusive"]


def classify(good: int, total: int, floor: float, z: float = Z_ONE_SIDED_95) -> Verdict:
    """Whether ``good``/``total`` is significantly at or above ``floor``, significantly below it, or neither."""
    lo, hi = wilson(good, total, z)
    if total and lo >= floor:
        return "meets"
    if total and hi < floor:
        return "misses"
    return "inconclusive"


@dataclass
class RatePoint:
    """One request rate, judged from its pooled runs."""

    rate: float
    floor: float
    runs: list[Goodput] = field(default_factory=list)

    @property
    def good(self) -> int:
        return sum(r.good for r in self.runs)

    @property
    def total(self) -> int:
        return sum(r.total for r in self.runs)

    @property
    def verdict(self) -> Verdict:
        return classify(self.good, self.total, self.floor)

    def describe(self) -> str:
        lo, hi = wilson(self.good, self.total, Z_ONE_SIDED_95)
        return (f"{self.rate:g} req/s: {self.good}/{self.total} good over {len(self.runs)} run(s), one-sided 95 % "
                f"bounds {lo:.1%}..{hi:.1%} -> {self.verdict} the {self.floor:.0%} floor")

    def as_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "good": self.good, "total": self.total, "runs": len(self.runs),
                "verdict": self.verdict, "runs_detail": [r.as_dict() for r in self.runs]}


RunAt = Callable[[float], Goodput]


def measure_rate(run_at: RunAt, rate: float, floor: float, repeats: int) -> RatePoint:
    """Run ``rate`` until its pooled goodput is conclusive, at most ``repeats`` times."""
    point = RatePoint(rate, floor)
    for _ in range(max(repeats, 1)):
        point.runs.append(run_at(rate))
        if point.verdict != "inconclusive":
            break
    return point


@dataclass
class Capacity:
    declared: float
    floor: float
    points: list[RatePoint]

    @property
    def declared_point(self) -> RatePoint:
        return self.points[0]

    @property
    def highest_meeting(self) -> float | None:
        rates = [p.rate for p in self.points if p.verdict == "meets"]
        return max(rates) if rates else None

    @property
    def lowest_missing(self) -> float | None:
        rates = [p.rate for p in self.points if p.verdict == "misses"]
        return min(rates) if rates else None

    def describe(self) -> str:
        top = self.highest_meeting
        found = "no rate met it" if top is None else f"highest rate meeting it {top:g} req/s"
        miss = self.lowest_missing
        bracket = "" if miss is None else f", lowest missing {miss:g} req/s"
        return f"capacity search ({len(self.points)} rate(s)): {found}{bracket}; " + "; ".join(
            p.describe() for p in self.points)

    def as_dict(self) -> dict[str, Any]:
        return {"declared_rps": self.declared, "floor": self.floor, "highest_meeting_rps": self.highest_meeting,
                "lowest_missing_rps": self.lowest_missing, "points": [p.as_dict() for p in self.points]}


def search(run_at: RunAt, declared: float, floor: float, *, repeats: int, probes: int) -> Capacity:
    """Judge the declared rate, then bisect above it for at most ``probes`` rates (none when it did not meet)."""
    first = measure_rate(run_at, declared, floor, repeats)
    result = Capacity(declared, floor, [first])
    if first.verdict != "meets":
        return result
    lo, hi = declared, declared * CEILING_FACTOR
    rate = hi
    for _ in range(probes):
        point = measure_rate(run_at, rate, floor, repeats)
        result.points.append(point)
        if point.verdict == "meets":
            lo = rate
            if rate >= hi:
                break  # the ceiling itself meets: capacity is at least CEILING_FACTOR x the declared rate
        elif point.verdict == "misses":
            hi = rate
        else:
            break  # noise at this rate: the capacity is near it; more bisection would be judged by noise
        rate = (lo + hi) / 2
    return result


def capacity_gate(cap: Capacity, workload: str) -> GateResult | None:
    """Pass when the declared capacity meets the floor, fail when it misses it; None when inconclusive (the
    caller reports "not judged")."""
    verdict = cap.declared_point.verdict
    if verdict == "inconclusive":
        return None
    return GateResult(f"capacity:{workload}", None, verdict == "meets",
                      f"declared capacity {cap.declared:g} req/s {verdict} the goodput floor; {cap.describe()}")
