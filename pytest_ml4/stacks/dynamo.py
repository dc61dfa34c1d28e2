"""Dynamo's frontend routing to vLLM workers: its row of ``pytest_ml4/data/stacks/stacks.yaml``, the frontend
release's behaviour row (:mod:`pytest_ml4.stacks.dynamo_versions`) and the engine its real workers run."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from pytest_ml4.stacks.base import RowStack, Stack
from pytest_ml4.stacks.dynamo_versions import DynamoBehaviour, row_for

if TYPE_CHECKING:
    from pytest_ml4.target.model import Target

NAME = "dynamo+vllm"


@dataclass(frozen=True)
class DynamoStack(RowStack):
    def release_row(self, target: Target) -> DynamoBehaviour | None:
        """The row of the release the target declares, the team's rows (``target.root``) first; an unknown
        release gets an assumed ``estimate`` row (:func:`row_for`)."""
        version = self.release(target)
        return row_for(version, getattr(target, "root", None)) if version else None

    def sim_worker_engine_version(self) -> str | None:
        # Real dynamo.vllm workers run the vLLM of the ai-dynamo 1.6.1 pins, not the target's engine.version.
        from pytest_ml4.runtime.installed import DYNAMO_VLLM_ENGINE_VERSION

        return DYNAMO_VLLM_ENGINE_VERSION


@lru_cache(maxsize=1)
def adapter() -> Stack:
    return DynamoStack.from_table(NAME)
