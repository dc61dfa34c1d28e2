"""vLLM serving the endpoint itself: its row of ``pytest_ml4/data/stacks/stacks.yaml`` is all there is to it (the
engine's per-release behaviour: :mod:`pytest_ml4.stacks.vllm_versions`)."""

from __future__ import annotations

from functools import lru_cache

from pytest_ml4.stacks.base import RowStack, Stack

NAME = "vllm"


@lru_cache(maxsize=1)
def adapter() -> Stack:
    return RowStack.from_table(NAME)
