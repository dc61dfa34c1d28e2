"""The worker-engine record: what real ``dynamo.vllm`` workers serve a run.

The embedded deployment with real workers (``--sim-engine vllm`` on a Dynamo target,
``pytest_ml4_sim.deploy.real_dynamo``) builds one :class:`WorkerEngine` and puts its :meth:`~WorkerEngine.wire` form
in its description (plain data: the xdist controller hands it to its workers); the plugin's ``ml4_worker_engine``
fixture reads it back with :meth:`WorkerEngine.of`, and the checks, the suites and the report read its fields.
A simulated worker or a live target has no record (None): the declared Dynamo release is what runs.

Core code: no pytest, nothing of the harness.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: The key of the record in the Dynamo deployment's description (``DynamoSim.info()``).
INFO_KEY = "worker_engine"


class Emulation(BaseModel):
    """How the scripted model writes on 1.6.1 to stand for the declared Dynamo release (its ``emulation`` row in
    ``pytest_ml4/data/dynamo/versions.yaml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    version: str
    tool_form: Literal["legacy", "v11"]
    think_before_tool_call: bool


class WorkerEngine(BaseModel):
    """The real workers' releases, how many of each role were declared and started, and what the run emulates."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    #: The ``dynamo.vllm`` release the workers run (the wire key is the module's name, ``dynamo.vllm``).
    dynamo_vllm: str = Field(alias="dynamo.vllm")
    #: The vLLM release inside those workers.
    vllm: str
    declared: dict[str, int]
    started: dict[str, int]
    #: One line when this machine's memory started fewer workers than the target declares, else None.
    reduced: str | None = None
    #: The prefill -> decode KV transfer and its warm-up, on a disaggregated target, else None.
    disagg: str | None = None
    #: The declared release's emulation on 1.6.1, or None when the model writes as it does.
    emulation: Emulation | None = None

    def wire(self) -> dict[str, Any]:
        """Plain data for the deployment's description (keys as ``of`` reads them)."""
        return self.model_dump(by_alias=True)

    @classmethod
    def of(cls, dynamo_info: Mapping[str, Any] | None) -> WorkerEngine | None:
        """The record in a Dynamo deployment's description, or None (no real workers, or no Dynamo at all)."""
        raw = (dynamo_info or {}).get(INFO_KEY)
        return None if raw is None else cls.model_validate(raw)

    def reduced_to(self) -> dict[str, int] | None:
        """The workers per role the deployment started when it started fewer than declared, else None."""
        return dict(self.started) if self.reduced else None

    def release(self) -> tuple[str, str]:
        """The Dynamo release the workers are and a note on their vLLM (``" on vLLM 0.31.0"``)."""
        return self.dynamo_vllm, f" on vLLM {self.vllm}"

    def report_versions(self) -> dict[str, str]:
        """What the record adds to ``summary.json``'s versions and the Allure environment."""
        out = {"dynamo_worker": f"dynamo.vllm {self.dynamo_vllm}", "dynamo_worker_vllm": self.vllm}
        if self.reduced:
            out["deployment_reduced"] = self.reduced
        if self.disagg:
            out["dynamo_disagg"] = self.disagg
        if self.emulation:
            out["dynamo_emulation"] = (f"Dynamo {self.emulation.version} emulated on 1.6.1: tool calls in the "
                                       f"{self.emulation.tool_form} form, thinking before a tool call "
                                       f"{'on' if self.emulation.think_before_tool_call else 'off'}")
        return out
