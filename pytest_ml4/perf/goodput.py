"""Goodput under SLOs at the production request rate, the core without pytest.

A workload of the target (``perf.workloads``: ``chat`` single-turn, ``sessions`` multi-turn with a shared system
prompt) is sent at its production ``request_rate`` with Poisson arrivals; aiperf's own ``--goodput`` counts the
requests that met every SLO of the workload (TTFT, ITL, end-to-end; aiperf.md §4.6: ``good_request_count``,
``good_request_fraction``). The gate: that share is at least ``perf.goodput_floor``. A failed request is never good.

The per-request values (``profile_export.jsonl``) feed the plot: each latency's distribution against its SLO line,
so a reader sees at a glance whether the tail or the bulk crosses it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_ml4.perf.export import ProfileExport, RequestRecord
from pytest_ml4.perf.gates import GateResult
from pytest_ml4.perf.runner import AiperfSpec
from pytest_ml4.target.model import Slo, Target, Workload

#: Open-loop runs: the cap on requests in flight, far above what any production rate here needs, so the Poisson
#: arrivals are never held back by it (a capped client would hide a slow deployment behind a slower schedule).
CONCURRENCY_CAP = 256
#: Short CI profile: requests per goodput run (sessions: as many whole conversations as fit).
SHORT_REQUESTS = 40
#: The three SLO'd latencies: (SLO field, aiperf metric tag, unit factor from aiperf's ms to the SLO's unit, label).
LATENCIES: tuple[tuple[str, str, float, str], ...] = (
    ("ttft_p99_s", "time_to_first_token", 1e-3, "TTFT (s)"),
    ("itl_p99_ms", "inter_token_latency", 1.0, "ITL (ms)"),
    ("e2e_p99_s", "request_latency", 1e-3, "end-to-end (s)"),
)


class GoodputMissing(LookupError):
    """The export has no goodput figures (aiperf ran without ``--goodput`` or computed none)."""


def request_count(workload: Workload, duration_s: float, short: bool) -> int:
    """Requests of one run: ``SHORT_REQUESTS`` in the CI profile, else the production rate over the duration;
    whole conversations for multi-turn workloads."""
    n = SHORT_REQUESTS if short else max(round(workload.request_rate * duration_s), SHORT_REQUESTS)
    return max(n // workload.turns, 1) * workload.turns


def workload_spec(target: Target, name: str, *, model: str, url: str, rate: float, requests: int,
                  metrics_url: str | None = None, aiperf_env: dict[str, str] | None = None) -> AiperfSpec:
    """The aiperf run of workload ``name`` at ``rate`` requests/s, Poisson, with the workload's SLOs as goodput."""
    w = target.perf.workloads[name]
    return AiperfSpec(model=model, url=url, concurrency=CONCURRENCY_CAP, isl=w.isl, osl=w.osl, duration_s=None,
                      request_count=requests, min_tokens=w.osl, server_metrics_url=metrics_url,
                      request_rate=rate, goodput=w.slo.aiperf_goodput(), turns=w.turns,
                      conversations=requests // w.turns if w.turns > 1 else None,
                      system_prompt_tokens=w.system_prompt_tokens, aiperf_env=dict(aiperf_env or {}))


@dataclass(frozen=True)
class Goodput:
    """One run's goodput: ``good`` of ``total`` requests met every SLO (failed requests count in ``total``)."""

    workload: str
    rate: float
    good: int
    total: int
    floor: float
    p99: dict[str, float | None]     # measured p99 per SLO field, in the SLO's unit

    @property
    def fraction(self) -> float:
        return self.good / self.total if self.total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fraction": self.fraction}


