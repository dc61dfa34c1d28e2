"""Restart controller for the embedded simulator process (a ``SimServer`` or ``DynamoSim``).

The restart is the simulator's own ``.restart()`` (stop the process, start a new one on the same port); readiness
is judged from outside like for a real engine: a new process, ``/health`` 200 and the model in ``/v1/models``.
"""

from __future__ import annotations

from typing import Any, Protocol

from pytest_ml4.control.base import (
    START_TIME_METRIC,
    Check,
    Controller,
    Progress,
    RestartError,
    engine_start_time,
    health_check,
    model_listed_check,
)


class RestartableSim(Protocol):
    url: str
    base_url: str

    @property
    def pid(self) -> int | None: ...

    def restart(self) -> Any: ...


class SimController(Controller):
    """Restart the simulator process behind the endpoint."""

    kind = "sim"

    def __init__(self, sim: RestartableSim, model: str, *, api_key: str | None = None, timeout_s: float = 120.0) -> None:
        super().__init__(timeout_s)
        if not hasattr(sim, "restart"):
            raise RestartError(f"{sim!r} cannot be restarted from here (a simulator owned by another process)")
        self.sim = sim
        self.model = model
        self._api_key = api_key
        self._old_pid: int | None = None

    def describe(self) -> str:
        return f"simulator at {self.sim.url}"

    @property
    def incarnation_source(self) -> str:  # type: ignore[override]
        return f"the engine's {START_TIME_METRIC} on {self.sim.url}/metrics, sampled before and after each request"

    def incarnation(self) -> str | None:
        """The engine process's start time, read as from a real vLLM server (its /metrics). A Dynamo frontend has
        no such gauge: None, and the scenario reads the answers' ``nvext.worker_id``."""
        return engine_start_time(self.sim.url + "/metrics")

    def prepare(self) -> None:
        # The simulator's next process starts in standby now, so the restart stops the engine at once.
        prepare = getattr(self.sim, "prepare_restart", None)
        if prepare is not None:
            prepare()

    def trigger(self, progress: Progress | None = None) -> dict[str, Any]:
        self._old_pid = self.sim.pid
        self.sim.restart()
        return {"old_pid": self._old_pid, "new_pid": self.sim.pid}

    def _new_process(self) -> str | None:
        pid = self.sim.pid
        if pid is None:
            return "no process"
        return None if pid != self._old_pid else f"still pid {pid}"

    def ready_checks(self) -> list[tuple[str, Check]]:
        return [("a new simulator process", self._new_process),
                ("engine /health 200", health_check(self.sim.url)),
                (f"{self.model} in /v1/models", model_listed_check(self.sim.base_url, self.model, self._api_key))]
