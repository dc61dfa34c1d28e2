"""What the suite asks of a serving stack: the :class:`Stack` protocol, and the row-backed adapter the stacks share.

A check never tests a stack's name: it asks the target's stack (``pytest_ml4.stacks.stack_for(target)``) for what
differs between stacks (the health path, the metric families, whether a frontend routes to registered workers,
which release rows apply...). What a stack is lives in data: its row of ``pytest_ml4/data/stacks/stacks.yaml`` and
its engine's metric families ``pytest_ml4/data/<engine>/metrics.yaml``; code a stack needs beyond its row lives in
its module (``stacks/vllm.py``, ``stacks/litellm.py``, ``stacks/dynamo.py``).

Core (no pytest, no simulator).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

from pydantic import Field

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file

if TYPE_CHECKING:
    from pytest_ml4.target.model import Target

STACKS_FILE = data_file("stacks", "stacks.yaml")


class StackError(ValueError):
    """A stack the suite does not know, or a stack table that breaks its model; one line naming file and field."""


class StackRow(Strict):
    """One row of ``stacks.yaml`` (its header comment says what each field means)."""

    engine: str = Field(description="the stack a client reaches going around the proxy")
    proxy: str | None = Field(description="the proxy in front of the engine (serving.proxy.kind), or null")
    worker_engine: str = Field(description="the engine each worker runs (its metrics.yaml names the families)")
    health_path: str = Field(pattern=r"^/", description="liveness path at the endpoint's root")
    token_counter: str = Field(description="generated-token counter at the endpoint's metrics URL")
    routes_workers: bool = Field(description="a frontend routes requests to registered engine workers")
    engine_tokenize: bool = Field(description="the engine's /tokenize is at the metrics URL's root")
    release_field: str | None = Field(description="target field naming the frontend's release, or null")
    markers: dict[str, str] = Field(description="suite markers only this stack serves -> the stack's name in a skip")


class EngineMetrics(Strict):
    """An engine's ``metrics.yaml``: the family names its ``/metrics`` gives what the suite reads."""

    prefix: str = Field(description="the prefix every family of the engine carries (vllm:)")
    families: dict[str, str] = Field(description="what the suite reads -> the family name")


@runtime_checkable
class Stack(Protocol):
    """A serving stack as the suite's checks see it: only what the call sites ask."""

    #: The ``serving.stack`` value (the key of its rows in the per-stack tables: errors, tool conventions...).
    name: str
    #: The stack a client going around the proxy reaches (itself without a proxy).
    engine: str
    #: The proxy in front of the engine (``serving.proxy.kind``), or None.
    proxy: str | None
    health_path: str
    #: The generated-token counter the endpoint's metrics URL carries.
    token_counter: str
    #: A frontend routes requests to registered engine workers (their /metrics addressed apart, pods restarted).
    routes_workers: bool
    #: The engine's /tokenize answers at the root of the metrics URL.
    engine_tokenize: bool
    #: Suite markers only this stack serves -> how a skip reason names the stack.
    markers: Mapping[str, str]
    #: The prefix of every metric family of the workers' engine (``vllm:``).
    metric_prefix: str
    #: The target field naming the frontend's release whose rows apply (``serving.dynamo_version``), or None.
    release_field: str | None

    def engine_metric(self, key: str) -> str:
        """The family name the workers' engine gives ``key`` (``kv_cache_usage`` -> ``vllm:kv_cache_usage_perc``)."""
        ...

    def release(self, target: Target) -> str | None:
        """The frontend release whose behaviour rows apply to ``target`` (None: the engine's rows apply)."""
        ...

    def release_row(self, target: Target) -> Any:
        """The behaviour row of :meth:`release` (``DynamoBehaviour``), or None."""
        ...

    def sim_worker_engine_version(self) -> str | None:
        """The engine release real workers of this stack run under ``--sim-engine vllm`` (None: the target's)."""
        ...


@lru_cache(maxsize=4)
def stack_rows(path: Path = STACKS_FILE) -> dict[str, StackRow]:
    """Every row of the stack table (file, field and line in the error of a bad one)."""
    return load_yaml(path, dict[str, StackRow], "stack table")


@lru_cache(maxsize=8)
def engine_metrics(engine: str) -> EngineMetrics:
    """The metric families of ``engine`` (``pytest_ml4/data/<engine>/metrics.yaml``)."""
    return load_yaml(data_file(engine, "metrics.yaml"), EngineMetrics, "metric families")


@dataclass(frozen=True)
class RowStack:
    """A stack that is its row of ``stacks.yaml`` and its engine's metric families; a module subclasses it for
    what a row cannot say."""

    name: str
    engine: str
    proxy: str | None
    worker_engine: str
    health_path: str
    token_counter: str
    routes_workers: bool
    engine_tokenize: bool
    release_field: str | None
    markers: Mapping[str, str]

    @classmethod
    def from_table(cls, name: str, path: Path = STACKS_FILE) -> Self:
        rows = stack_rows(path)
        if name not in rows:
            raise StackError(f"{path}: no row for stack {name!r} (rows: {', '.join(rows)})")
        return cls(name=name, **dict(rows[name]))

    @property
    def metric_prefix(self) -> str:
        return engine_metrics(self.worker_engine).prefix

    def engine_metric(self, key: str) -> str:
        families = engine_metrics(self.worker_engine).families
        if key not in families:
            raise StackError(f"{data_file(self.worker_engine, 'metrics.yaml')}: field 'families.{key}': "
                             f"missing (stack {self.name} reads it)")
        return families[key]

    def release(self, target: Target) -> str | None:
        field = self.release_field
        return operator.attrgetter(field)(target) if field else None

    def release_row(self, target: Target) -> Any:
        return None

    def sim_worker_engine_version(self) -> str | None:
        return None
