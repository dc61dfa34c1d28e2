"""The restart scenario and its checks (core, no pytest): what clients see while a deployment restarts.

:func:`run_restart_scenario` starts long streams, restarts the engine through a :class:`Controller` while they
run, keeps sending short requests during the restart, then measures the restart from what the engines did: per
request, which engine incarnation answered it. First what a real deployment offers, sampled by the controller
before and after each request: systemd's InvocationID, or the engine process's start time on its /metrics (the
embedded vLLM simulator; real vLLM exports the same gauge). Without such a signal, the answer's own evidence: a
Dynamo frontend's ``nvext.worker_id`` (the worker that decoded it, asked for through the controller's
``probe_extras``), or, as a fallback the timeline names, the simulator's ``x-ml4-engine-instance`` header (passed on
by LiteLLM as ``llm_provider-x-ml4-engine-instance``). The outage is the last answer of the old engine to
the first of a new one; recovery is the trigger to that first answer of a new engine, so a controller that keeps the
old engine serving for a while (systemd's stop delay, fault ``delayed_stop``) cannot make recovery look instant. With
several replicas (a rolling restart of Dynamo workers) every engine the controller lists before the trigger
(``Controller.engines``) is an old one: an answer of the replica not yet replaced is not a recovery.

The ``check_*`` functions judge the recorded :class:`RestartRun` and raise ``AssertionError`` with a message that quotes what the client got (the proxy's error body, the in-band error).

Verdicts of an in-flight stream (tooling.md §3.6: "Every stream check must look for ``error`` events and for a
final ``finish_reason`` + ``[DONE]``"): ``completed`` (finish_reason and ``[DONE]``), ``error_event`` (an in-band
``{"error": ...}``), ``transport_error`` (the connection broke and the client saw it), ``http_error``, and the
one that fails the suite: ``silently_truncated`` (the stream ended with neither a finish nor an error).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import httpx
from pydantic import Field, model_validator

from pytest_ml4.checks.codes import fail, fails_with
from pytest_ml4.client.endpoint import Endpoint, make_httpx, quote_body
from pytest_ml4.client.stream_probe import StreamResult, probe_chat_stream
from pytest_ml4.control.base import Controller, Progress, RestartResult, RestartTimeout
from pytest_ml4.control.budget import FIRST_ANSWER, PhaseTimeout, RestartBudget
from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.stacks import stack_for
from pytest_ml4.stacks.litellm import attempted_retries

REQUESTS_FILE = data_file("restart", "requests.yaml")
STALE_FILE = data_file("restart", "stale-instances.yaml")
OUTAGE_FILE = data_file("dynamo", "single-replica-outage.yaml")
#: Worker roles of a topology kind -> the Topology field holding its replica count.
TOPOLOGY_ROLES: dict[str, dict[str, str]] = {"disagg": {"prefill": "prefill_workers", "decode": "decode_workers"}}
DEFAULT_ROLES = {"worker": "workers"}
#: The simulator's engine-instance header, and the name LiteLLM gives a provider's response header.
ENGINE_HEADERS = ("x-ml4-engine-instance", "llm_provider-x-ml4-engine-instance")


class InFlightSpec(Strict):
    """The long streams that must still run when the restart hits (min_tokens = max_tokens keeps them going)."""

    streams: int = Field(ge=0)
    prompt: str
    max_tokens: int = Field(gt=0)
    min_tokens: int = Field(ge=0)
    settle_s: float = Field(ge=0)


class ProbeSpec(Strict):
    """The short request sent during and after the restart; an answer lacking ``expect_substring`` is wrong."""

    prompt: str
    expect_substring: str
    max_tokens: int = Field(gt=0)
    interval_s: float = Field(gt=0)


class ConversationTurn(Strict):
    prompt: str
    expect_substring: str


class ConversationSpec(Strict):
    """Two turns of one session (Dynamo prefix reuse, the disagg handoff) after a long system prompt."""

    system: str
    turns: tuple[ConversationTurn, ...] = Field(min_length=1)
    max_tokens: int = Field(gt=0)


class AffinitySpec(Strict):
    """The session-affinity probe: ``prefix`` repeated ``repeat`` times spans many KV blocks."""

    prefix: str
    repeat: int = Field(default=1, ge=1)
    question: str
    control_question: str
    max_tokens: int = Field(gt=0)


class CrashSpec(Strict):
    """A stream whose worker is SIGKILLed after ``kill_after_events`` events; ``unmigrated_error`` is the in-band
    error Dynamo sends when migration is off (compared as the plain object it is on the wire)."""

    prompt: str
    max_tokens: int = Field(gt=0)
    min_tokens: int = Field(ge=0)   # absent: max_tokens (a fixed-length stream)
    kill_after_events: int = Field(gt=0)
    unmigrated_error: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _fixed_length_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and "min_tokens" not in data and "max_tokens" in data:
            return {**data, "min_tokens": data["max_tokens"]}
        return data


class RestartRequests(Strict):
    """pytest_ml4/data/restart/requests.yaml: every request the restart suite sends."""

    in_flight: InFlightSpec
    probe: ProbeSpec
    conversation: ConversationSpec
    affinity: AffinitySpec
    crash: CrashSpec


@functools.cache
def load_requests(path: Path = REQUESTS_FILE) -> RestartRequests:
    """The restart suite's requests; a malformed file is a :class:`~pytest_ml4.datafile.DataFileError` naming the
    file, the line and the field."""
    return load_yaml(path, RestartRequests)


@dataclass
class StreamOutcome:
    index: int
    verdict: str
    detail: str
    chunks: int
    in_flight_at_restart: bool

    def line(self) -> str:
        return f"stream {self.index}: {self.verdict} after {self.chunks} events ({self.detail})"


@dataclass
class RequestOutcome:
    index: int
    sent_s: float          # seconds after the restart was triggered
    elapsed_s: float
    status: int | None
    retries: int | None    # x-litellm-attempted-retries, where a proxy answered 200
    error: str | None      # what the client got instead of an answer (quoted body or transport error)
    answer_ok: bool = True
    engine: str | None = None  # the engine incarnation that answered, where known (see the module docstring)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def done_s(self) -> float:
        return self.sent_s + self.elapsed_s

    def line(self) -> str:
        state = f"HTTP {self.status}" if self.status is not None else "no response"
        extra = f", retries {self.retries}" if self.retries is not None else ""
        by = f", engine {self.engine}" if self.engine else ""
        err = f": {self.error}" if self.error else ""
        return (f"request {self.index} sent at +{self.sent_s:.2f}s: {state} in {self.elapsed_s:.2f}s{extra}{by}"
                f"{err}")


@dataclass
class Timeline:
    """The restart as the engines lived it, in seconds after the trigger (None: not seen)."""

    old_engine: str | None
    new_engine: str | None = None
    last_old_s: float | None = None   # the last answer the old engine (or one of its peers) gave
    first_new_s: float | None = None  # the first answer of a new engine
    evidence: str = "none"            # where the engine of each request came from
    old_peers: tuple[str, ...] = ()   # the other engines serving before the trigger (replicas of a rolling restart)

    @property
    def outage_s(self) -> float | None:
        if self.first_new_s is None:
            return None
        return self.first_new_s - (self.last_old_s if self.last_old_s is not None else 0.0)

    def lines(self) -> list[str]:
        def at(t: float | None) -> str:
            return "never" if t is None else f"+{t:.2f} s"
        out = [f"engine evidence: {self.evidence}",
               f"old engine {self.old_engine or '?'}"
               + (f" (and its peers {', '.join(self.old_peers)})" if self.old_peers else "")
               + f": last answer {at(self.last_old_s)}",
               f"new engine {self.new_engine or '?'}: first answer {at(self.first_new_s)}"]
        if self.outage_s is not None and self.outage_s < 0:
            # A rolling restart: a peer not yet replaced still answered after the first new engine did.
            out.append(f"no outage: old engines answered until {-self.outage_s:.2f} s after the new engine's first")
        elif self.outage_s is not None:
            out.append(f"outage (old engine's last answer to new engine's first): {self.outage_s:.2f} s")
        return out


def build_timeline(old_engine: str | None, outcomes: list[RequestOutcome],
                   old_peers: frozenset[str] = frozenset(), evidence: str = "the answers") -> Timeline:
    """Last answer of ``old_engine`` (or of ``old_peers``, the other engines serving before the trigger), first answer
    of any other engine, from the answered requests."""
    ok = [o for o in outcomes if o.ok and o.sent_s >= 0]
    known = [o for o in ok if o.engine is not None]
    if old_engine is None or not known:
        # No incarnation evidence: the first success after the trigger may be the old engine's (stated).
        first = min(ok, key=lambda o: o.done_s, default=None)
        return Timeline(old_engine, first_new_s=first.done_s if first else None,
                        evidence="none: the first success after the trigger, old engine or not")
    olds = {old_engine, *old_peers}
    old = [o.done_s for o in known if o.engine in olds]
    new = sorted((o for o in known if o.engine not in olds), key=lambda o: o.done_s)
    return Timeline(old_engine, new[0].engine if new else None, max(old) if old else None,
                    new[0].done_s if new else None, evidence=f"per request: {evidence}",
                    old_peers=tuple(sorted(old_peers - {old_engine})))


@dataclass
class RestartRun:
    """Everything one restart scenario recorded."""

    controller: str
    restart: RestartResult | None
    restart_error: str | None
    triggered_wall: float
    streams: list[StreamOutcome] = field(default_factory=list)
    requests: list[RequestOutcome] = field(default_factory=list)
    recovery_s: float | None = None
    progress: list[str] = field(default_factory=list)
    timeline: Timeline | None = None
    #: Why no answer could name the engine that served it although the controller asked for that evidence
    #: (None: the evidence came, or the controller asks for none).
    evidence_missing: str | None = None
    #: The phase the scenario was in when it ran past its derived bound (None: it ended in time).
    timed_out: PhaseTimeout | None = None
    #: Why the scenario was not run at all (an earlier scenario of the session failed its phase).
    not_run: str | None = None
    budget: RestartBudget | None = None

    @classmethod
    def skipped(cls, controller: str, why: str) -> RestartRun:
        """A scenario not run: its checks are not judged, with ``why``."""
        return cls(controller, None, why, time.time(), not_run=why)

    def report(self) -> str:
        if self.not_run:
            return f"restart scenario not run: {self.not_run}"
        lines = [f"restart by {self.controller}: "
                 + (self.restart.summary() if self.restart else f"FAILED: {self.restart_error}")]
        if self.timed_out is not None:
            lines.insert(0, str(self.timed_out))
        if self.budget is not None:
            lines.append(f"bound: {self.budget.describe()}")
        lines += [s.line() for s in self.streams] + [r.line() for r in self.requests]
        lines.append(f"recovery: {self.recovery_s:.2f} s" if self.recovery_s is not None else "recovery: never")
        if self.timeline is not None:
            lines += ["timeline:"] + [f"  {t}" for t in self.timeline.lines()]
        return "\n".join(lines + ["progress:"] + [f"  {p}" for p in self.progress])

    def timeline_report(self) -> str:
        """The restart's timeline, request by request (the Allure attachment of the recovery check)."""
        tl = self.timeline.lines() if self.timeline else ["no request was sent during this restart"]
        return "\n".join(tl + [""] + [r.line() for r in self.requests])


