"""Functional probes beside the load: every answer the gate sends at the operating point is judged, not only timed.

While aiperf loads the endpoint (a sweep point, a goodput or capacity run, the trace replay), a :class:`Prober`
thread with its own openai and httpx clients asks the single-request suites' questions one at a time: tool calls
under every ``tool_choice``, parallel calls, reasoning at each effort the stack accepts, a fixed length with
``min_tokens``, streamed and not (``pytest_ml4/data/prompts/probes.yaml``). Each answer is judged by the same
verdicts of :mod:`pytest_ml4.checks` those suites use; nothing here judges on its own. A batching bug that breaks
answers only while the engine is busy (fault ``under_load``) passes every single-request suite and fails here.

The probes start when aiperf's profiling phase starts (its console, :class:`~pytest_ml4.perf.runner.PhaseState`)
and stop when it has sent its last request, paced at ``share`` of the phase's requests (:class:`Pace`). What they
found goes beside aiperf's export as ``ml4-probes.json`` (:class:`PhaseProbes`), with a transcript per violation,
so cached runs and xdist workers read it as they read the export; :func:`first_violation` is what the suite's
``test_answers_stay_correct_under_load[<phase>]`` reports.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.perf.runner import AiperfSpec, PhaseState, RunResult, run_aiperf
from pytest_ml4.report.redact import redact

PROBES_FILE = "ml4-probes.json"
PROBES_DATA = data_file("prompts", "probes.yaml")
#: A probe waits at most this long for an answer (the phase's own deadline is aiperf's).
PROBE_TIMEOUT_S = 300.0
#: How long a phase's end waits for the probe in flight (``probes.yaml`` ``stop_grace_s`` overrides it).
STOP_GRACE_S = 2.0
#: How often the thread looks at aiperf's console state while waiting for the profiling phase.
POLL_S = 0.05
#: A closed-loop phase whose output length is not fixed (the trace replay) is paced as if its answers had this many.
DEFAULT_OSL = 256


# ------------------------------------------------------------------------------------------------ what is asked
@dataclass(frozen=True)
class Probe:
    """One question: its request body, streamed or not, and the verdict its answer must pass."""

    kind: str                                     # e.g. "tool_choice=required", "reasoning effort=low"
    body: dict[str, Any]
    stream: bool
    judge: Callable[[Any], None] = field(compare=False, repr=False)   # raises AssertionError (a Violation)

    @property
    def name(self) -> str:
        return f"{self.kind} ({'streamed' if self.stream else 'non-streamed'})"


def alternate(variants: Sequence[Any], streams: Sequence[bool]) -> list[tuple[Any, bool]]:
    """Every variant in every stream mode, the modes alternating from the first pass on: the first few probes of a
    kind already ask both modes and each variant once."""
    n = len(streams)
    return [(v, streams[(i + k) % n]) for k in range(n) for i, v in enumerate(variants)]


def tool_probes(target: Any, model: str, streams: Sequence[bool], tool_choices: Sequence[str]) -> list[Probe]:
    """``tool_choice`` obeyed with valid arguments (suites/test_tools.py's ``test_tool_choice_is_obeyed``)."""
    from pytest_ml4.checks.chat import user
    from pytest_ml4.checks.suite_data import tools_data
    from pytest_ml4.checks.tools import ToolChat, load_tools, named
    from pytest_ml4.stacks.dynamo_versions import within_every_release

    data = tools_data()
    toolset = load_tools(data.toolset)
    guided = within_every_release(toolset)
    spec = data.tool_choice
    chat = ToolChat(None, None, model, data.defaults).on(target, data.conventions, None, None)
    out = []
    for choice, stream in alternate(tool_choices, streams):
        tool_choice: Any = named(spec.expect_tool) if choice == "named" else choice
        tools = guided if choice in ("required", "named") else toolset
        expect = None if choice == "none" else spec.expect_tool
        body = chat.body(user(spec.prompt), tools=tools, tool_choice=tool_choice)
        out.append(Probe(f"tool_choice={choice}", body, stream,
                         lambda a, t=tools, c=tool_choice, e=expect: chat.assert_obeyed(a, t, c, e)))
    return out


def parallel_probes(target: Any, model: str, streams: Sequence[bool]) -> list[Probe]:
    """Parallel calls (suites/test_tools.py's ``test_parallel_calls``)."""
    from pytest_ml4.checks.chat import user
    from pytest_ml4.checks.suite_data import tools_data
    from pytest_ml4.checks.tools import ToolChat, assert_parallel_calls, load_tools

    data = tools_data()
    spec = data.parallel
    tools = load_tools(spec.tools)
    chat = ToolChat(None, None, model, data.defaults).on(target, data.conventions, None, None)

    def judge(answer: Any) -> None:
        args = chat.assert_obeyed(answer, tools, "auto", spec.expect_tool)
        assert_parallel_calls(args, spec.expect_calls, spec.expect_values, answer.where)

    body = chat.body(user(spec.prompt), tools=tools)
    return [Probe("parallel calls", body, stream, judge) for stream in streams]


def reasoning_probes(target: Any, model: str, streams: Sequence[bool], counter: Any,
                     efforts: Sequence[str]) -> list[Probe]:
    """Each effort the stack accepts is honoured (suites/test_reasoning.py's ``test_each_reasoning_effort_is_accepted``)."""
    from pytest_ml4.checks.chat import user
    from pytest_ml4.checks.reasoning import (
        accepted_efforts,
        assert_effort_honoured,
        defaults_for,
    )
    from pytest_ml4.checks.suite_data import reasoning_data

    data = reasoning_data()
    q = data.question
    defaults = defaults_for(target, data.defaults, data.effort_when_required)
    accepted = set(accepted_efforts(target))
    out = []
    for effort, stream in alternate([e for e in efforts if e in accepted], streams):
        body = {"model": model, "messages": user(q.prompt), **defaults, "reasoning_effort": effort}
        out.append(Probe(f"reasoning effort={effort}", body, stream,
                         lambda a, e=effort: assert_effort_honoured(a, e, q.expect_substring, counter)))
    return out


def fixed_length_probes(model: str, prompt: str, tokens: int) -> list[Probe]:
    """Exactly ``tokens`` completion tokens with ``min_tokens`` (suites/test_osl.py's usage check), streamed."""
    from pytest_ml4.checks.osl import assert_usage_exactly_n, fixed_length_body

    body = fixed_length_body(model, prompt, tokens)
    return [Probe(f"fixed length min_tokens={tokens}", body, True,
                  lambda a: assert_usage_exactly_n([a.result], tokens))]


def interleave(groups: Sequence[Sequence[Probe]]) -> list[Probe]:
    """One of each group in turn: a phase with few probes still asks every kind of question."""
    out: list[Probe] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


class FixedLength(Strict):
    prompt: str
    tokens: int


class ProbeTable(Strict):
    """``pytest_ml4/data/prompts/probes.yaml``: what the probes under load ask and how often (the file says)."""

    share: float
    settle_s: float
    stop_grace_s: float = STOP_GRACE_S
    order: tuple[Literal["tool_choice", "reasoning", "fixed_length", "parallel"], ...]
    tool_choices: tuple[str, ...]
    streams: tuple[bool, ...]
    efforts: tuple[str, ...]
    fixed_length: FixedLength


@functools.cache
def probe_table(path: Path = PROBES_DATA) -> ProbeTable:
    return load_yaml(path, ProbeTable)


def probe_cycle(target: Any, model: str, counter: Any) -> list[Probe]:
    """The questions asked under load, in the order of ``probes.yaml``."""
    data = probe_table()
    streams = list(data.streams)
    fixed = data.fixed_length
    kinds = {"tool_choice": lambda: tool_probes(target, model, streams, data.tool_choices),
             "reasoning": lambda: reasoning_probes(target, model, streams, counter, data.efforts),
             "fixed_length": lambda: fixed_length_probes(model, fixed.prompt, fixed.tokens),
             "parallel": lambda: parallel_probes(target, model, streams)}
    return interleave([kinds[k]() for k in data.order])


def probe_settings() -> tuple[float, float, float]:
    """``probes.yaml``'s share of the load's requests, the settle time before a phase's first probe and the most a
    phase's end waits for the probe in flight."""
    data = probe_table()
    return data.share, data.settle_s, data.stop_grace_s


# ------------------------------------------------------------------------------------------------ one phase
@dataclass(frozen=True)
class Phase:
    """A load phase: its kind (the check's parameter), a label naming the run, and what paces the probes: the
    closed loop's concurrency and output length, or the open loop's request rate."""

    kind: str
    label: str
    concurrency: int
    osl: int | None = None
    rate: float | None = None

    def load_rate(self, timing: ProbeTiming) -> float:
        """The phase's requests per second: the open loop's rate, or the closed loop's ``concurrency`` users each
        waiting the probes' time to first token and decoding ``osl`` tokens at their pace (the probes share the
        engine's batch with the load)."""
        if self.rate:
            return self.rate
        return self.concurrency / max(timing.request_s(self.osl or DEFAULT_OSL), 1e-3)


@dataclass
class ProbeTiming:
    """What the probes of a phase saw of the engine's pace: the last wall time, and from streamed answers the time
    to first token and the time per token after it."""

    wall_s: float = 1.0
    tokens: int | None = None
    ttft_s: float | None = None
    token_s: float | None = None

    def update(self, result: ProbeResult) -> None:
        self.wall_s, self.tokens = result.wall_s, result.tokens or self.tokens
        if result.ttft_s is not None and result.tokens and result.tokens > 1:
            self.ttft_s = result.ttft_s
            self.token_s = max(result.wall_s - result.ttft_s, 0.0) / (result.tokens - 1)

    def request_s(self, osl: int) -> float:
        """How long a request of ``osl`` tokens takes at the probes' pace (before a streamed one was answered: the
        last answer's wall time per token, time to first token included, so rather longer)."""
        if self.ttft_s is not None and self.token_s is not None:
            return self.ttft_s + osl * self.token_s
        return self.wall_s * osl / max(self.tokens or osl, 1)


@dataclass(frozen=True)
class Pace:
    """Probes at ``share`` of the phase's requests: after each, wait what keeps the probe rate at ``share`` times
    the phase's (:meth:`Phase.load_rate`)."""

    share: float

    def gap_s(self, phase: Phase, timing: ProbeTiming) -> float:
        interval = 1.0 / (self.share * max(phase.load_rate(timing), 1e-6))
        return max(interval - timing.wall_s, 0.0)


@dataclass
class ProbeResult:
    index: int
    probe: str                      # Probe.name
    at_s: float                     # sent, seconds after the phase's profiling started
    wall_s: float
    tokens: int | None
    violation: str | None = None    # the verdict's message (``[code] message`` for a coded one)
    ttft_s: float | None = None     # streamed probes: time to the first token
    code: str | None = None
    transcript: str | None = None   # file beside ml4-probes.json
    cut_off: bool = False           # still unanswered when the phase ended: not judged (Prober.during)


@dataclass
class PhaseProbes:
    """What the probes of one phase found (``ml4-probes.json`` in the phase's aiperf folder)."""

    kind: str
    label: str
    concurrency: int
    rate: float | None
    share: float
    results: list[ProbeResult] = field(default_factory=list)
    #: Why no probe was sent (aiperf never reached its profiling phase, the probes are off), else None.
    not_probed: str | None = None
    load_requests: int | None = None     # aiperf's completed requests (success + error), for the share
    #: Seconds the phase's end waited for the probe still in flight (what the probes add to the phase's wall time).
    stop_wait_s: float | None = None
    folder: str = ""

    @property
    def violations(self) -> list[ProbeResult]:
        return [r for r in self.results if r.violation]

    @property
    def judged(self) -> list[ProbeResult]:
        """The probes answered and judged (those cut off by the phase's end are not)."""
        return [r for r in self.results if not r.cut_off]

    def describe(self) -> str:
        load = "" if self.load_requests is None else f" beside {self.load_requests} load requests"
        cut = len(self.results) - len(self.judged)
        cut_note = f", {cut} cut off by the phase's end (not judged)" if cut else ""
        return f"{self.label}: {len(self.judged)} probe(s) judged{load}, {len(self.violations)} violation(s){cut_note}"

    def save(self, folder: Path) -> Path:
        path = folder / PROBES_FILE
        data = asdict(self)
        data.pop("folder")
        path.write_text(json.dumps(data, indent=2))
        return path

    @classmethod
    def load(cls, folder: Path) -> PhaseProbes | None:
        path = Path(folder) / PROBES_FILE
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        results = [ProbeResult(**r) for r in data.pop("results")]
        return cls(**data, results=results, folder=str(folder))


# ------------------------------------------------------------------------------------------------ the runner
class _Flight:
    """The probe thread's hand-over with the phase's end: the probe in flight, and whether the phase has closed
    (after which a late answer is dropped rather than judged)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._in_flight: tuple[int, Probe, float, float] | None = None   # index, probe, at_s, sent (monotonic)

    def send(self, index: int, probe: Probe, at_s: float) -> bool:
        with self._lock:
            if not self._closed:
                self._in_flight = (index, probe, at_s, time.monotonic())
            return not self._closed

    def is_open(self) -> bool:
        with self._lock:
            return not self._closed

    def land(self, results: list[ProbeResult], result: ProbeResult) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._in_flight = None
            results.append(result)
            return True

    def close(self) -> tuple[int, Probe, float, float] | None:
        """Close the phase; the probe still in flight, if any."""
        with self._lock:
            self._closed = True
            return self._in_flight


class Prober:
    """Sends the probe cycle beside one aiperf run at a time (:meth:`during`); clients made once per session."""

    def __init__(self, endpoint: Any, probes: Sequence[Probe], share: float, settle_s: float = 0.0,
                 stop_grace_s: float = STOP_GRACE_S) -> None:
        from pytest_ml4.client.endpoint import make_httpx, make_openai

        if not probes:
            raise ValueError("a prober needs at least one probe")
        self.probes = list(probes)
        self.pace = Pace(share)
        self.settle_s = settle_s
        self.stop_grace_s = stop_grace_s
        self.oai = make_openai(endpoint, timeout=PROBE_TIMEOUT_S)
        self.http = make_httpx(endpoint, timeout=PROBE_TIMEOUT_S)
        self._next = 0   # the cycle goes on across phases: every phase starts where the last one stopped

    @contextmanager
    def during(self, phase: Phase, folder: Path) -> Iterator[PhaseState]:
        """Probe while aiperf (fed the yielded state) is in its profiling phase; write the findings into
        ``folder`` when the block ends, whatever its outcome.

        The end stops the sending and gives the probe in flight at most ``stop_grace_s`` to be answered: one cut
        off by the phase's end is recorded as such (``cut_off``, a transcript saying so) and is not judged, and its
        answer, whenever it comes, is dropped. So a probe never holds a phase past its load by more than the grace,
        whatever its answer's length or a stalled engine."""
        state = PhaseState()
        found = PhaseProbes(phase.kind, phase.label, phase.concurrency, phase.rate, self.pace.share)
        flight = _Flight()
        thread = threading.Thread(target=self._run, args=(phase, state, flight, found, folder), daemon=True,
                                  name=f"ml4-probes-{phase.label}")
        thread.start()
        try:
            yield state
        finally:
            flight.stop.set()
            t0 = time.monotonic()
            thread.join(timeout=self.stop_grace_s)
            cut = flight.close()
            found.stop_wait_s = round(time.monotonic() - t0, 3)
            folder.mkdir(parents=True, exist_ok=True)
            if cut is not None:
                found.results.append(self._cut_off(cut, found.stop_wait_s, folder))
            if not found.results and found.not_probed is None:
                found.not_probed = (f"aiperf's profiling phase never started ({state.phase or 'no phase'} seen on "
                                    f"its console)")
            found.load_requests = _load_requests(folder)
            found.save(folder)

    def _run(self, phase: Phase, state: PhaseState, flight: _Flight, found: PhaseProbes, folder: Path) -> None:
        stop = flight.stop
        while not stop.is_set() and not _profiling(state):
            stop.wait(POLL_S)
        started = time.monotonic()
        stop.wait(self.settle_s)   # aiperf's first requests reach the engine before the first probe does
        timing = ProbeTiming()
        while not stop.is_set() and _profiling(state):
            probe = self.probes[self._next % len(self.probes)]
            self._next += 1
            index, at_s = len(found.results) + 1, time.monotonic() - started
            if not flight.send(index, probe, at_s):
                return
            result = self.ask(probe, index, at_s, folder, wanted=flight.is_open)
            if result is None or not flight.land(found.results, result):
                return   # cut off by the phase's end: already recorded as such, this late answer is not judged
            timing.update(result)
            stop.wait(self.pace.gap_s(phase, timing))

    def _cut_off(self, cut: tuple[int, Probe, float, float], waited_s: float, folder: Path) -> ProbeResult:
        index, probe, at_s, sent_at = cut
        why = (f"cut off by the phase's end: no complete answer {waited_s:.1f} s after aiperf's load ended (the stop "
               f"waits at most {self.stop_grace_s:g} s); not judged")
        result = ProbeResult(index, probe.name, round(at_s, 3), round(time.monotonic() - sent_at, 3), None,
                             cut_off=True)
        result.transcript = write_transcript(folder, index, probe, None, why, heading="not judged",
                                             no_answer="cut off by the phase's end")
        return result

    def ask(self, probe: Probe, index: int, at_s: float, folder: Path,
            wanted: Callable[[], bool] = lambda: True) -> ProbeResult | None:
        """Send one probe and judge its answer with the probe's verdict; None when the answer came after it was no
        longer ``wanted`` (the phase it was sent in has ended: it is not judged)."""
        from pytest_ml4.checks.chat import ask

        t0 = time.monotonic()
        answer = None
        wall = 0.0
        try:
            answer = ask(self.oai, self.http, probe.body, probe.stream)
            wall = time.monotonic() - t0   # the request's own time: the pace reads it, the verdict is not timed
            if not wanted():
                return None
            probe.judge(answer)
        except Exception as err:  # noqa: BLE001 - a verdict (AssertionError) or a request that could not be made
            if not wanted():
                return None
            why = str(err).split("\nassert ")[0] if isinstance(err, AssertionError) else (
                f"the probe could not be sent: {type(err).__name__}: {err}")
            result = _result(index, probe, at_s, wall or time.monotonic() - t0, answer, why, getattr(err, "code", None))
            result.transcript = write_transcript(folder, index, probe, answer, why)
            return result
        return _result(index, probe, at_s, wall, answer)

    def close(self) -> None:
        self.oai.close()
        self.http.close()


def probed_aiperf(prober: Prober | None, phase: Phase, spec: AiperfSpec, out_dir: Path, **kwargs: Any) -> RunResult:
    """:func:`~pytest_ml4.perf.runner.run_aiperf` with the probes beside it (none when ``prober`` is None)."""
    if prober is None:
        return run_aiperf(spec, out_dir, **kwargs)
    with prober.during(phase, Path(out_dir)) as state:
        return run_aiperf(spec, out_dir, state=state, **kwargs)


def _profiling(state: PhaseState) -> bool:
    """aiperf is sending its profiling requests (started, not yet "sending complete")."""
    return state.phase == "profiling" and state.sent is None and state.cancelled is None


def _result(index: int, probe: Probe, at_s: float, wall_s: float, answer: Any, violation: str | None = None,
            code: str | None = None) -> ProbeResult:
    stream = getattr(answer, "result", None)
    ttft = stream.ttft_s if stream is not None else None
    return ProbeResult(index, probe.name, round(at_s, 3), round(wall_s, 3), _tokens(answer), violation,
                       ttft_s=None if ttft is None else round(ttft, 4), code=code)


def _tokens(answer: Any) -> int | None:
    usage = getattr(answer, "usage", None) or {}
    value = usage.get("completion_tokens")
    return int(value) if isinstance(value, (int, float)) else None


def _load_requests(folder: Path) -> int | None:
    from pytest_ml4.perf.export import ExportError, ProfileExport

    try:
        export = ProfileExport.load(folder)
    except ExportError:
        return None
    ok = export.request_count
    return None if ok is None else int(ok + export.error_request_count)


def write_transcript(folder: Path, index: int, probe: Probe, answer: Any, violation: str,
                     heading: str = "violation", no_answer: str = "the request itself failed; see the violation") -> str:
    """The request, the answer (the SSE exchange when streamed) and the violation (or why it was not judged: a
    ``heading`` of its own), redacted, beside the findings."""
    folder = folder / "ml4-probes"
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{index:04d}-{probe.name}")[:120] + ".txt"
    lines = [f"probe {index}: {probe.name}", f"{heading}: {violation}", "",
             "request: " + json.dumps(probe.body, ensure_ascii=False)]
    if answer is None:
        lines.append(f"answer: none ({no_answer})")
    elif answer.result is not None:
        lines += ["", answer.result.to_transcript()]
    else:
        lines += ["", "answer: " + json.dumps({"message": answer.message, "finish_reason": answer.finish_reason,
                                               "usage": answer.usage}, ensure_ascii=False, default=str)]
    path = folder / name
    path.write_text(redact("\n".join(lines) + "\n"))
    return str(path.relative_to(folder.parent))


# ------------------------------------------------------------------------------------------------ reading back
def phase_findings(folders: Sequence[Path | str]) -> list[PhaseProbes]:
    """The findings of the given aiperf folders, in order (a folder without ``ml4-probes.json`` is left out)."""
    return [p for p in (PhaseProbes.load(Path(f)) for f in folders) if p is not None]


@dataclass(frozen=True)
class FirstViolation:
    phase: PhaseProbes
    result: ProbeResult

    @property
    def transcript(self) -> Path | None:
        return None if not self.result.transcript else Path(self.phase.folder) / self.result.transcript

    def describe(self) -> str:
        p, r = self.phase, self.result
        load = f"{p.rate:g} req/s Poisson" if p.rate else f"concurrency {p.concurrency}"
        return (f"{p.label} ({load}): probe {r.index} of {len(p.judged)}, {r.probe}, sent {r.at_s:.1f} s into the "
                f"phase: {r.violation}")


def first_violation(found: Sequence[PhaseProbes]) -> FirstViolation | None:
    """The first probe answer that failed its verdict, phase by phase."""
    for phase in found:
        for r in phase.results:
            if r.violation:
                return FirstViolation(phase, r)
    return None


# ------------------------------------------------------------------------------------------------ the load's answers
@dataclass(frozen=True)
class LoadAnswers:
    """What aiperf's per-request records (``profile_export.jsonl``, profiling phase) say of the load's own answers
    (verified on aiperf 0.13 with ``--use-server-token-count``: ``usage_reasoning_tokens``, ``usage_completion_tokens``,
    ``usage_prompt_tokens``, ``usage_total_tokens`` per request)."""

    label: str
    answered: int                       # successful records
    reasoned: list[str]                 # x_request_id of the answers reporting reasoning tokens
    unreasoned: list[str]               # ... and of those reporting none
    usage_wrong: list[str]              # "<id>: <what does not add up>"
    #: x_request_id of the successful records (HTTP 200, no ``error``) without any usage: the answer did not end
    #: with its usage, as one does whose 200 carried an error body (see :func:`load_answers`).
    unfinished: list[str] = field(default_factory=list)

    @property
    def reasons(self) -> bool:
        """The workload reasons on this deployment: most of its answers report reasoning tokens."""
        return len(self.reasoned) * 2 >= self.answered - len(self.unfinished) > 0


def load_answers(label: str, folder: Path | str) -> LoadAnswers | None:
    """The load's answers of one aiperf folder, None when it has no per-request export.

    An error body inside a 200 is not in aiperf 0.13's records: checked against the simulator's in-band error event
    (fault ``midstream_error``, ``data: {"error": ...}`` after a 200, as vLLM sends it), aiperf keeps such a request
    as a success (no ``error`` field, an empty ``error_summary``) and records neither the body nor the error; what
    it does record is the answer's end: the perf suite always runs it streamed with ``--use-server-token-count``
    (:func:`~pytest_ml4.perf.runner.build_argv`), so an answer that ended normally carries ``usage_*`` (the stream's
    usage chunk) and one cut by an error event carries none. The successful records without usage are the
    ``unfinished`` ones."""
    from pytest_ml4.perf.export import ExportError, read_records

    try:
        records = [r for r in read_records(Path(folder)) if r.ok]
    except ExportError:
        return None
    reasoned, unreasoned, wrong = [], [], []
    unfinished = []
    for r in records:
        rid = str(r.metadata.get("x_request_id", "?"))
        reasoning, completion = r.value("usage_reasoning_tokens"), r.value("usage_completion_tokens")
        if completion is None and r.value("usage_total_tokens") is None:
            unfinished.append(rid)
            continue
        (reasoned if reasoning else unreasoned).append(rid)
        prompt, total = r.value("usage_prompt_tokens"), r.value("usage_total_tokens")
        if isinstance(reasoning, (int, float)) and isinstance(completion, (int, float)) and reasoning > completion:
            wrong.append(f"{rid}: reasoning_tokens {reasoning:g} > completion_tokens {completion:g}")
        elif None not in (prompt, completion, total) and prompt + completion != total:
            wrong.append(f"{rid}: prompt {prompt:g} + completion {completion:g} != total_tokens {total:g}")
    return LoadAnswers(label, len(records), reasoned, unreasoned, wrong, unfinished)
