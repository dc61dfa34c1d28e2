"""KV cache verdicts after boot: an engine's log (and its /metrics where exposed) against a target's gates.

The suite (``suites/test_kv_cache.py``) calls the ``assert_*`` functions: each raises AssertionError with the
message a release manager reads, or NotJudged where a cross-check could not run, and reports the judged log lines
and figures whether the verdict holds or not. The ``*_verdict`` functions under them return a :class:`Verdict`
whose message quotes the log line(s) judged, so a failed check reads like the seed's own diagnosis ("GPU KV cache
size: 272,636 tokens ..."; "MemoryError: CUDA out of memory. Tried to allocate 792.00 MiB ..."); the tests on
recorded logs call those. What is judged (the short load, the /metrics scrapes) is :mod:`pytest_ml4.evidence.kv_load`.
Nothing here needs pytest.

Rates measured over few speculative drafts are noisy, so range checks on acceptance allow three standard errors
of the measurement before calling a value out of range.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_ml4.accuracy.stats import wilson
from pytest_ml4.checks.codes import fails_with, require
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.evidence.kv_load import LoadResult, MetricsRead, SpecCounts
from pytest_ml4.logs.events import (
    EngineFailure,
    KvCacheSize,
    LogEvent,
    LogView,
    SpecDecodeMetrics,
    StatsLine,
    quote,
)
from pytest_ml4.report.redact import redact
from pytest_ml4.stacks import stack_for
from pytest_ml4.target.model import Target

#: Standard errors a measured mean acceptance length may lie outside its range before it counts as outside.
Z_TOLERANCE = 3.0
#: Per-position acceptance is a binomial rate: it is outside its range when the one-sided 99 % Wilson bound on the
#: near side lies beyond the range (significantly below the floor at the 1 % level). z = 3 on a normal stderr let
#: 0.42 over 60 drafts pass a 0.61 floor; 99 % (not 95 %) because seed 000's own stable windows
#: aggregate to 0.568 over 500 drafts at position 2, whose 95 % bound (0.604) would already fail the seed's floor.
Z_RATE_ONE_SIDED = 2.326
#: Fewer drafts than this cannot show a rate 0.1 under the floor (0.51 vs 0.61 needs ~135 at 99 %): too few to judge.
MIN_SPEC_DRAFTS = 150


@dataclass
class Verdict:
    """The outcome of one check: ``ok``, a message quoting what was judged, the judged events and the figures."""

    name: str
    ok: bool
    message: str
    judged: list[LogEvent] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    #: Why an ``ok`` verdict could not judge everything it exists for ("" when it could): the check is then not
    #: judged, never passed.
    undecided: str = ""
    #: The verdict's code when it is not its name's (:data:`VERDICT_CODES`): another failure of the property itself
    #: (a pool that disagrees with /metrics, a context that differs).
    own_code: str = ""
    #: The verdict code when it failed for want of evidence rather than on what it judges.
    missing: str = ""

    @property
    def code(self) -> str:
        return self.missing or self.own_code or VERDICT_CODES[self.name]


#: The code each verdict fails with (declared on :func:`assert_holds`, which raises it), by verdict name.
VERDICT_CODES = {"kv_pool": "kv.pool_short", "kv_max_concurrency": "kv.max_concurrency_short",
                 "kv_peak_usage": "kv.peak_usage_over_limit", "no_failures": "kv.engine_failure",
                 "spec_decode": "kv.spec_acceptance"}


def root_causes_first(events: Sequence[LogEvent]) -> list[LogEvent]:
    """Failure events with the causes (OOM, refusal, no KV memory) before the consequences (engine death)."""
    return sorted(events, key=lambda e: (isinstance(e, EngineFailure), e.position))


def _failure_context(view: LogView) -> str:
    failures = root_causes_first(view.failures())
    if failures:
        return f"\nfailure lines since the last boot of {view.source}:\n{quote(failures)}"
    return f"\nlast lines of {view.source}:\n{view.tail(15)}"


def _kv_size(view: LogView, name: str, key: str = "tokens") -> KvCacheSize | Verdict:
    """The KV line to judge: with several engines in the log (Dynamo workers), the weakest one."""
    sizes = view.all(KvCacheSize)
    size = min(sizes, key=lambda s: (getattr(s, key) is not None, getattr(s, key) or 0)) if sizes else None
    if size is None:
        return Verdict(name, False, f"no 'GPU KV cache size' line since the last boot of {view.source}: the engine "
                                    f"never finished sizing its KV cache{_failure_context(view)}",
                       judged=view.failures(), own_code="kv.no_pool_line")
    return size


def required_pool(target: Target) -> tuple[int, str]:
    """The KV pool the target needs, and where the number comes from."""
    g, eng = target.gates, target.engine
    if g.kv_pool_tokens_min is not None:
        return g.kv_pool_tokens_min, "gates.kv_pool_tokens_min"
    need = math.ceil(eng.max_model_len * g.kv_max_concurrency_min)
    return need, "engine.max_model_len x gates.kv_max_concurrency_min"


def cache_info_problems(size: KvCacheSize, target: Target, labels: Mapping[str, str]) -> list[str]:
    """Disagreements between the log's KV line, ``vllm:cache_config_info`` and the target's engine flags."""
    eng = target.engine
    problems: list[str] = []
    tokens_label = labels.get("kv_cache_size_tokens", "None")
    if tokens_label.isdigit() and int(tokens_label) != size.tokens:
        problems.append(f"cache_config_info kv_cache_size_tokens={tokens_label} but the log says {size.tokens:,}")
    blocks, block = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    if blocks.isdigit() and block.isdigit() and int(blocks) * int(block) < size.tokens - int(block):
        problems.append(f"cache_config_info num_gpu_blocks={blocks} x block_size={block} = "
                        f"{int(blocks) * int(block):,} tokens, fewer than the log's {size.tokens:,}")
    util = labels.get("gpu_memory_utilization", "")
    if re.fullmatch(r"[\d.]+", util) and not math.isclose(float(util), eng.gpu_memory_utilization):
        problems.append(f"the engine runs gpu_memory_utilization={util}, the target says "
                        f"{eng.gpu_memory_utilization}")
    dtype = labels.get("cache_dtype")
    if dtype is not None and dtype != eng.kv_cache_dtype:
        problems.append(f"the engine runs cache_dtype={dtype}, the target says {eng.kv_cache_dtype}")
    return problems


def kv_pool_verdict(view: LogView, target: Target, cache_info: Mapping[str, str] | None = None) -> Verdict:
    """The KV pool of the current boot holds the target's requirement (seed 000 open item 1: >= 256,000)."""
    name = "kv_pool"
    size = _kv_size(view, name)
    if isinstance(size, Verdict):
        return size
    need, source = required_pool(target)
    ok = size.tokens >= need
    code = "" if ok else "kv.pool_short"
    lines = [f"KV pool {size.tokens:,} tokens {'>=' if ok else '<'} required {need:,} ({source})",
             f"judged: {size.quote}"]
    figures: dict[str, Any] = {"kv_pool_tokens": size.tokens, "required_tokens": need}
    if cache_info is None:
        lines.append("cross-check: vllm:cache_config_info not exposed at the metrics URL")
    else:
        problems = cache_info_problems(size, target, cache_info)
        figures["cache_config_info"] = {k: cache_info.get(k) for k in (
            "num_gpu_blocks", "block_size", "gpu_memory_utilization", "cache_dtype", "kv_cache_size_tokens")}
        lines.append("cross-check with vllm:cache_config_info: " + ("; ".join(problems) if problems else "agrees"))
        code = code or ("kv.pool_disagrees_with_metrics" if problems else "")
        ok = ok and not problems
    return Verdict(name, ok, "\n".join(lines), judged=[size], figures=figures, own_code=code)


