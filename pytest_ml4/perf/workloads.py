"""Run the target's workloads at Poisson request rates and judge goodput and capacity, without pytest.

One :class:`WorkloadRunner` per run folder: every aiperf run goes to ``<root>/<workload>/<label>``, and each
result is cached in a JSON file beside it (:func:`pytest_ml4.perf.sweep.cached_json`), so the goodput, capacity and
sessions checks (and xdist workers) share the runs instead of repeating them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ml4.perf import capacity as cap
from pytest_ml4.perf.export import (
    ExportError,
    ProfileExport,
    RequestRecord,
    read_records,
)
from pytest_ml4.perf.gates import GateResult
from pytest_ml4.perf.goodput import (
    Goodput,
    GoodputMissing,
    count_good,
    goodput_gate,
    goodput_of,
    request_count,
    workload_spec,
    write_goodput_plot,
)
from pytest_ml4.perf.kube import KubeLoad, KubeRunError
from pytest_ml4.perf.probes import Phase, probed_aiperf
from pytest_ml4.perf.runner import AiperfSpec, failure_log, judge
from pytest_ml4.perf.summary import gate_dicts, update_summary
from pytest_ml4.perf.sweep import Client, cached_json, session_env
from pytest_ml4.stacks.vllm import adapter as vllm_stack
from pytest_ml4.target.model import Target, Workload

#: Capacity search per profile: (runs per rate at most, rates probed above the declared one, requests per run).
#: A rate meets the 95 % floor on its own only from about 53 all-good requests (one-sided Wilson bound), hence 60.
CAPACITY_SHORT = (2, 1, 60)
CAPACITY_FULL = (3, 4, None)

Write = Callable[[str], None]


@dataclass
class WorkloadRun:
    """One aiperf run of a workload at one rate (JSON-cacheable)."""

    workload: str
    rate: float
    requests: int
    out_dir: str
    ok: bool
    problems: list[str]
    wall_s: float
    log_tail: str = ""
    goodput: dict[str, Any] | None = None
    goodput_problem: str | None = None
    #: Change of the engines' own counters over the run (``PREFIX_COUNTERS``), summed over engines; None when no
    #: engine /metrics was readable before and after.
    engine_counters: dict[str, float] | None = None
    engine_metrics_problem: str | None = None

    def export(self) -> ProfileExport:
        return ProfileExport.load(Path(self.out_dir))

    def records(self) -> list[Any]:
        return read_records(Path(self.out_dir))

    @property
    def figures(self) -> Goodput | None:
        return None if self.goodput is None else Goodput(**{k: v for k, v in self.goodput.items()
                                                             if k != "fraction"})


@dataclass
class WorkloadRunner:
    target: Target
    client: Client
    root: Path
    short: bool
    write: Write = field(default=lambda _line: None)
    #: The engines' own /metrics (vLLM, or every Dynamo worker): their prefix-cache counters judge prefix reuse.
    engine_metrics_urls: tuple[str, ...] = ()
    #: ``--perf-kube N``: every run goes to the cluster as a JobSet of N aiperf worker pods.
    kube: KubeLoad | None = None

    def workload(self, name: str) -> Workload:
        w = self.target.perf.workloads.get(name)
        if w is None:
            raise KeyError(f"target {self.target.name} declares no perf.workloads.{name} (README 'SLOs')")
        return w

    def run(self, name: str, rate: float, label: str, requests: int | None = None) -> WorkloadRun:
        """Workload ``name`` at ``rate`` req/s into ``root/name/label`` (once per run folder)."""
        w = self.workload(name)
        n = requests or request_count(w, self.target.perf.duration_s, self.short)
        n = max(n // w.turns, 1) * w.turns
        out = self.root / name / label
        data = cached_json(out.with_suffix(".json"), lambda: vars(self._run(name, w, rate, n, out)))
        return WorkloadRun(**data)

    def _run(self, name: str, w: Workload, rate: float, n: int, out: Path) -> WorkloadRun:
        c = self.client
        spec = workload_spec(self.target, name, model=c.model, url=c.base_url, rate=rate, requests=n,
                             metrics_url=c.metrics_url, aiperf_env=session_env(self.target))
        self.write(f"[ml4 perf] {name} at {rate:g} req/s (Poisson), {n} requests: started")
        before = engine_counters(self.engine_metrics_urls)
        if self.kube is None:
            res = probed_aiperf(c.probes, workload_phase(name, out.name, rate, spec.concurrency), spec, out,
                                api_key=c.api_key)
            run = WorkloadRun(name, rate, n, str(out), res.ok, list(res.problems), round(res.wall_s, 2),
                              "" if res.ok else failure_log(res, [c.api_key]))
            export = res.export
        else:
            run, export = self._run_on_kube(name, rate, n, spec, out)
        after = engine_counters(self.engine_metrics_urls)
        if isinstance(before, dict) and isinstance(after, dict):
            run.engine_counters = {k: after[k] - before[k] for k in PREFIX_COUNTERS}
        else:
            run.engine_metrics_problem = before if isinstance(before, str) else str(after)
        if export is not None:
            try:
                run.goodput = goodput_of(export, name, rate, w.slo, self.target.perf.goodput_floor).as_dict()
            except GoodputMissing as err:
                run.goodput_problem = str(err)
        g = run.figures
        self.write(f"[ml4 perf] {name} at {rate:g} req/s done: " + (
            f"goodput {g.good}/{g.total} ({g.fraction:.1%})" if g else (run.goodput_problem or "no export")))
        return run

    def _run_on_kube(self, name: str, rate: float, n: int, spec: AiperfSpec,
                     out: Path) -> tuple[WorkloadRun, ProfileExport | None]:
        """The same run as a JobSet (``--perf-kube``): its fetched export is judged like a local one."""
        assert self.kube is not None
        t0 = time.monotonic()
        export: ProfileExport | None = None
        try:
            self.kube.run(spec, out, f"{self.target.name}-{name}")
            export = ProfileExport.load(out)
            problems = judge(export, 0)
        except (KubeRunError, ExportError) as err:
            problems = [str(err)]
        return WorkloadRun(name, rate, n, str(out), not problems, problems, round(time.monotonic() - t0, 2)), export

    def production(self, name: str) -> WorkloadRun:
        """The goodput run: the workload at its production rate."""
        return self.run(name, self.workload(name).request_rate, "production")

    def soak(self, name: str, duration_s: float) -> WorkloadRun:
        """The workload at its production rate for ``duration_s`` (``--ml4-soak``): the probes ride it."""
        w = self.workload(name)
        return self.run(name, w.request_rate, "soak", max(round(w.request_rate * duration_s), 1))

    def capacity_folders(self, name: str) -> list[Path]:
        """The aiperf folders of the capacity search's runs so far (their probes' findings are beside them)."""
        return sorted(p for p in (self.root / name).glob("capacity-*") if p.is_dir())

    def capacity(self, name: str) -> cap.Capacity:
        """The bounded capacity search from the declared capacity (see :mod:`pytest_ml4.perf.capacity`)."""
        w = self.workload(name)
        if w.capacity_rps is None:
            raise KeyError(f"target {self.target.name} declares no perf.workloads.{name}.capacity_rps")
        repeats, probes, requests = CAPACITY_SHORT if self.short else CAPACITY_FULL
        counter = {"n": 0}

        def run_at(rate: float) -> Goodput:
            counter["n"] += 1
            run = self.run(name, rate, f"capacity-{counter['n']}-{rate:g}rps", requests)
            if run.figures is None:
                raise CapacityRunFailed(f"capacity run at {rate:g} req/s gave no goodput: "
                                        f"{'; '.join(run.problems) or run.goodput_problem} ({run.out_dir})")
            return run.figures

        return cap.search(run_at, w.capacity_rps, self.target.perf.goodput_floor, repeats=repeats, probes=probes)


def workload_phase(name: str, label: str, rate: float, concurrency: int) -> Phase:
    """The probed phase of a workload run: its production run is the goodput phase, the others the capacity's."""
    kind = {"production": f"goodput-{name}", "soak": "soak"}.get(label, "capacity")
    return Phase(kind, f"{name} {label} at {rate:g} req/s", concurrency, rate=rate)


