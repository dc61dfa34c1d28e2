"""Per-vLLM-version wire behaviour (``pytest_ml4/data/vllm/versions.yaml``), read by the simulator and the checks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

from pytest_ml4.locations import data_file

VERSIONS_FILE = data_file("vllm", "versions.yaml")


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


@lru_cache(maxsize=1)
def _table() -> dict[tuple[int, int], dict[str, Any]]:
    raw = yaml.safe_load(VERSIONS_FILE.read_text())["versions"]
    return {_major_minor(str(k)): dict(v, key=str(k)) for k, v in raw.items()}


@lru_cache(maxsize=16)
def for_version(version: str) -> VllmVersion:
    """The row for ``version`` (greatest key <= its major.minor; older than every key: the oldest row)."""
    table = _table()
    mm = _major_minor(version)
    key = max((k for k in table if k <= mm), default=min(table))
    row = table[key]
    return VllmVersion(key=row["key"], reasoning_field=row["reasoning_field"],
                       reasoning_efforts=tuple(row["reasoning_efforts"]),
                       default_reasoning_effort=row.get("default_reasoning_effort"),
                       kv_transfer_params=bool(row["chunk_keys"]["kv_transfer_params"]),
                       weight_versions=bool(row["chunk_keys"]["weight_versions"]),
                       eos_finish_delta_empty=bool(row["eos_finish_delta_empty"]),
                       metrics_content_type=row["metrics_content_type"],
                       metrics_families_extra=tuple(row["metrics_families_extra"]),
                       tokenize_endpoint=bool(row["tokenize_endpoint"]))