def max_concurrency_verdict(view: LogView, target: Target) -> Verdict:
    """Maximum concurrency at the target's max_model_len is at least ``gates.kv_max_concurrency_min``."""
    name = "kv_max_concurrency"
    size = _kv_size(view, name, key="max_concurrency")
    if isinstance(size, Verdict):
        return size
    want, mml = target.gates.kv_max_concurrency_min, target.engine.max_model_len
    problems = []
    code = ""
    if size.max_concurrency is None:
        problems.append("the KV line carries no 'Maximum concurrency' figure")
    elif size.max_concurrency < want:
        problems.append(f"maximum concurrency {size.max_concurrency:.2f}x < {want:.2f}x "
                        "(gates.kv_max_concurrency_min)")
        code = "kv.max_concurrency_short"
    if size.max_model_len is not None and size.max_model_len != mml:
        problems.append(f"the engine runs max_model_len {size.max_model_len:,}, the target says {mml:,}")
    code = code or ("kv.max_model_len_differs" if problems else "")
    conc = "?" if size.max_concurrency is None else f"{size.max_concurrency:.2f}x"
    head = (f"maximum concurrency {conc} at {mml:,} tokens per request (need >= {want:.2f}x)" if not problems
            else "; ".join(problems))
    return Verdict(name, not problems, f"{head}\njudged: {size.quote}", judged=[size],
                   figures={"max_concurrency": size.max_concurrency, "max_model_len": size.max_model_len}, own_code=code)