def goodput_of(export: ProfileExport, workload: str, rate: float, slo: Slo, floor: float) -> Goodput:
    """aiperf's goodput figures of one run; :class:`GoodputMissing` when it wrote none."""
    good = export.scalar("good_request_count")
    ok = export.request_count
    if ok is None:
        raise GoodputMissing("request_count missing from the aiperf summary: no request completed")
    if good is None:
        # aiperf omits good_request_count when no request was good but still reports the fraction.
        frac = export.scalar("good_request_fraction")
        if frac is None:
            raise GoodputMissing("good_request_count missing from the aiperf summary: aiperf ran without "
                                 "--goodput or computed no goodput")
        good = round(frac * ok)
    p99 = {field: _scaled(export.stat(tag, "p99"), factor) for field, tag, factor, _ in LATENCIES}
    return Goodput(workload, rate, int(good), ok + export.error_request_count, floor, p99)


def _scaled(v: float | None, factor: float) -> float | None:
    return None if v is None else v * factor


def slo_text(slo: Slo) -> str:
    return f"TTFT <= {slo.ttft_p99_s:g} s, ITL <= {slo.itl_p99_ms:g} ms, end-to-end <= {slo.e2e_p99_s:g} s"


def goodput_gate(g: Goodput, slo: Slo) -> GateResult:
    """Pass when the share of requests meeting every SLO is at least the floor."""
    measured = ", ".join(f"{label.split(' ')[0]} p99 {_fmt(g.p99[field])}" for field, _, _, label in LATENCIES)
    ok = g.total > 0 and g.fraction >= g.floor - 1e-12
    detail = (f"goodput {g.good}/{g.total} = {g.fraction:.1%} of {g.workload} requests met every SLO ({slo_text(slo)}) "
              f"at {g.rate:g} req/s Poisson; floor {g.floor:.0%}; measured {measured}")
    return GateResult(f"goodput:{g.workload}", None, ok, detail)


def _fmt(v: float | None) -> str:
    return "absent" if v is None else f"{v:.3g}"


def latency_values(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """Per-request TTFT, ITL and end-to-end latency of the successful records, in the SLO's units."""
    out: dict[str, list[float]] = {field: [] for field, _, _, _ in LATENCIES}
    for r in records:
        if not r.ok:
            continue
        for field, tag, factor, _ in LATENCIES:
            v = r.value(tag)
            if isinstance(v, (int, float)) and math.isfinite(v):
                out[field].append(float(v) * factor)
    return out


def count_good(records: Sequence[RequestRecord], slo: Slo) -> int:
    """Requests meeting every SLO, counted from the per-request values (a cross-check of aiperf's count)."""
    n = 0
    for r in records:
        if not r.ok:
            continue
        vals = {field: r.value(tag) for field, tag, _, _ in LATENCIES}
        if any(not isinstance(v, (int, float)) for v in vals.values()):
            continue
        if all(vals[field] * factor <= getattr(slo, field) for field, _, factor, _ in LATENCIES):
            n += 1
    return n


def write_goodput_plot(records: Sequence[RequestRecord], slo: Slo, g: Goodput, path: Path, title: str) -> Path:
    """Empirical CDFs of TTFT, ITL and end-to-end latency, each with its SLO as a red line and the floor as a
    dotted level: a curve crossing its SLO line below the floor is a failed goodput gate."""
    from pytest_ml4.perf.plots import pyplot, write_png

    plt = pyplot()

    values = latency_values(records)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (field, _, _, label) in zip(axes, LATENCIES, strict=True):
        xs = sorted(values[field])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label="requests")
        limit = getattr(slo, field)
        ax.axvline(limit, color="red", linestyle="--", label=f"SLO {limit:g}")
        ax.axhline(g.floor, color="grey", linestyle=":", label=f"floor {g.floor:.0%}")
        ax.set_xlabel(label)
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0].set_ylabel("share of requests")
    verdict = "meets" if g.fraction >= g.floor else "MISSES"
    fig.suptitle(f"{title}: goodput {g.fraction:.1%} {verdict} the {g.floor:.0%} floor at {g.rate:g} req/s")
    fig.tight_layout()
    return write_png(fig, path)
