"""A fixed-OSL concurrency sweep (seed 000's loop) and a mooncake trace replay, over :mod:`pytest_ml4.perf.runner`.

Settings come from the target's ``perf:`` section with overrides for short runs. The grace period of each point is
sized from the expected p99 request latency (aiperf.md §4.2), using the slowest per-user rate the target's
baseline or gate allows. Results are cached as JSON under the run folder with a file lock, so several xdist
workers asking for the same sweep run it once.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_ml4.perf.baseline import Baseline
from pytest_ml4.perf.export import ProfileExport
from pytest_ml4.perf.figures import PointFigures, figures_from_export
from pytest_ml4.perf.probes import Phase, probed_aiperf
from pytest_ml4.perf.progress import SweepProgress
from pytest_ml4.perf.runner import (
    AiperfSpec,
    RunResult,
    expected_p99_latency_s,
    failure_log,
    load_trace,
)
from pytest_ml4.stacks import stack_for
from pytest_ml4.target.model import Target

#: The short profile CI runs: a few seconds per point, concurrencies around the engine cap. The prompt is short
#: and the output long enough that decode, not the serialised prefill of the first burst, dominates each request:
#: otherwise decode concurrency never reaches max_num_seqs (seed 000: ~0.45 s of prefill per 549-token prompt).
SHORT_ISL = 128
SHORT_OSL = 256
SHORT_DURATION_S = 6.0
MIN_GRACE_S = 30.0
GRACE_SAFETY = 1.5
FALLBACK_TOK_S_USER = 20.0


@dataclass(frozen=True)
class SweepSettings:
    concurrencies: tuple[int, ...]
    isl: int
    osl: int
    duration_s: float
    grace_s: float | None = None          # None: sized per point from the expected p99 latency
    warmup_requests: int = 0
    short: bool = False
    extra_inputs: tuple[tuple[str, Any], ...] = ()   # beside min_tokens (never ignore_eos: AiperfSpec refuses it)

    def conditions(self) -> dict[str, Any]:
        """What the sweep's figures were measured under (compared with a baseline's ``conditions``)."""
        return {"isl": self.isl, "osl": self.osl, "duration_s": self.duration_s, "min_tokens": self.osl}

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["concurrencies"] = list(self.concurrencies)
        d["extra_inputs"] = dict(self.extra_inputs)
        d["min_tokens"] = self.osl
        return d

    @property
    def key(self) -> str:
        return (f"c{'-'.join(map(str, self.concurrencies))}_isl{self.isl}_osl{self.osl}_d{self.duration_s:g}"
                f"_g{self.grace_s if self.grace_s is not None else 'auto'}")


def short_concurrencies(target: Target) -> tuple[int, ...]:
    """A few points that still show the per-user fall-off, the cap and the knee: 1, 4, cap, 2x cap (<= 32)."""
    cap = target.engine.max_num_seqs
    wanted = {1, 4, min(cap, 32), min(2 * cap, 32)}
    return tuple(sorted(wanted))


def settings_from_target(target: Target, *, concurrencies: Sequence[int] | None = None,
                         duration_s: float | None = None, osl: int | None = None, isl: int | None = None,
                         grace_s: float | None = None, short: bool = False) -> SweepSettings:
    perf = target.perf
    conc = tuple(concurrencies) if concurrencies else (short_concurrencies(target) if short
                                                         else tuple(perf.concurrencies))
    return SweepSettings(
        concurrencies=conc,
        isl=isl if isl is not None else (SHORT_ISL if short else perf.isl),
        osl=osl if osl is not None else (SHORT_OSL if short else perf.osl),
        duration_s=duration_s if duration_s is not None else (SHORT_DURATION_S if short else perf.duration_s),
        grace_s=grace_s, warmup_requests=0, short=short)


def slowest_tok_s_user(target: Target, baseline: Baseline | None) -> float:
    if baseline is not None:
        rates = [row["tok_s_user"] for row in baseline.points.values() if "tok_s_user" in row]
        if rates:
            return min(rates)
    if target.gates.decode_tok_s_user_p50_min:
        return target.gates.decode_tok_s_user_p50_min
    return FALLBACK_TOK_S_USER


def grace_for(settings: SweepSettings, target: Target, concurrency: int, baseline: Baseline | None) -> float:
    if settings.grace_s is not None:
        return settings.grace_s
    p99 = expected_p99_latency_s(settings.osl, slowest_tok_s_user(target, baseline), target.gates.ttft_p99_knee_s,
                                 concurrency, target.engine.max_num_seqs)
    return max(MIN_GRACE_S, round(GRACE_SAFETY * p99))


@dataclass
class PointResult:
    """One point: where its artifacts are, whether the run is usable, its figures."""

    concurrency: int
    out_dir: str
    ok: bool
    problems: list[str]
    returncode: int | None
    wall_s: float
    figures: dict[str, Any] | None = None
    log_tail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def point(self) -> PointFigures | None:
        return None if self.figures is None else PointFigures(**self.figures)

    def export(self) -> ProfileExport:
        return ProfileExport.load(Path(self.out_dir))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def point_from_run(run: RunResult, secrets: Sequence[str | None]) -> PointResult:
    figs = None if run.export is None else figures_from_export(run.export, run.spec.concurrency).as_dict()
    return PointResult(concurrency=run.spec.concurrency, out_dir=str(run.out_dir), ok=run.ok,
                       problems=list(run.problems), returncode=run.returncode, wall_s=round(run.wall_s, 2),
                       figures=figs, log_tail="" if run.ok else failure_log(run, secrets))


@dataclass(frozen=True)
class Client:
    """Where aiperf sends its requests; the key is kept out of ``repr``."""

    model: str
    base_url: str
    metrics_url: str | None
    api_key: str | None = field(default=None, repr=False)
    #: The decoding engines' own /metrics where ``metrics_url`` is not an engine's (a Dynamo frontend).
    engine_metrics_urls: tuple[str, ...] = ()
    #: The functional probes sent beside every load phase (:class:`pytest_ml4.perf.probes.Prober`); None: none.
    probes: Any = field(default=None, repr=False, compare=False)


Write = Callable[[str], None]
#: ``PointResult.extra`` key: requests the suite's probes kept in flight beside the point's load.
PROBES_BESIDE = "probes_beside"


def describe_point(point: PointResult) -> str:
    """One line for the progress display: the headline figures, then any problem."""
    f = point.point
    text = "no figures" if f is None else (
        f"{f.out_tok_s or 0:.1f} tok/s, {f.tok_s_user or 0:.1f} tok/s/user, TTFT p50 {f.ttft_p50_s or 0:.2f} s, "
        f"ITL p50 {f.itl_p50_ms or 0:.1f} ms, {f.requests} requests")
    return text if point.ok else f"{text} [{'; '.join(point.problems)[:200]}]"


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep; carries the points finished before it (still a KeyboardInterrupt for pytest)."""

    def __init__(self, points: list[PointResult], concurrency: int) -> None:
        super().__init__(f"perf sweep interrupted at c{concurrency} after {len(points)} finished point(s)")
        self.points = points
        self.concurrency = concurrency