#: vLLM's prefix-cache counters (tokens queried, tokens found cached), on every engine's /metrics (vllm.md; every
#: stack's workers run vLLM: stacks.yaml worker_engine).
PREFIX_COUNTERS = (vllm_stack().engine_metric("prefix_cache_queries"), vllm_stack().engine_metric("prefix_cache_hits"))


def engine_counters(urls: tuple[str, ...]) -> dict[str, float] | str:
    """``PREFIX_COUNTERS`` summed over the engines at ``urls``, or why they could not be read."""
    from pytest_ml4.evidence.metrics import MetricsError, scrape

    if not urls:
        return "no engine /metrics URL is known (Dynamo: endpoint.worker_metrics_url_env of the target)"
    total = dict.fromkeys(PREFIX_COUNTERS, 0.0)
    for url in urls:
        try:
            snap = scrape(url, timeout=5.0)
        except MetricsError as err:
            return str(err)
        for name in PREFIX_COUNTERS:
            if not snap.samples(name):
                return f"{name} absent from {url}"
            total[name] += snap.sum(name)
    return total


class CapacityRunFailed(RuntimeError):
    """An aiperf run of the capacity search produced no goodput figures."""


@dataclass
class GoodputVerdict:
    gate: GateResult | None          # None: not judged (``why``)
    plot: Path | None
    why: str | None = None
    own_good: int | None = None      # good requests counted from the per-request export (cross-check)