# ----------------------------------------------------------------------------------------------- classification
def classify_stream(result: StreamResult) -> tuple[str, str]:
    """(verdict, detail) of one stream that was running during a restart."""
    if result.error_events:
        return "error_event", f"in-band error {quote_body(str(result.error_events[0]))}"
    if result.transport_error:
        return "transport_error", result.transport_error
    if result.status_code != 200:
        return "http_error", f"HTTP {result.status_code} {quote_body(result.http_error_text or '')}"
    if result.finish_reason and result.done:
        return "completed", f"finish_reason={result.finish_reason}, {len(result.content)} content chars"
    return "silently_truncated", (f"no finish_reason/[DONE] and no error: finish={result.finish_reasons}, "
                                  f"[DONE]={result.done}")


def _stream_body(model: str, spec: InFlightSpec) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": spec.prompt}], "stream": True,
            "max_tokens": spec.max_tokens, "min_tokens": spec.min_tokens,
            "stream_options": {"include_usage": True}}


def probe_body(model: str, spec: ProbeSpec, extras: dict[str, Any] | None = None) -> dict[str, Any]:
    """The probe request; ``extras`` adds the fields a controller needs for its evidence (``probe_extras``)."""
    return {"model": model, "messages": [{"role": "user", "content": spec.prompt}],
            "max_tokens": spec.max_tokens, **(extras or {})}


