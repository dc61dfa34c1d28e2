"""Progress of a long sweep: which point runs, elapsed and remaining time, live throughput.

A real sweep is seven 300 s points (seed 000), most of an hour. :class:`SweepProgress` turns runner ticks into
one-line messages and hands them to ``write`` (the pytest plugin passes its terminal-reporter writer, which also
works under xdist and in CI logs, and stays quiet with ``-q``). Live throughput comes from the engine's
``/metrics`` (``vllm:generation_tokens_total`` or Dynamo's ``dynamo_frontend_output_tokens_total``) when a
metrics URL is known, else from aiperf's own completed-request count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_ml4.evidence.metrics import generated_tokens
from pytest_ml4.perf.runner import PhaseState


def _mmss(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


@dataclass
class _Live:
    at: float
    tokens: float


class SweepProgress:
    """Formats progress lines for a sweep of ``len(concurrencies)`` points of ``point_estimate_s`` each."""

    def __init__(self, write: Callable[[str], None], concurrencies: Sequence[int], point_estimate_s: float,
                 metrics_url: str | None = None, interval_s: float = 10.0, label: str = "perf") -> None:
        self.write = write
        self.concurrencies = list(concurrencies)
        self.point_estimate_s = point_estimate_s
        self.metrics_url = metrics_url
        self.interval_s = interval_s
        self.label = label
        self.t0 = time.monotonic()
        self.index = -1
        self._last_line = 0.0
        self._live: _Live | None = None
        self.lines: list[str] = []

    def _emit(self, text: str) -> None:
        line = f"[ml4 {self.label}] {text}"
        self.lines.append(line)
        self.write(line)

    def point_started(self, concurrency: int) -> None:
        self.index = self.concurrencies.index(concurrency) if concurrency in self.concurrencies else self.index + 1
        self._live = self._read_tokens()
        self._emit(f"point {self.index + 1}/{len(self.concurrencies)}: c{concurrency} started "
                   f"(sweep elapsed {_mmss(time.monotonic() - self.t0)}, ~{_mmss(self.remaining_s(0.0))} left)")

    def remaining_s(self, point_elapsed: float) -> float:
        left_points = len(self.concurrencies) - self.index - 1
        return max(self.point_estimate_s - point_elapsed, 0.0) + left_points * self.point_estimate_s

    def tick(self, point_elapsed: float, state: PhaseState) -> None:
        now = time.monotonic()
        if now - self._last_line < self.interval_s:
            return
        self._last_line = now
        c = self.concurrencies[self.index] if 0 <= self.index < len(self.concurrencies) else "?"
        phase = state.phase or "starting"
        self._emit(f"c{c} {phase}: point {_mmss(point_elapsed)}, sweep {_mmss(now - self.t0)}, "
                   f"~{_mmss(self.remaining_s(point_elapsed))} left{self._throughput(now, state)}")

    def point_done(self, concurrency: int, summary: str) -> None:
        self._emit(f"c{concurrency} done: {summary}")

    def _read_tokens(self) -> _Live | None:
        tokens = generated_tokens(self.metrics_url, timeout=2.0)
        return None if tokens is None else _Live(time.monotonic(), tokens)

    def _throughput(self, now: float, state: PhaseState) -> str:
        cur = self._read_tokens()
        if cur is not None and self._live is not None and cur.at > self._live.at:
            rate = (cur.tokens - self._live.tokens) / (cur.at - self._live.at)
            self._live = cur
            return f", live {rate:.0f} tok/s (engine /metrics)"
        if state.completed is not None:
            return f", {state.completed} request(s) completed (aiperf)"
        return ""
