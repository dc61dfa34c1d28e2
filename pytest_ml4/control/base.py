"""The restart-controller interface shared by the simulator, systemd and Kubernetes/Dynamo controllers.

A controller restarts the engine of one deployment and waits until it serves again, bounded in time, naming
what it waits for while it waits (through a ``progress`` callback and the ``pytest_ml4.control`` logger) and
timing every step. A restart that does not finish in time raises :class:`RestartTimeout`, whose message says
which condition was still unmet and what was last seen.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_ml4.control.budget import REGISTER
from pytest_ml4.evidence.metrics import MetricsError, scrape

log = logging.getLogger("pytest_ml4.control")

Progress = Callable[[str], None]
#: A readiness probe: None when the condition holds, else a short description of what is seen instead.
Check = Callable[[], "str | None"]
#: How often a condition is polled; short because the simulator restarts in about a second.
POLL_S = 0.1
#: A still-unmet condition is re-announced this often so a long restart shows it is alive.
ANNOUNCE_EVERY_S = 15.0


class RestartError(RuntimeError):
    """A restart could not be started (command failed, nothing to restart)."""


class RestartTimeout(RestartError):
    """A restart did not finish in time; the message names the unmet condition and the last state seen, and
    ``phase`` the restart phase it was in (:mod:`pytest_ml4.control.budget`; "" when the wait names none)."""

    def __init__(self, message: str, *, phase: str = "", what: str = "", last_seen: str = "",
                 waited_s: float = 0.0) -> None:
        super().__init__(message)
        self.phase, self.what, self.last_seen, self.waited_s = phase, what, last_seen, waited_s


@dataclass
class WaitStep:
    """One condition waited for, how long it took and the states passed through."""

    what: str
    seconds: float
    seen: list[str] = field(default_factory=list)


@dataclass
class RestartResult:
    """Outcome of one restart: what was restarted, when, how long until ready, and the steps waited for."""

    controller: str
    target: str
    started_wall: float
    trigger_s: float
    ready_s: float
    steps: list[WaitStep] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        parts = ", ".join(f"{s.what} {s.seconds:.1f}s" for s in self.steps)
        return f"{self.controller} restart of {self.target}: ready after {self.ready_s:.1f} s ({parts})"


def _say(progress: Progress | None, message: str) -> None:
    log.info(message)
    if progress is not None:
        progress(message)


#: The engine process's start time on a vLLM server's /metrics (prometheus_client's process collector; real vLLM
#: 0.32 and 0.33 export it): a new value is a new engine process, whatever supervises it.
START_TIME_METRIC = "process_start_time_seconds"


def engine_start_time(metrics_url: str, timeout: float = 2.0) -> str | None:
    """The engine process's start time from its /metrics (None while it does not answer, or without the gauge)."""
    try:
        started = scrape(metrics_url, timeout=timeout).value(START_TIME_METRIC)
    except MetricsError:
        return None
    return None if started is None else f"started {started:.2f}"


def wait_for(what: str, check: Check, deadline: float, progress: Progress | None = None,
             interval: float = POLL_S, phase: str = "") -> WaitStep:
    """Poll ``check`` until it returns None or the monotonic ``deadline`` passes (then :class:`RestartTimeout`
    naming ``phase``, the restart phase this wait belongs to)."""
    start = time.monotonic()
    seen: list[str] = []
    _say(progress, f"{phase}: {what}" if phase else f"waiting for {what}")
    last_announce = start
    while True:
        try:
            state = check()
        except Exception as err:  # noqa: BLE001 - a probe that raises is a state, not a verdict: keep waiting until the deadline
            state = f"{type(err).__name__}: {err}"
        if state is None:
            step = WaitStep(what, time.monotonic() - start, seen)
            _say(progress, f"done waiting for {what} after {step.seconds:.1f} s")
            return step
        if not seen or seen[-1] != state:
            seen.append(state)
            _say(progress, f"waiting for {what}: {state}")
        now = time.monotonic()
        if now >= deadline:
            raise RestartTimeout(f"timed out after {now - start:.1f} s waiting for {what}; last seen: {state}"
                                 + (f" (phase: {phase})" if phase else ""),
                                 phase=phase, what=what, last_seen=state, waited_s=now - start)
        if now - last_announce >= ANNOUNCE_EVERY_S:
            last_announce = now
            _say(progress, f"still waiting for {what} ({now - start:.0f} s of {deadline - start:.0f} s"
                           + (f", {phase}" if phase else "") + f"): {state}")
        time.sleep(min(interval, max(0.0, deadline - now)))