#: Where an answer's own engine evidence came from (the timeline names it).
ANSWER_EVIDENCE = {"nvext": "the Dynamo answer's nvext.worker_id (the worker that decoded it)",
                   "header": "the simulator's x-ml4-engine-instance header (a fallback: the deployment offered no "
                             "engine start time or InvocationID)"}


def answering_engine(r: httpx.Response, data: dict[str, Any]) -> tuple[str | None, str]:
    """The engine incarnation an answer names and where from (:data:`ANSWER_EVIDENCE`): the Dynamo worker that
    decoded it, else the simulator's header."""
    worker = ((data.get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
    if worker is not None:
        return str(worker), "nvext"
    header = next((r.headers[h] for h in ENGINE_HEADERS if h in r.headers), None)
    return (header, "header") if header is not None else (None, "")


def incarnation_answered(before: str | None, after: str | None) -> str | None:
    """The incarnation that answered a request, from the controller's samples around it: the same one on both
    sides; the one after when none ran before (the old engine was gone, so only a new one can have answered); the
    one before when none runs after (it answered, then stopped). A change during the request leaves it unknown."""
    if before is None or after is None:
        return before or after
    return after if before == after else None


class ProbeReply(NamedTuple):
    status: int | None
    retries: int | None
    error: str | None
    ok: bool
    engine: str | None = None
    evidence: str = ""       # ANSWER_EVIDENCE key of ``engine``


def send_probe(http: httpx.Client, body: dict[str, Any], expect: str | None = None) -> ProbeReply:
    """One non-streaming request: status, attempted retries, error text, answer ok, answering engine."""
    try:
        r = http.post("chat/completions", json=body)
    except httpx.HTTPError as err:
        return ProbeReply(None, None, f"{type(err).__name__}: {err}", False)
    if r.status_code != 200:
        return ProbeReply(r.status_code, None, quote_body(r.text, 400), False)
    try:
        data = r.json()
        msg = data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ProbeReply(r.status_code, None, f"malformed answer {quote_body(r.text)}", False)
    ok = expect is None or expect in (msg.get("content") or "")
    return ProbeReply(r.status_code, attempted_retries(r.headers), None, ok, *answering_engine(r, data))


def missing_identity_evidence(controller: Controller, body: dict[str, Any], engine: str | None) -> str | None:
    """Why the warm-up answer named no engine although the controller asked for it (``probe_extras``), or None."""
    extras = controller.probe_extras()
    if engine is not None or not extras:
        return None
    return (f"the answer before the restart named no engine although the request asked for it "
            f"({', '.join(f'{k}={body.get(k)}' for k in extras)}), so no answer can be told old engine from new; "
            f"likely cause: {controller.evidence_absent_cause}")


# ----------------------------------------------------------------------------------------------- the scenario
@fails_with("restart.not_serving_before", "the deployment did not serve before the restart")
def run_restart_scenario(controller: Controller, endpoint: Endpoint, *, spec: RestartRequests | None = None,
                         with_streams: bool = True, with_requests: bool = True, recovery_limit_s: float = 600.0,
                         progress: Progress | None = None, budget: RestartBudget | None = None,
                         http_factory: Callable[[Endpoint], httpx.Client] = make_httpx) -> RestartRun:
    """Restart under load and record what the clients saw (see the module docstring).

    ``with_streams``: long streams are running when the restart begins. ``with_requests``: short requests are sent
    every ``probe.interval_s`` while the restart runs. The suite runs them as two restarts: an engine that drains
    its streams on SIGTERM stays unreachable for the rest of their output, so new requests are judged on a restart
    of their own (the outage a proxy's retries must bridge is then the restart itself).

    ``budget`` (:class:`~pytest_ml4.control.budget.RestartBudget`) bounds each phase: the restart by its
    ``restart_s`` (each pod of a rolling restart by the workers' start time), the wait for the new engine's first
    answer by ``total_s`` when that is shorter than the recovery gate; past a bound the run records the phase
    (``timed_out``) instead of waiting on. ``progress`` gets each line the scenario and its controller say, with the
    elapsed time.
    """
    spec = spec or load_requests()
    flight, probe = spec.in_flight, spec.probe
    notes: list[str] = []

    def say(msg: str) -> None:
        line = f"{time.monotonic() - t_base:7.2f}s {msg}"
        notes.append(line)
        if progress:
            progress(line)

    t_base = time.monotonic()
    controller.prepare()
    body = probe_body(endpoint.model, probe, controller.probe_extras())
    with http_factory(endpoint) as http:
        # Warm-up: the deployment must serve before the restart, or the scenario would blame the restart for it.
        warm = send_probe(http, body)
    if warm.status != 200:
        fail("restart.not_serving_before",
             f"the deployment does not serve before the restart: HTTP {warm.status}: {warm.error}")
    # One kind of evidence for the whole timeline (engine ids of two kinds never compare): what the deployment
    # itself offers (an InvocationID, the engine's start time) when the controller reads one, else the answers'.
    by_incarnation = controller.incarnation()
    old_engine = by_incarnation or warm.engine
    evidence = (controller.incarnation_source if by_incarnation
                else ANSWER_EVIDENCE.get(warm.evidence, "none"))
    evidence_missing = missing_identity_evidence(controller, body, old_engine)
    old_peers = controller.engines()
    streams: list[StreamResult | None] = [None] * (flight.streams if with_streams else 0)

    sending = [threading.Event() for _ in streams]

    def stream_worker(i: int) -> None:
        with http_factory(endpoint) as http:
            sending[i].set()
            streams[i] = probe_chat_stream(http, _stream_body(endpoint.model, flight))

    stream_threads = [threading.Thread(target=stream_worker, args=(i,), daemon=True) for i in range(len(streams))]
    for th in stream_threads:
        th.start()
    for ev in sending:
        # A client takes a while to build on a busy machine: settle_s counts from the request, not the thread.
        ev.wait(flight.settle_s * 30)
    if with_streams:
        time.sleep(flight.settle_s)  # let them reach the decode phase: they are in flight when the restart hits

    box: dict[str, Any] = {}

    def restart_worker() -> None:
        try:
            box["result"] = controller.restart(timeout=budget.restart_s if budget else None, progress=say)
        except RestartTimeout as err:
            box["error"] = f"{type(err).__name__}: {err}"
            box["timeout"] = err
        except Exception as err:  # noqa: BLE001 - recorded and judged by the checks
            box["error"] = f"{type(err).__name__}: {err}"

    triggered_wall = time.time()
    t_trigger = time.monotonic()
    restarter = threading.Thread(target=restart_worker, daemon=True)
    restarter.start()

    outcomes: list[RequestOutcome] = []
    lock = threading.Lock()

    def request_worker(i: int) -> None:
        before = controller.incarnation() if by_incarnation else None
        sent = time.monotonic()
        with http_factory(endpoint) as http:
            reply = send_probe(http, body, probe.expect_substring)
        done = time.monotonic()
        engine = reply.engine
        if by_incarnation:
            engine = incarnation_answered(before, controller.incarnation()) if reply.ok else None
        with lock:
            outcomes.append(RequestOutcome(i, sent - t_trigger, done - sent, reply.status, reply.retries,
                                           reply.error, reply.ok, engine))

    senders: list[threading.Thread] = []
    while with_requests and restarter.is_alive():
        th = threading.Thread(target=request_worker, args=(len(senders),), daemon=True)
        th.start()
        senders.append(th)
        restarter.join(probe.interval_s)
    # The restart is bounded by the controller's own limit, not the recovery gate: a rolling restart of several
    # replicas outlasts the first new engine's answer, and the next scenario must not start while it still runs.
    # With a budget the restart thread ends by its own deadline (the controller's waits are bounded by it).
    restart_limit_s = (budget.restart_s + budget.answer_s if budget
                       else max(recovery_limit_s, controller.timeout_s))
    restarter.join(restart_limit_s)
    for th in senders:
        th.join(restart_limit_s)
    timeline = build_timeline(old_engine, outcomes, old_peers, evidence)
    # The gate judges a slow recovery; a budget shorter than the gate ends the wait as the phase's timeout.
    wait_s = min(recovery_limit_s, budget.total_s) if budget else recovery_limit_s
    deadline = t_trigger + wait_s
    if timeline.first_new_s is None and "error" not in box:
        say(f"{FIRST_ANSWER} (until +{wait_s:.0f} s after the trigger)")
    while timeline.first_new_s is None and "error" not in box and time.monotonic() < deadline:
        # No new engine has answered yet: keep asking until one does (bounded by the gate).
        request_worker(len(outcomes))
        timeline = build_timeline(old_engine, outcomes, old_peers, evidence)
        if timeline.first_new_s is None:
            time.sleep(probe.interval_s)
    for th in stream_threads:
        th.join(restart_limit_s)
    timed_out = _phase_timeout(box.get("timeout"), budget)
    if timed_out is None and budget and timeline.first_new_s is None and "error" not in box \
            and budget.total_s < recovery_limit_s:
        last = max(outcomes, key=lambda o: o.done_s).line() if outcomes else "no request was answered"
        timed_out = PhaseTimeout(FIRST_ANSWER, budget.total_s, time.monotonic() - t_trigger,
                                 "an answer of an engine other than the old ones", last)
    if timed_out is not None:
        say(str(timed_out))
    run = RestartRun(controller.kind, box.get("result"), box.get("error"), triggered_wall,
                     requests=sorted(outcomes, key=lambda o: o.index), recovery_s=timeline.first_new_s,
                     progress=notes, timeline=timeline, evidence_missing=evidence_missing, timed_out=timed_out,
                     budget=budget)
    for i, res in enumerate(streams):
        if res is None:
            run.streams.append(StreamOutcome(i, "silently_truncated", "the stream never returned", 0, False))
            continue
        verdict, detail = classify_stream(res)
        in_flight = res.t_start < t_trigger and (res.t_end is None or res.t_end > t_trigger)
        run.streams.append(StreamOutcome(i, verdict, detail, len(res.events), in_flight))
    return run


def _phase_timeout(err: RestartTimeout | None, budget: RestartBudget | None) -> PhaseTimeout | None:
    """The controller's timeout as the scenario's phase failure (its bound: the pod's or the whole restart's)."""
    if err is None or budget is None:
        return None
    bound = budget.worker_start_s if budget.pods > 1 else budget.restart_s
    return PhaseTimeout(err.phase or "waiting for the restart", bound, err.waited_s, err.what, err.last_seen)


class DynamoAnswer(Strict):
    """One answer a Dynamo frontend gives a client: ``status`` and a substring of the body ("" = any body)."""

    status: int
    body: str
    #: The transcript the answer was recorded in.
    source: str = Field("", repr=False)

    def matches(self, r: RequestOutcome) -> bool:
        return r.status == self.status and self.body in (r.error or "")

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.body!r}" if self.body else f"HTTP {self.status} (any body)"


class StaleRow(Strict):
    stale_window_s: tuple[float, float]
    answers: tuple[DynamoAnswer, ...]
    after_window: DynamoAnswer | None = None
    when: str
    avoided_by: str


class OutageRow(Strict):
    answers: tuple[DynamoAnswer, ...]


R = TypeVar("R", bound=Strict)


class ByDynamoVersion(Strict, Generic[R]):
    """A per-Dynamo-version table: ``dynamo: {"1.6.1": row, ...}``."""

    dynamo: dict[str, R] = Field(min_length=1)


def _version_row(path: Path, version: str | None, row: type[R]) -> tuple[str, R]:
    """The row of a per-Dynamo-version table; a target without a recorded version is judged by the one version
    measured for real (the lowest key)."""
    rows = load_yaml(path, ByDynamoVersion[row]).dynamo
    key = version if version in rows else min(rows)
    return key, rows[key]


@dataclass(frozen=True)
class StaleInstances:
    """A Dynamo frontend's stale-instance window (``pytest_ml4/data/restart/stale-instances.yaml``, per version): the
    answers while a gone worker is still listed, and what follows once no worker of the model is left."""

    version: str
    window_s: tuple[float, float]
    answers: tuple[DynamoAnswer, ...]
    after_window: DynamoAnswer | None
    when: str
    avoided_by: str

    @classmethod
    def for_dynamo(cls, version: str | None, path: Path = STALE_FILE) -> StaleInstances:
        key, row = _version_row(path, version, StaleRow)
        return cls(key, row.stale_window_s, row.answers, row.after_window, row.when, row.avoided_by)

    def explain(self, failed: list[RequestOutcome]) -> str | None:
        """The sentence on the failures that carry this frontend's stale-instance answers (None if none do)."""
        stale = [r for r in failed if any(a.matches(r) for a in self.answers)]
        if not stale:
            return None
        lo, hi = self.window_s
        seen = sorted({str(a) for r in stale for a in self.answers if a.matches(r)})
        after = (f"; then {self.after_window} while no worker of the model is left" if self.after_window else "")
        return (f"{len(stale)} of the failures are Dynamo {self.version}'s stale-instance answers ({', '.join(seen)}): "
                f"expected when {self.when}, for {lo:g}-{hi:g} s while the gone worker stays listed{after}; "
                f"{self.avoided_by}")


@dataclass(frozen=True)
class SingleReplicaOutage:
    """A Dynamo target with a worker role of ONE replica: a rolling restart of that role is an outage by
    construction (no peer to route or migrate to; the model is unlisted), so "no client error" cannot hold. What
    can: every failure is one of the frontend's documented answers (``pytest_ml4/data/dynamo/single-replica-outage.yaml``,
    per version) and the deployment answers again once the restart is done."""

    version: str
    roles: tuple[str, ...]
    answers: tuple[DynamoAnswer, ...]

    @classmethod
    def for_target(cls, target: Any, path: Path = OUTAGE_FILE) -> SingleReplicaOutage | None:
        release = stack_for(target).release(target)  # the outage's answers are per frontend release
        if release is None:
            return None
        topo = target.topology
        roles = tuple(r for r, fld in TOPOLOGY_ROLES.get(topo.kind, DEFAULT_ROLES).items() if getattr(topo, fld) == 1)
        if not roles:
            return None
        key, row = _version_row(path, release, OutageRow)
        return cls(key, roles, row.answers)

    def documented(self, r: RequestOutcome) -> bool:
        return any(a.matches(r) for a in self.answers)



def retries_seen(run: RestartRun) -> int:
    """Total ``x-litellm-attempted-retries`` over the successful requests sent during the restart."""
    return sum(r.retries or 0 for r in run.requests if r.ok)