def goodput_verdict(target: Target, run: WorkloadRun, run_dir: Path, simulated: bool) -> GoodputVerdict:
    """The goodput gate of one workload run, its plot beside the run, and its ``goodput_<workload>`` summary
    section. Shared by the suite and ``--perf-kube`` (whose fetched export is judged the same way)."""
    w = target.perf.workloads[run.workload]
    g = run.figures
    section: dict[str, Any] = {"rate_rps": run.rate, "requests": run.requests, "ok": run.ok,
                               "problems": run.problems, "slo": w.slo.model_dump(),
                               "floor": target.perf.goodput_floor, "artifact_dir": run.out_dir}
    if g is None:
        why = run.goodput_problem or "; ".join(run.problems) or "no aiperf export"
        update_summary(run_dir, target.name, simulated, f"goodput_{run.workload}", {**section, "passed": None,
                                                                                     "not_judged": why})
        return GoodputVerdict(None, None, why)
    records = run.records()
    title = f"{target.name}{' (simulated)' if simulated else ''}, {run.workload}"
    plot = write_goodput_plot(records, w.slo, g, Path(run.out_dir).parent / f"goodput-{Path(run.out_dir).name}.png",
                              title)
    gate = goodput_gate(g, w.slo)
    update_summary(run_dir, target.name, simulated, f"goodput_{run.workload}",
                   {**section, **g.as_dict(), "gate": gate_dicts([gate])[0], "plot": str(plot),
                    "passed": gate.passed})
    return GoodputVerdict(gate, plot, own_good=count_good(records, w.slo))


@dataclass(frozen=True)
class PrefixFloor:
    """Prompt tokens a sessions run's engines must at least have served from their prefix cache, and why."""

    system: float            # first turns: the shared system prompt
    turns: float             # follow-up turns: the previous turn's prompt (only where routing keeps a session)
    follow_ups: int          # follow-up requests whose previous turn completed (judged on their own prefix)
    across_turns: bool

    @property
    def tokens(self) -> float:
        return self.system + self.turns

    def describe(self, system_prompt_tokens: int) -> str:
        why = f"the shared {system_prompt_tokens}-token system prompt"
        if self.across_turns:
            why += f" and, for {self.follow_ups} follow-up turn(s), the previous turn's prompt"
        return why


def prefix_reuse_floor(w: Workload, records: Sequence[RequestRecord], requests: int, engines: int,
                       block_size: int, across_turns: bool) -> PrefixFloor:
    """The cache hits a sessions run guarantees, each request counted by its own full blocks less one (the chat
    template's framing may shift the block boundary), for every request after each engine's first:

    * a first turn: the shared system prompt;
    * a follow-up turn, where the deployment keeps a session on one engine (one engine, or Dynamo's KV router,
      which routes by cached prefix and session affinity): the previous turn's whole prompt (its
      ``input_sequence_length`` as the server counted it, from aiperf's per-request export), which is a prefix
      of this one; elsewhere only the system prompt. The hits themselves are the engines' own counters."""
    sys_tokens = max(w.system_prompt_tokens // block_size - 1, 0) * block_size
    prev_isl = {(r.metadata.get("conversation_id"), r.metadata.get("turn_index")): r.value("input_sequence_length")
                for r in records if r.ok}
    turn_tokens, follow_ups, first_turns = 0.0, 0, 0
    for conv, turn in prev_isl:
        prev = prev_isl.get((conv, turn - 1)) if isinstance(turn, int) and turn > 0 else None
        if not across_turns or not isinstance(prev, (int, float)):
            first_turns += 1
            continue
        follow_ups += 1
        turn_tokens += max(int(prev) // block_size - 1, 0) * block_size
    if not prev_isl:  # no per-request export: every request is judged on the system prompt alone
        first_turns = requests
    system = float(sys_tokens * max(first_turns - max(engines, 1), 0))
    return PrefixFloor(system, float(turn_tokens), follow_ups, across_turns)


def keeps_sessions_together(target: Target, engines: int) -> bool:
    """Whether a follow-up turn reaches the engine that cached the previous one: a single engine, or Dynamo's KV
    router (prefix-aware routing, plus session affinity where the target enables it)."""
    return engines <= 1 or target.serving.dynamo_router == "kv"


def prompt_engine_urls(worker_urls: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The /metrics of the engines that compute prompts: a disaggregated deployment's prefill workers (its decode
    workers receive the KV and would count the same prompt again), else every worker."""
    if "prefill" in worker_urls:
        return tuple(worker_urls["prefill"])
    return tuple(u for role in sorted(worker_urls) for u in worker_urls[role])


def decode_engine_urls(worker_urls: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The /metrics of the engines that run the decoding sequences: a disaggregated deployment's decode workers,
    else every worker (none known: empty, the endpoint's own /metrics is then the engine's or nothing)."""
    if "decode" in worker_urls:
        return tuple(worker_urls["decode"])
    return tuple(u for role in sorted(worker_urls) for u in worker_urls[role])

