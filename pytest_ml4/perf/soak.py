"""Soak: the functional probes kept going beside a steady production-rate load for a stated time
(``--ml4-soak DURATION``, for nightly runs), the violations reported over time. The core without pytest.

The load is the target's ``chat`` workload at its production rate (Poisson), ``rate x duration`` requests, run by the
perf suite's :class:`~pytest_ml4.perf.workloads.WorkloadRunner` (so the probes ride it as they ride every phase);
:func:`soak_buckets` counts the probes and their violations per time bucket and :func:`write_soak_plot` draws them
beside the perf plots, so a defect that appears only after a while (a leak, a cache filling up) shows where it began.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pytest_ml4.perf.probes import PhaseProbes

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
SOAK_PLOT = "soak-probes.png"


def parse_duration(raw: str) -> float:
    """``"90"``, ``"90s"``, ``"15m"``, ``"2h"`` -> seconds; anything else (or 0) is a ValueError saying the form."""
    m = _DURATION.match(str(raw))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"expected a duration such as 30s, 15m or 2h, got {raw!r}")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass(frozen=True)
class Bucket:
    start_s: float
    probes: int
    violations: int

    def describe(self, width_s: float) -> str:
        return f"{self.start_s:6.0f}-{self.start_s + width_s:.0f} s: {self.probes} probe(s), {self.violations} violation(s)"


def bucket_width(duration_s: float) -> float:
    """About ten buckets over the soak, at least one second each."""
    return max(duration_s / 10.0, 1.0)


def soak_buckets(found: PhaseProbes, duration_s: float) -> list[Bucket]:
    """Probes and violations per bucket of the soak (by when each probe was sent)."""
    width = bucket_width(duration_s)
    n = max(int(-(-duration_s // width)), 1)
    counts = [[0, 0] for _ in range(n)]
    for r in found.judged:
        i = min(int(r.at_s // width), n - 1)
        counts[i][0] += 1
        counts[i][1] += bool(r.violation)
    return [Bucket(i * width, p, v) for i, (p, v) in enumerate(counts)]


def write_soak_plot(found: PhaseProbes, duration_s: float, path: Path, title: str) -> Path:
    """Each probe as a point in time (green: passed its verdict, red: violated it), and the violations per bucket."""
    from pytest_ml4.perf.plots import pyplot, write_png

    plt = pyplot()

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    ok = [r.at_s for r in found.judged if not r.violation]
    bad = [r.at_s for r in found.judged if r.violation]
    top.scatter(ok, [1] * len(ok), color="green", marker="o", label=f"passed ({len(ok)})")
    top.scatter(bad, [0] * len(bad), color="red", marker="x", label=f"violated ({len(bad)})")
    top.set_yticks([0, 1], ["violated", "passed"])
    top.legend(loc="center right", fontsize=8)
    buckets = soak_buckets(found, duration_s)
    width = bucket_width(duration_s)
    bottom.bar([b.start_s for b in buckets], [b.violations for b in buckets], width=width * 0.9, align="edge",
               color="red", label="violations")
    bottom.bar([b.start_s for b in buckets], [b.probes - b.violations for b in buckets], width=width * 0.9,
               align="edge", bottom=[b.violations for b in buckets], color="green", alpha=0.5, label="passed")
    bottom.set_xlabel("seconds into the soak")
    bottom.set_ylabel("probes per bucket")
    bottom.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"{title}: {len(bad)} of {len(found.judged)} probe answers violated their verdict")
    fig.tight_layout()
    return write_png(fig, path)
