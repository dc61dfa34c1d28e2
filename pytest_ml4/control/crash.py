"""A Dynamo worker crashing under a running stream (core, no pytest).

A pod deletion SIGTERMs the worker, which deregisters and drains its streams; a crash (OOM kill, node loss) is a
SIGKILL: no deregistration, no drain. What a client then sees is the frontend's doing
(shared/reference/real-dynamo-vllm.md "Worker loss"): with ``--migration-limit`` > 0 the stream continues on another
worker (the tokens generated so far re-sent as prompt, so ``prompt_tokens`` grows); without migration it ends with
the in-band event ``{"error":{"message":"Service temporarily unavailable","type":"service_unavailable","code":503}}``
then ``[DONE]``, no finish and no usage chunk.

:func:`run_crash` streams one fixed-length answer, has a :class:`Crasher` SIGKILL the worker serving it once
``kill_after_events`` data events arrived, reads the stream to its end and keeps a timeline;
:func:`pytest_ml4.checks.restart.assert_stream_survives_worker_crash` judges it against the frontend's
migration limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from pytest_ml4.client.endpoint import Endpoint, make_httpx
from pytest_ml4.client.stream_probe import StreamResult, parse_sse_lines

if TYPE_CHECKING:
    from pytest_ml4.control.scenario import CrashSpec

#: The fields of the in-band error event compared with the one real Dynamo 1.6.1 sends when a stream's worker dies
#: and migration is off (pytest_ml4/data/restart/requests.yaml ``crash.unmigrated_error``, from
#: real-dynamo-vllm-1.6.1-transcripts/kv/nomigration-sigkill-stream.txt).
ERROR_KEYS = ("message", "type", "code")


@dataclass
class Crash:
    """What a :class:`Crasher` killed: the worker (name, instance id, pid) and the processes it left behind."""

    worker: str
    instance_id: Any
    pid: int | None
    leftovers: list[str] = field(default_factory=list)
    wall: float = 0.0

    def line(self) -> str:
        left = "; ".join(self.leftovers) or "none"
        return (f"SIGKILL of {self.worker} (instance {self.instance_id}, pid {self.pid}); processes it left "
                f"running, ended by the controller: {left}")


class Crasher(Protocol):
    """Kills the worker that serves a running stream, the way a crash would."""

    def crash_busy_worker(self) -> Crash:
        """SIGKILL the worker running a request now, end what it leaves behind; :class:`NotJudged` if none can be
        told apart."""

    def migration_evidence(self, instance_id: Any) -> str | None:
        """The frontend's own log line naming a migration off ``instance_id``, or None."""

    def recover(self, timeout: float) -> None:
        """Bring the killed worker back (a replacement pod) and wait until the deployment serves, at most
        ``timeout`` seconds."""


@dataclass
class CrashRun:
    """One stream with a worker crash under it."""

    migration_limit: int
    stream: StreamResult
    crash: Crash | None
    events_before_kill: int
    timeline: list[tuple[float, str]]
    longest_gap_after_kill_s: float | None
    migration_log: str | None
    expected_error: dict[str, Any] = field(default_factory=dict)

    def report(self) -> str:
        lines = [f"worker crash under a stream (frontend --migration-limit {self.migration_limit})"]
        lines += [f"  +{t:6.2f} s  {what}" for t, what in self.timeline]
        if self.migration_log:
            lines.append(f"  frontend log: {self.migration_log}")
        lines.append("  stream: " + self.stream.describe().replace("\n", "\n    "))
        return "\n".join(lines)


def _stream_body(model: str, spec: CrashSpec) -> dict[str, Any]:
    n = spec.max_tokens
    return {"model": model, "messages": [{"role": "user", "content": spec.prompt}], "max_tokens": n,
            "min_tokens": spec.min_tokens, "stream": True, "stream_options": {"include_usage": True},
            "nvext": {"extra_fields": ["worker_id"]}}


def _read(http: httpx.Client, body: dict[str, Any], on_data: Callable[[int], None]) -> tuple[list[str],
                                                                                              list[float], int]:
    lines: list[str] = []
    times: list[float] = []
    data = 0
    with http.stream("POST", "chat/completions", json=body) as r:
        status = r.status_code
        if status != 200:
            r.read()
            return [r.text], [time.monotonic()], status
        for line in r.iter_lines():
            lines.append(line)
            times.append(time.monotonic())
            if line.startswith("data:"):
                data += 1
                on_data(data)
    return lines, times, status


def run_crash(endpoint: Endpoint, crasher: Crasher, spec: CrashSpec, migration_limit: int,
              recover: bool = True, recover_s: float = 240.0) -> CrashRun:
    """Stream ``spec`` (``prompt``, ``max_tokens``, ``min_tokens``, ``kill_after_events``), SIGKILL its worker
    after ``kill_after_events`` data events, read the stream to its end, then bring the worker back within
    ``recover_s`` (the suite derives it from the workers' start time; unless ``recover`` is False: the caller
    tears the deployment down anyway)."""
    body = _stream_body(endpoint.model, spec)
    after = spec.kill_after_events
    t0 = time.monotonic()
    timeline: list[tuple[float, str]] = [(0.0, f"stream sent (max_tokens = min_tokens = {body['max_tokens']})")]
    crashes: list[tuple[float, Crash]] = []

    def on_data(n: int) -> None:
        if n == 1:
            timeline.append((time.monotonic() - t0, "first event"))
        if n == after and not crashes:
            crash = crasher.crash_busy_worker()
            crashes.append((time.monotonic(), crash))
            timeline.append((time.monotonic() - t0, f"after {n} events: {crash.line()}"))

    with make_httpx(endpoint) as http:
        lines, times, status = _read(http, body, on_data)
    stream = parse_sse_lines(lines, request=body, times=times, status_code=status)
    killed_at = crashes[0][0] if crashes else None
    gap = None
    if killed_at is not None:
        later = [t for t, line in zip(times, lines) if t >= killed_at and line.startswith("data:")]
        marks = [killed_at, *later]
        gap = max((b - a for a, b in pairwise(marks)), default=None)
    end = times[-1] - t0 if times else time.monotonic() - t0
    timeline.append((end, stream_ending(stream)))
    crash = crashes[0][1] if crashes else None
    evidence = crasher.migration_evidence(crash.instance_id) if crash is not None else None
    if crash is not None and recover:
        crasher.recover(recover_s)
        timeline.append((time.monotonic() - t0, f"{crash.worker} replaced, deployment serving again"))
    return CrashRun(migration_limit, stream, crash, after, timeline, gap, evidence,
                    expected_error=dict(spec.unmigrated_error))


def stream_ending(stream: StreamResult) -> str:
    usage = stream.usage or {}
    if stream.error_events:
        return f"stream ended with the in-band error {stream.error_events[0]} (done={stream.done})"
    return (f"stream ended: finish_reason={stream.finish_reason}, completion_tokens="
            f"{usage.get('completion_tokens')}, prompt_tokens={usage.get('prompt_tokens')}, done={stream.done}")