def no_failures_verdict(view: LogView) -> Verdict:
    """No OOM, start-up refusal, KV shortage or engine death since the last boot."""
    failures = root_causes_first(view.failures())
    if not failures:
        return Verdict("no_failures", True, f"no OOM or engine-death line since the last boot of {view.source} "
                                            f"({len(view.records)} lines read)")
    kinds = sorted({f.signature for f in failures})
    return Verdict("no_failures", False,
                   f"{failures[0].line.splitlines()[0]}\n{len(failures)} failure line(s) since the last boot of "
                   f"{view.source} ({', '.join(kinds)}):\n{quote(failures)}", judged=failures)


def peak_usage_verdict(view: LogView, target: Target, metric_peak_pct: float | None) -> Verdict:
    """Peak KV usage (periodic stats lines and /metrics samples) stays under ``gates.kv_usage_pct_max``."""
    limit = target.gates.kv_usage_pct_max
    gauge = stack_for(target).engine_metric("kv_cache_usage")
    stats = view.all(StatsLine)
    top = max(stats, key=lambda s: s.kv_usage_pct) if stats else None
    sources = []
    if top is not None:
        sources.append(f"stats lines: {top.kv_usage_pct:.1f}% (max of {len(stats)})")
    if metric_peak_pct is not None:
        sources.append(f"{gauge}: {metric_peak_pct:.1f}%")
    if not sources:
        return Verdict("kv_peak_usage", False, "no KV usage to judge: no stats line since the last boot of "
                                               f"{view.source} and no {gauge} samples"
                                               f"{_failure_context(view)}", judged=view.failures(),
                       own_code="kv.usage_unknown")
    peak = max(([top.kv_usage_pct] if top else []) + ([] if metric_peak_pct is None else [metric_peak_pct]))
    ok = peak < limit
    msg = f"peak KV usage {peak:.1f}% {'<' if ok else '>='} {limit:.1f}% (gates.kv_usage_pct_max); " + "; ".join(sources)
    if top is not None:
        msg += f"\njudged: {top.quote}"
    return Verdict("kv_peak_usage", ok, msg, judged=[top] if top else [],
                   figures={"peak_pct": peak, "stats_lines": len(stats), "metric_peak_pct": metric_peak_pct},
                   own_code="" if ok else "kv.peak_usage_over_limit")


def _within(value: float, lo: float, hi: float, stderr: float) -> bool:
    slack = Z_TOLERANCE * stderr
    return value + slack >= lo and value - slack <= hi


def _rate_within(rate: float, drafts: float, lo: float, hi: float) -> bool:
    """Not significantly outside [lo, hi]: the one-sided 99 % Wilson bound towards the range reaches it."""
    low, high = wilson(round(rate * drafts), round(drafts), Z_RATE_ONE_SIDED)
    return high >= lo and low <= hi


def _spec_from_lines(windows: Sequence[SpecDecodeMetrics]) -> SpecCounts | None:
    drafts = accepted = 0.0
    per_pos: list[float] = []
    for w in windows:
        k = len(w.per_position)
        if not k or not w.drafted:
            continue
        n = w.drafted / k
        drafts += n
        accepted += w.accepted
        per_pos = [a + r * n for a, r in zip(per_pos or [0.0] * k, w.per_position)]
    return SpecCounts(drafts, accepted, tuple(per_pos)) if drafts else None