def run_sweep(target: Target, client: Client, settings: SweepSettings, out_root: Path, *,
              baseline: Baseline | None = None, write: Write | None = None) -> list[PointResult]:
    """Run every point into ``out_root/c<N>`` and return the results in concurrency order.

    Ctrl-C raises :class:`SweepInterrupted` with the points finished so far (their exports stay in place)."""
    estimate = 8.0 + settings.duration_s + min(settings.duration_s, 30.0)
    progress = SweepProgress(write or (lambda _line: None), settings.concurrencies, estimate, client.metrics_url)
    results = []
    for c in settings.concurrencies:
        spec = AiperfSpec(model=client.model, url=client.base_url, concurrency=c, isl=settings.isl,
                          osl=settings.osl, duration_s=settings.duration_s,
                          grace_s=grace_for(settings, target, c, baseline), min_tokens=settings.osl,
                          extra_inputs=dict(settings.extra_inputs), server_metrics_url=client.metrics_url,
                          engine_metrics_urls=client.engine_metrics_urls)
        progress.point_started(c)
        try:
            run = probed_aiperf(client.probes, Phase("sweep", f"sweep c{c}", c, osl=settings.osl), spec,
                                out_root / f"c{c}", api_key=client.api_key, on_tick=progress.tick)
        except KeyboardInterrupt:
            raise SweepInterrupted(results, c) from None
        point = point_from_run(run, [client.api_key])
        if client.probes is not None:
            point.extra[PROBES_BESIDE] = 1   # the probes go one at a time: the engine may run one more
        results.append(point)
        progress.point_done(c, describe_point(point))
    return results