class Controller(ABC):
    """Restart one deployment's engine and wait until it serves again."""

    kind: str = "abstract"

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    @abstractmethod
    def describe(self) -> str:
        """What this controller restarts, for messages and reports (no secrets)."""

    @abstractmethod
    def trigger(self, progress: Progress | None = None) -> dict[str, Any]:
        """Start the restart; returns details worth reporting (e.g. the pods deleted)."""

    @abstractmethod
    def ready_checks(self) -> list[tuple[str, Check]]:
        """The conditions that together mean "serving again", in the order they are waited for."""

    def prepare(self) -> None:
        """Get ready to restart without disturbing the engine (the scenario calls it before its streams start)."""

    #: What :meth:`incarnation` reads, for the restart timeline ("" when the controller has no such signal).
    incarnation_source: str = ""

    def incarnation(self) -> str | None:
        """Which engine incarnation runs now (systemd InvocationID, the engine process's start time), or None when
        unknown or down.

        The restart scenario samples it before and after each request: a request with the same incarnation on
        both sides was answered by that engine. Controllers without such a signal return None (the scenario then
        relies on the answer's own evidence: a Dynamo answer's ``nvext.worker_id``, or, as a named fallback, the
        simulator's ``x-ml4-engine-instance`` header).
        """
        return None

    def engines(self) -> frozenset[str]:
        """Every engine incarnation serving now, where the controller can list them (replicas), else empty: the
        restart scenario counts an answer of any of them, taken before the trigger, as the old engine's."""
        return frozenset()

    #: Why answers may lack the evidence :meth:`probe_extras` asks for (said when a check cannot judge without it).
    evidence_absent_cause: str = "unknown"

    def probe_extras(self) -> dict[str, Any]:
        """Request fields that make an answer name its engine (the scenario's per-request evidence), if any."""
        return {}

    #: The declared time of one worker's replacement (``control.worker_start_s``): a rolling restart bounds each
    #: pod's leave and register phases by it (None: only the restart's whole limit applies).
    worker_start_s: float | None = None
    #: The monotonic time the running restart must be done by (set by :meth:`restart` before the trigger).
    restart_deadline: float | None = None

    def phase_of(self, what: str) -> str:
        """The restart phase a readiness condition belongs to (:mod:`pytest_ml4.control.budget`): the new engine
        coming up, unless a controller says otherwise."""
        return REGISTER

    def wait_ready(self, timeout: float | None = None, progress: Progress | None = None) -> list[WaitStep]:
        deadline = time.monotonic() + (self.timeout_s if timeout is None else timeout)
        return [wait_for(what, check, deadline, progress, phase=self.phase_of(what))
                for what, check in self.ready_checks()]

    def restart(self, timeout: float | None = None, progress: Progress | None = None) -> RestartResult:
        """Trigger the restart, then wait for every readiness condition; the whole is bounded by ``timeout``."""
        budget = self.timeout_s if timeout is None else timeout
        wall = time.time()
        t0 = time.monotonic()
        self.restart_deadline = t0 + budget
        _say(progress, f"restarting {self.describe()} (limit {budget:.0f} s)")
        details = self.trigger(progress)
        trigger_s = time.monotonic() - t0
        steps = self.wait_ready(max(0.0, budget - trigger_s), progress)
        result = RestartResult(self.kind, self.describe(), wall, trigger_s, time.monotonic() - t0, steps, details)
        _say(progress, result.summary())
        return result


# ---------------------------------------------------------------------------------------------- endpoint checks
def health_check(root_url: str, path: str = "/health", timeout: float = 2.0) -> Check:
    """``GET root_url + path`` answers 200."""
    def check() -> str | None:
        try:
            r = httpx.get(root_url.rstrip("/") + path, timeout=timeout)
        except httpx.HTTPError as err:
            return f"{path}: {type(err).__name__}"
        return None if r.status_code == 200 else f"{path}: HTTP {r.status_code} {r.text[:120]!r}"
    return check


def _list_models(base_url: str, api_key: str | None, timeout: float) -> tuple[list[str] | None, str]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=timeout)
    except httpx.HTTPError as err:
        return None, f"/v1/models: {type(err).__name__}"
    if r.status_code != 200:
        return None, f"/v1/models: HTTP {r.status_code}"
    try:
        return [m.get("id") for m in r.json().get("data", [])], ""
    except (ValueError, AttributeError):
        return None, f"/v1/models: not JSON {r.text[:80]!r}"


def models_listed(base_url: str, api_key: str | None = None, timeout: float = 2.0) -> list[str] | None:
    """The model ids ``/v1/models`` lists now, or None when it does not answer 200 with JSON."""
    return _list_models(base_url, api_key, timeout)[0]


def model_listed_check(base_url: str, model: str, api_key: str | None = None, timeout: float = 2.0) -> Check:
    """``GET base_url/models`` lists ``model``."""
    def check() -> str | None:
        ids, problem = _list_models(base_url, api_key, timeout)
        if ids is None:
            return problem
        return None if model in ids else f"/v1/models lists {ids}, not {model!r}"
    return check