def spec_decode_verdict(view: LogView, target: Target, from_metrics: SpecCounts | None = None) -> Verdict:
    """Mean acceptance length and per-position acceptance (log windows and /metrics) within the target's ranges."""
    g = target.gates
    spec = target.engine.speculative
    k = spec.num_speculative_tokens if spec else 0
    windows = view.all(SpecDecodeMetrics)
    sources = {"SpecDecoding lines": _spec_from_lines(windows), "spec_decode counters": from_metrics}
    problems: list[str] = []
    judged: list[LogEvent] = []
    figures: dict[str, Any] = {}
    rated: list[str] = []
    for label, counts in sources.items():
        if counts is None or not counts.drafts:
            continue
        figures[label] = {"drafts": counts.drafts, "mean_acceptance_length": round(counts.mean_acceptance_length, 3),
                          "per_position": [round(r, 3) for r in counts.per_position]}
        if g.spec_acceptance_length:
            lo, hi = g.spec_acceptance_length
            mal = counts.mean_acceptance_length
            if not _within(mal, lo, hi, (k / 2) / math.sqrt(counts.drafts)):
                problems.append(f"{label}: mean acceptance length {mal:.2f} outside [{lo}, {hi}] "
                                f"over {counts.drafts:.0f} drafts")
        # A rate outside the range by the one-sided bound fails at any number of drafts (the bound is wide when
        # they are few); a pass needs MIN_SPEC_DRAFTS in one source (e.g. log windows that cover only part of
        # the load give fewer), else per-position acceptance is not judged.
        if g.spec_position_rate:
            lo, hi = g.spec_position_rate
            if counts.drafts >= MIN_SPEC_DRAFTS:
                rated.append(label)
            for pos, rate in enumerate(counts.per_position):
                if not _rate_within(rate, counts.drafts, lo, hi):
                    problems.append(f"{label}: position {pos} acceptance {rate:.3f} outside [{lo}, {hi}] "
                                    f"over {counts.drafts:.0f} drafts")
    # Too few drafts leave per-position acceptance unjudged: not judged (never passed), or said beside a failure.
    too_few = ""
    if g.spec_position_rate and figures and not rated:
        too_few = (f"too few drafts to judge per-position acceptance against {list(g.spec_position_rate)}: "
                   + ", ".join(f"{label} {f['drafts']:.0f}" for label, f in figures.items())
                   + f" (at least {MIN_SPEC_DRAFTS} in one source)")
    if g.spec_acceptance_length and windows:
        lo, hi = g.spec_acceptance_length
        for w in windows:
            n = w.drafted / max(len(w.per_position), 1)
            if n and not _within(w.mean_acceptance_length, lo, hi, (k / 2) / math.sqrt(n)):
                problems.append(f"window mean acceptance length {w.mean_acceptance_length:.2f} outside [{lo}, {hi}]")
                judged.append(w)
    if not figures:
        return Verdict("spec_decode", False, f"speculative decoding ({spec.method if spec else '?'}, k={k}) is "
                                             "configured but there is no SpecDecoding metrics line since the last "
                                             f"boot of {view.source} and no spec_decode counters moved"
                                             f"{_failure_context(view)}", judged=view.failures(),
                       missing="kv.spec_not_running")
    shown = judged or windows[-3:]
    ranges = f"ranges: mean length {g.spec_acceptance_length}, per position {g.spec_position_rate}"
    body = "; ".join(problems + ([too_few] if too_few and problems else [])) if problems else (
        "acceptance length within range" if too_few else "acceptance within range")
    msg = f"{body} ({ranges}); measured {figures}"
    if shown:
        msg += f"\njudged:\n{quote(list(shown))}"
    return Verdict("spec_decode", not problems, msg, judged=list(shown), figures=figures,
                   undecided="" if problems else too_few)


# ------------------------------------------------------------------------------------------------- what suites call
@dataclass(frozen=True)
class VerdictReport:
    """Where a verdict is reported besides its assertion: ``attach(view, events, title)`` attaches the judged log
    lines, ``record(key, value)`` records a figure (the plugin's ``ml4_attach_log`` and pytest's
    ``record_property``)."""

    attach: Callable[..., str]
    record: Callable[[str, Any], None]


@fails_with("kv.pool_short", "the engine's KV pool does not hold the target's requirement")
@fails_with("kv.engine_failure", "an OOM, start-up refusal, KV shortage or engine death since the last boot")
@fails_with("kv.load_failed_unexplained", "the load failed but the engine log has no known failure line")
@fails_with("kv.spec_acceptance", "speculative-decoding acceptance outside the target's ranges")
@fails_with("kv.spec_not_running",
            "speculative decoding is configured, but no SpecDecoding line or counter shows it running")
@fails_with("kv.no_pool_line",
            "the engine log has no 'GPU KV cache size' line since the last boot: the KV pool was never sized")
@fails_with("kv.pool_disagrees_with_metrics",
            "the logged KV pool disagrees with vllm:cache_config_info or the target's engine flags")
@fails_with("kv.metrics_unreadable",
            "the engine's /metrics could not be read (or lacks the vllm:* family the check needs)")
@fails_with("kv.max_concurrency_short",
            "the logged maximum concurrency at max_model_len is under gates.kv_max_concurrency_min")
@fails_with("kv.max_model_len_differs",
            "the KV line's max_model_len differs from the target's, or carries no concurrency figure")