def run_trace(target: Target, client: Client, trace: Path, out_dir: Path, *, concurrency: int,
              warmup_requests: int, write: Write | None = None) -> PointResult:
    """Replay a mooncake trace (timestamps -> fixed schedule) after a warmup; the profiling phase is the window."""
    spec = AiperfSpec(model=client.model, url=client.base_url, concurrency=concurrency, isl=None, osl=None,
                      duration_s=None, trace_file=trace, warmup_requests=warmup_requests,
                      warmup_concurrency=min(concurrency, max(warmup_requests, 1)),
                      server_metrics_url=client.metrics_url, aiperf_env=session_env(target))
    progress = SweepProgress(write or (lambda _line: None), [concurrency], 60.0, client.metrics_url,
                             label="perf trace")
    progress.point_started(concurrency)
    run = probed_aiperf(client.probes, Phase("trace", "trace replay", concurrency), spec, out_dir,
                        api_key=client.api_key, on_tick=progress.tick)
    point = point_from_run(run, [client.api_key])
    if run.export is not None:
        point.extra = {k: run.export.scalar(k) for k in
                       ("replay_sched_lag_p50", "replay_sched_lag_p99", "replay_sched_degraded")}
    progress.point_done(concurrency, describe_point(point))
    return point


def session_env(target: Target) -> dict[str, str]:
    # Dynamo's KV router pins a conversation by x-dynamo-session-id (seed 002 notes); aiperf derives that header
    # from the correlation id when this variable is set (aiperf.md §4.7).
    if stack_for(target).routes_workers and target.serving.session_affinity:
        return {"AIPERF_HTTP_X_DYNAMO_SESSION_ID_FROM_CORRELATION_ID": "true"}
    return {}


def cached(path: Path, compute: Callable[[], list[PointResult]]) -> list[PointResult]:
    """Run ``compute`` once per run folder and key; other callers (xdist workers) wait and read its result."""
    rows = cached_json(path, lambda: [r.as_dict() for r in compute()])
    return [PointResult(**d) for d in rows]


def cached_json(path: Path, compute: Callable[[], Any]) -> Any:
    """``compute()`` (JSON data) once per ``path``: the first caller runs it under a file lock and writes it, later
    callers (other xdist workers) wait and read the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / (path.name + ".lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.is_file():
                return json.loads(path.read_text())
            data = compute()
            path.write_text(json.dumps(data, indent=2))
            return data
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def short_trace(src: Path, dst: Path, *, rows: int = 16, time_scale: float = 0.1, max_output: int = SHORT_OSL) -> int:
    """A CI-sized copy of a mooncake trace: its first ``rows`` rows, timestamps x ``time_scale``, outputs capped.

    Block ids keep their sizes (a subset of a valid trace stays valid), so KV reuse between turns is preserved.
    Returns the number of rows written.
    """
    kept = []
    for row in load_trace(src)[:rows]:
        out = row.wire()
        if row.timestamp is not None:
            out["timestamp"] = int(row.timestamp * time_scale)
        out["output_length"] = min(row.output_length, max_output)
        kept.append(out)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return len(kept)
