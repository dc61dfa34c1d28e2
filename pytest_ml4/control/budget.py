"""How long a restart scenario may take, derived from the target, and the phase it was in when it ran out.

A restart scenario (streams in flight, requests sent throughout, a worker crash, the prefill pods replaced, each
role's rolling restart) waits in three phases, each with a bound of its own:

* :data:`LEAVE`: the old worker leaving (its pod gone, its process drained);
* :data:`REGISTER`: the new worker registering (replacement pod Ready, listed by the frontend, model listed);
* :data:`FIRST_ANSWER`: the first answer of the new engine (requests until one of a new incarnation answers).

The leave and register phases of one pod share the workers' declared start time (``control.worker_start_s``:
from a pod's deletion to its replacement registered); a rolling restart replaces ``pods`` of them one after
another, a restart of all at once replaces them together (one start time). The first answer is allowed the
proxy's retry window (what its retries keep one request waiting) plus one probe's own deadline. Past a bound the
scenario stops and says which phase it was in and what it saw last (:class:`PhaseTimeout`); the checks that
depend on it are then not judged with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_ml4.datafile import load_yaml
from pytest_ml4.locations import data_file

#: control.worker_start_s of the embedded deployments, per --sim-engine.
DEPLOYMENT_START_FILE = data_file("restart", "deployment-start.yaml")

LEAVE = "waiting for the old worker to leave"
REGISTER = "waiting for the new worker to register"
FIRST_ANSWER = "waiting for the first answer of the new engine"


@dataclass(frozen=True)
class RestartBudget:
    """The derived bounds of one restart scenario (seconds)."""

    worker_start_s: float   # control.worker_start_s: one pod's deletion to its replacement registered
    pods: int               # pods replaced one after another (1 when all are replaced at once)
    retry_window_s: float   # what the proxy's retries bridge (0 without a proxy)
    answer_s: float         # one probe's own deadline (connect, first byte, its max_tokens at the slow ITL)

    @property
    def restart_s(self) -> float:
        """The leave and register phases of every pod: the restart itself."""
        return self.worker_start_s * self.pods

    @property
    def first_answer_s(self) -> float:
        return self.retry_window_s + self.answer_s

    @property
    def total_s(self) -> float:
        return self.restart_s + self.first_answer_s

    def describe(self) -> str:
        return (f"{self.total_s:.0f} s = {self.pods} pod(s) x control.worker_start_s {self.worker_start_s:g} s "
                f"+ proxy retry window {self.retry_window_s:.1f} s + one probe's deadline {self.answer_s:.1f} s")

    @classmethod
    def for_target(cls, target: Any, *, pods: int, retry_window_s: float = 0.0,
                   probe_max_tokens: int = 256) -> RestartBudget:
        """From the target: its workers' declared start time, the request deadlines derived from it."""
        from pytest_ml4.client.transport import Deadlines

        deadlines = Deadlines.for_target(target)
        answer = deadlines.connect_s + deadlines.overall_for(probe_max_tokens, deadlines.first_byte_s)
        return cls(float(target.control.worker_start_s), max(1, pods), retry_window_s, answer)


def deployment_start_overrides(sim_engine: str, path: Path = DEPLOYMENT_START_FILE) -> dict[str, Any]:
    """The target fields an embedded deployment of ``sim_engine`` sets: its workers' start time."""
    table = load_yaml(path, dict[str, float])
    if sim_engine not in table:
        raise ValueError(f"{path}: no worker start time for --sim-engine {sim_engine!r} (known: {sorted(table)})")
    return {"control": {"worker_start_s": table[sim_engine]}}


def pods_replaced_in_turn(controller: Any) -> int:
    """How many pods a restart replaces one after another: every pod of the controller's roles when it rolls,
    else one (all together, or a single engine)."""
    if not getattr(controller, "rolling", False):
        return 1
    return sum(len(controller.pods(role)) for role in controller.roles)


class PhaseTimeout(AssertionError):
    """A restart scenario ran past the bound of the phase it was in: names the phase, the bound and what was last
    seen. An AssertionError: the scenario's own check fails with it; the checks depending on it are not judged."""

    def __init__(self, phase: str, bound_s: float, waited_s: float, what: str, last_seen: str) -> None:
        self.phase, self.bound_s, self.waited_s, self.last_seen = phase, bound_s, waited_s, last_seen
        super().__init__(f"restart scenario past its deadline while {phase} (bound {bound_s:.0f} s, waited "
                         f"{waited_s:.1f} s for {what}); last seen: {last_seen}")