@fails_with("kv.usage_unknown", "no KV usage to judge: no stats line and no vllm:kv_cache_usage_perc sample")
@fails_with("kv.load_failed", "the KV load failed, so its usage figures prove nothing")
@fails_with("kv.peak_usage_over_limit", "peak KV usage reached gates.kv_usage_pct_max")
def assert_holds(verdict: Verdict, view: LogView, report: VerdictReport, extra: str = "",
                 unchecked: str | None = None) -> None:
    """Report the verdict, then assert it; ``unchecked``: why its /metrics cross-check could not run (a passing
    verdict is then not judged, with that reason, rather than passed without it)."""
    report.attach(view, verdict.judged, f"{verdict.name}: judged log lines")
    first = verdict.message.splitlines()[0] if verdict.message else verdict.name
    report.record("ml4_verdict", f"{verdict.name}: {'PASS' if verdict.ok else 'FAIL'} - {first}")
    for key, value in verdict.figures.items():
        report.record(f"ml4_{key}", value)
    # Messages quote engine log lines; a real engine logs its --api-key among the non-default args.
    require(verdict.ok, verdict.code, lambda: redact(verdict.message + extra))
    if verdict.undecided:
        not_judged(redact(f"{verdict.undecided} ({first})"))
    if unchecked:
        not_judged(redact(f"log verdict passed ({first}), but {unchecked}"))


def assert_kv_pool_holds_requirement(view: LogView, target: Target, metrics: MetricsRead, report: VerdictReport,
                                     unchecked: str | None = None) -> None:
    """The boot's KV pool holds the target's requirement, cross-checked with the engine's cache config
    (``vllm:cache_config_info``)."""
    family = stack_for(target).engine_metric("cache_config_info")
    verdict = kv_pool_verdict(view, target, metrics.cache_info(family))
    if verdict.ok and metrics.errors:
        verdict = Verdict(verdict.name, False, f"{metrics.errors[0]}\n(the KV pool cross-check with "
                          f"{family} needs it)\n{verdict.message}", judged=verdict.judged,
                          own_code="kv.metrics_unreadable")
    assert_holds(verdict, view, report, unchecked=unchecked)


def assert_max_concurrency_at_max_model_len(view: LogView, target: Target, report: VerdictReport) -> None:
    assert_holds(max_concurrency_verdict(view, target), view, report)


def assert_no_oom_or_engine_death(view: LogView, load: LoadResult, report: VerdictReport) -> None:
    """No failure line since boot, and a failed load is never explained away by a clean log."""
    verdict = no_failures_verdict(view)
    if verdict.ok and load.failed:
        verdict = Verdict("no_failures", False, "the load failed but the engine log has no known failure line "
                                                f"since boot; last lines:\n{view.tail(15)}",
                          missing="kv.load_failed_unexplained")
    assert_holds(verdict, view, report, load.note())


def assert_peak_kv_usage_under_limit(view: LogView, target: Target, load: LoadResult, report: VerdictReport,
                                     unchecked: str | None = None) -> None:
    verdict = peak_usage_verdict(view, target, load.metric_peak_pct)
    if verdict.ok and load.metrics_error:
        verdict = Verdict(verdict.name, False, f"{load.metrics_error} while the load ran: the peak of "
                          f"{stack_for(target).engine_metric('kv_cache_usage')} is unknown\n{verdict.message}",
                          judged=verdict.judged,
                          own_code="kv.metrics_unreadable")
    if verdict.ok and load.failed:
        # A usage figure from an engine that died under the load proves nothing about its peak.
        failures = root_causes_first(view.failures())
        cause = failures[0].line.splitlines()[0] if failures else load.errors[0]
        verdict = Verdict(verdict.name, False, f"the load failed, so its KV usage proves nothing: {cause}\n"
                          f"{verdict.message}\nengine failure lines:\n" + quote(failures),
                          judged=failures or verdict.judged, own_code="kv.load_failed")
    assert_holds(verdict, view, report, load.note(), unchecked=unchecked)


def assert_spec_decode_acceptance_within_range(view: LogView, target: Target, load: LoadResult,
                                               report: VerdictReport, unchecked: str | None = None) -> None:
    """Acceptance within the target's ranges. With neither a SpecDecoding line nor the counters (no metrics URL,
    ``unchecked``, or a /metrics that could not be read during the load) nothing was measured: not judged, naming why; a readable /metrics whose
    counters never moved still fails (speculative decoding configured but not running)."""
    verdict = spec_decode_verdict(view, target, load.spec)
    unread = unchecked or load.metrics_error
    if not verdict.ok and not verdict.figures and unread:
        report.attach(view, verdict.judged, f"{verdict.name}: judged log lines")
        not_judged(redact(f"spec-decode acceptance: no SpecDecoding line since the boot of {view.source}, and the "
                          f"counters were not read: {unread}"))
    assert_holds(verdict, view, report, load.note(), unchecked=unchecked)
