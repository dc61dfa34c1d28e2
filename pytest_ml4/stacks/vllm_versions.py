"""Per-vLLM-version wire behaviour (``pytest_ml4/data/vllm/versions.yaml``), read by the simulator and the checks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import StrictBool

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file

VERSIONS_FILE = data_file("vllm", "versions.yaml")


class ChunkKeys(Strict):
    kv_transfer_params: StrictBool
    weight_versions: StrictBool


class VllmRow(Strict):
    """One row of ``versions.yaml`` (its comments say what each field means)."""

    reasoning_field: str
    reasoning_efforts: list[str]
    default_reasoning_effort: str | None = None
    chunk_keys: ChunkKeys
    eos_finish_delta_empty: StrictBool
    metrics_content_type: str
    metrics_families_extra: list[str]
    tokenize_endpoint: StrictBool


class VllmTable(Strict):
    versions: dict[str, VllmRow]


@dataclass(frozen=True)
class VllmVersion:
    """One row of the table (see the YAML's comments for each field)."""

    key: str
    reasoning_field: str
    reasoning_efforts: tuple[str, ...]
    default_reasoning_effort: str | None
    kv_transfer_params: bool
    weight_versions: bool
    eos_finish_delta_empty: bool
    metrics_content_type: str
    metrics_families_extra: tuple[str, ...]
    tokenize_endpoint: bool


def _major_minor(version: str) -> tuple[int, int]:
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in version.split("+")[0].split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def load_versions(path: Path = VERSIONS_FILE) -> dict[str, VllmRow]:
    """The rows of a versions table (a bad one: file, line and field in one line)."""
    return load_yaml(path, VllmTable, "vLLM versions table").versions


@lru_cache(maxsize=1)
def _table() -> dict[tuple[int, int], tuple[str, VllmRow]]:
    return {_major_minor(key): (key, row) for key, row in load_versions().items()}


@lru_cache(maxsize=16)
def for_version(version: str) -> VllmVersion:
    """The row for ``version`` (greatest key <= its major.minor; older than every key: the oldest row)."""
    table = _table()
    mm = _major_minor(version)
    key, row = table[max((k for k in table if k <= mm), default=min(table))]
    return VllmVersion(key=key, reasoning_field=row.reasoning_field, reasoning_efforts=tuple(row.reasoning_efforts),
                       default_reasoning_effort=row.default_reasoning_effort,
                       kv_transfer_params=row.chunk_keys.kv_transfer_params,
                       weight_versions=row.chunk_keys.weight_versions,
                       eos_finish_delta_empty=row.eos_finish_delta_empty,
                       metrics_content_type=row.metrics_content_type,
                       metrics_families_extra=tuple(row.metrics_families_extra),
                       tokenize_endpoint=row.tokenize_endpoint)
