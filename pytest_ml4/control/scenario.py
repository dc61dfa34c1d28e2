"""The restart scenario and its checks (core, no pytest): what clients see while a deployment restarts.

:func:`run_restart_scenario` starts long streams, restarts the engine through a :class:`Controller` while they
run, keeps sending short requests during the restart, then measures recovery (the first request sent after the
restart began that succeeds). The ``check_*`` functions judge the recorded :class:`RestartRun` and raise
``AssertionError`` with a message that quotes what the client got (the proxy's error body, the in-band error).

Verdicts of an in-flight stream (tooling.md §3.6: "Every stream check must look for ``error`` events and for a
final ``finish_reason`` + ``[DONE]``"): ``completed`` (finish_reason and ``[DONE]``), ``error_event`` (an in-band
``{"error": ...}``), ``transport_error`` (the connection broke and the client saw it), ``http_error``, and the
one that fails the suite: ``silently_truncated`` (the stream ended with neither a finish nor an error).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from pytest_ml4.client import Endpoint, make_httpx, quote_body
from pytest_ml4.control.base import Controller, Progress, RestartResult
from pytest_ml4.probe import StreamResult, probe_chat_stream
from pytest_ml4.proxy import attempted_retries
from pytest_ml4.targets import FIXTURES_DIR

REQUESTS_FILE = FIXTURES_DIR / "restart" / "requests.yaml"
BAD_VERDICTS = ("silently_truncated",)


def load_requests(path: Path = REQUESTS_FILE) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


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

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    def line(self) -> str:
        state = f"HTTP {self.status}" if self.status is not None else "no response"
        extra = f", retries {self.retries}" if self.retries is not None else ""
        err = f": {self.error}" if self.error else ""
        return f"request {self.index} sent at +{self.sent_s:.2f}s: {state} in {self.elapsed_s:.2f}s{extra}{err}"


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

    def report(self) -> str:
        lines = [f"restart by {self.controller}: "
                 + (self.restart.summary() if self.restart else f"FAILED: {self.restart_error}")]
        lines += [s.line() for s in self.streams] + [r.line() for r in self.requests]
        lines.append(f"recovery: {self.recovery_s:.2f} s" if self.recovery_s is not None else "recovery: never")
        return "\n".join(lines + ["progress:"] + [f"  {p}" for p in self.progress])


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


def _stream_body(model: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": spec["prompt"]}], "stream": True,
            "max_tokens": spec["max_tokens"], "min_tokens": spec["min_tokens"],
            "stream_options": {"include_usage": True}}


def probe_body(model: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": spec["prompt"]}],
            "max_tokens": spec["max_tokens"]}


def send_probe(http: httpx.Client, body: dict[str, Any], expect: str | None = None) -> tuple[int | None, int | None,
                                                                                               str | None, bool]:
    """One non-streaming request: (status, attempted retries, error text, answer ok)."""
    try:
        r = http.post("chat/completions", json=body)
    except httpx.HTTPError as err:
        return None, None, f"{type(err).__name__}: {err}", False
    if r.status_code != 200:
        return r.status_code, None, quote_body(r.text, 400), False
    try:
        msg = r.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return r.status_code, None, f"malformed answer {quote_body(r.text)}", False
    ok = expect is None or expect in (msg.get("content") or "")
    return r.status_code, attempted_retries(r.headers), None, ok


# ----------------------------------------------------------------------------------------------- the scenario
def run_restart_scenario(controller: Controller, endpoint: Endpoint, *, spec: dict[str, Any] | None = None,
                         with_streams: bool = True, with_requests: bool = True, recovery_limit_s: float = 600.0,
                         progress: Progress | None = None,
                         http_factory: Callable[[Endpoint], httpx.Client] = make_httpx) -> RestartRun:
    """Restart under load and record what the clients saw (see the module docstring).

    ``with_streams``: long streams are running when the restart begins. ``with_requests``: short requests are sent
    every ``probe.interval_s`` while the restart runs. The suite runs them as two restarts: an engine that drains
    its streams on SIGTERM stays unreachable for the rest of their output, so new requests are judged on a restart
    of their own (the outage a proxy's retries must bridge is then the restart itself).
    """
    spec = spec or load_requests()
    flight, probe = spec["in_flight"], spec["probe"]
    notes: list[str] = []

    def say(msg: str) -> None:
        notes.append(f"{time.monotonic() - t_base:7.2f}s {msg}")
        if progress:
            progress(msg)

    t_base = time.monotonic()
    body = probe_body(endpoint.model, probe)
    with http_factory(endpoint) as http:
        # Warm-up: the deployment must serve before the restart, or the scenario would blame the restart for it.
        status, _, error, _ = send_probe(http, body)
    if status != 200:
        raise AssertionError(f"the deployment does not serve before the restart: HTTP {status}: {error}")
    streams: list[StreamResult | None] = [None] * (int(flight["streams"]) if with_streams else 0)

    def stream_worker(i: int) -> None:
        with http_factory(endpoint) as http:
            streams[i] = probe_chat_stream(http, _stream_body(endpoint.model, flight))

    stream_threads = [threading.Thread(target=stream_worker, args=(i,), daemon=True) for i in range(len(streams))]
    for th in stream_threads:
        th.start()
    if with_streams:
        time.sleep(float(flight["settle_s"]))  # let them reach the decode phase: they are in flight when the restart hits

    box: dict[str, Any] = {}

    def restart_worker() -> None:
        try:
            box["result"] = controller.restart(progress=say)
        except Exception as err:  # noqa: BLE001 - recorded and judged by the checks
            box["error"] = f"{type(err).__name__}: {err}"

    triggered_wall = time.time()
    t_trigger = time.monotonic()
    restarter = threading.Thread(target=restart_worker, daemon=True)
    restarter.start()

    outcomes: list[RequestOutcome] = []
    lock = threading.Lock()

    def request_worker(i: int) -> None:
        sent = time.monotonic()
        with http_factory(endpoint) as http:
            status, retries, error, ok = send_probe(http, body, probe.get("expect_substring"))
        with lock:
            outcomes.append(RequestOutcome(i, sent - t_trigger, time.monotonic() - sent, status, retries, error, ok))

    senders: list[threading.Thread] = []
    while with_requests and restarter.is_alive():
        th = threading.Thread(target=request_worker, args=(len(senders),), daemon=True)
        th.start()
        senders.append(th)
        restarter.join(float(probe["interval_s"]))
    restarter.join(recovery_limit_s)
    for th in senders:
        th.join(recovery_limit_s)
    recovery = _first_success(outcomes)
    deadline = t_trigger + recovery_limit_s
    while recovery is None and "error" not in box and time.monotonic() < deadline:
        # Nothing sent during the restart succeeded yet: keep asking until one does (bounded by the gate).
        request_worker(len(outcomes))
        recovery = _first_success(outcomes)
        if recovery is None:
            time.sleep(float(probe["interval_s"]))
    for th in stream_threads:
        th.join(recovery_limit_s)
    run = RestartRun(controller.kind, box.get("result"), box.get("error"), triggered_wall,
                     requests=sorted(outcomes, key=lambda o: o.index), recovery_s=recovery, progress=notes)
    for i, res in enumerate(streams):
        if res is None:
            run.streams.append(StreamOutcome(i, "silently_truncated", "the stream never returned", 0, False))
            continue
        verdict, detail = classify_stream(res)
        in_flight = res.t_start < t_trigger and (res.t_end is None or res.t_end > t_trigger)
        run.streams.append(StreamOutcome(i, verdict, detail, len(res.events), in_flight))
    return run


def _first_success(outcomes: list[RequestOutcome]) -> float | None:
    done = [o.sent_s + o.elapsed_s for o in outcomes if o.ok and o.sent_s >= 0]
    return min(done) if done else None


# ----------------------------------------------------------------------------------------------- checks
def check_restart_finished(run: RestartRun) -> RestartResult:
    if run.restart is None:
        raise AssertionError(f"the restart did not complete: {run.restart_error}\n{run.report()}")
    return run.restart


def check_streams(run: RestartRun) -> dict[str, int]:
    """Every in-flight stream ended detectably (completed or a detected error); returns verdict counts."""
    counts: dict[str, int] = {}
    for s in run.streams:
        counts[s.verdict] = counts.get(s.verdict, 0) + 1
    not_in_flight = [s for s in run.streams if not s.in_flight_at_restart]
    if not_in_flight:
        raise AssertionError("the scenario is invalid: these streams were not running when the restart began:\n"
                             + "\n".join(s.line() for s in not_in_flight))
    bad = [s for s in run.streams if s.verdict in BAD_VERDICTS]
    if bad:
        raise AssertionError("in-flight streams ended without a finish_reason, [DONE] or an error the client could "
                             "detect:\n" + "\n".join(s.line() for s in bad))
    return counts


def check_client_errors(run: RestartRun, allowed: bool) -> list[RequestOutcome]:
    """New requests during the restart: with ``allowed`` False every one must succeed; returns the failures.

    A failure message quotes what the client got, e.g. the LiteLLM proxy's
    ``litellm.InternalServerError ... Cannot connect to host`` body when retries are off.
    """
    if not run.requests:
        raise AssertionError("no request was sent during the restart: the scenario measured nothing")
    failed = [r for r in run.requests if not r.ok]
    if failed and not allowed:
        first = failed[0]
        took = f"{run.restart.ready_s:.1f} s" if run.restart else f"too long ({run.restart_error})"
        raise AssertionError(
            f"{len(failed)} of {len(run.requests)} requests sent during the restart failed, but the target allows "
            f"no client-visible error during a restart (gates.restart_client_errors_allowed: false); the restart "
            f"took {took}.\nfirst failure: HTTP {first.status}: {first.error}\n"
            + "\n".join(r.line() for r in run.requests))
    wrong = [r for r in run.requests if r.ok and not r.answer_ok]
    if wrong:
        raise AssertionError("requests answered 200 during the restart with a wrong answer:\n"
                             + "\n".join(r.line() for r in wrong))
    return failed


def retries_seen(run: RestartRun) -> int:
    """Total ``x-litellm-attempted-retries`` over the successful requests sent during the restart."""
    return sum(r.retries or 0 for r in run.requests if r.ok)


def check_recovery(run: RestartRun, limit_s: float) -> float:
    if run.recovery_s is None:
        raise AssertionError(f"no request succeeded within {limit_s:.0f} s of the restart\n{run.report()}")
    if run.recovery_s > limit_s:
        raise AssertionError(f"recovery took {run.recovery_s:.1f} s, over the target's limit of {limit_s:.0f} s "
                             f"(gates.recovery_time_s_max)")
    return run.recovery_s
