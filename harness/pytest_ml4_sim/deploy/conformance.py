"""What the suites read from a Dynamo deployment, reduced to shapes and compared between two deployments: the
simulated-engine workers (:mod:`pytest_ml4_sim.sim.dynamo_worker`) and real ``dynamo.vllm`` workers, both behind the
real 1.6.1 frontend. Core, no pytest.

A response becomes an :class:`Observation`: its status code and a *merged shape* (keys, value types, null kept
distinct from absent; for a stream one merged shape per chunk kind: role, content, reasoning, tool, finish, usage,
error, plus ``[DONE]``). Two observations differ at paths (``stream.usage.usage.prompt_tokens_details``); every
difference must be listed in the allowed-differences file with its reason (timing the simulator cannot have, a
model the two deployments do not share), and every listed difference must still occur, so the list cannot rot.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pytest_ml4.logs.records import LogRecord
from pytest_ml4.logs.signatures import load_catalogue

#: Stands for "this key is not there" in a merged shape (distinct from a null value).
ABSENT = "absent"
#: The key under which a list's elements' merged shape is kept.
ITEMS = "[]"


class ConformanceDataError(ValueError):
    """The allowed-differences file is malformed: one line naming the file and the entry."""


def merged_shape(value: Any) -> Any:
    """Keys and value types of ``value``; a list's elements merged into one shape under ``[]``."""
    if isinstance(value, dict):
        return {k: merged_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        out: Any = None
        for item in value:
            out = merge(out, merged_shape(item))
        return {ITEMS: out} if out is not None else {ITEMS: "empty"}
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else "string"


def merge(a: Any, b: Any) -> Any:
    """One shape covering both; a key present in one only is merged with :data:`ABSENT`; differing leaf types
    become ``"t1|t2"``."""
    if a is None:
        return b
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merge(a.get(k, ABSENT), b.get(k, ABSENT)) for k in sorted(set(a) | set(b))}
    if a == b:
        return a
    leaves = set(str(a).split("|")) | set(str(b).split("|"))
    return "|".join(sorted(leaves))


def chunk_kind(chunk: Mapping[str, Any]) -> str:
    """What a streamed chunk carries: role, finish, tool, reasoning, content, usage or error (the first that
    applies, in that order)."""
    choices = chunk.get("choices")
    if not choices:
        return "usage" if "usage" in chunk else "error"
    choice = choices[0]
    delta = choice.get("delta") or {}
    for kind, present in (("role", "role" in delta), ("finish", choice.get("finish_reason") is not None),
                          ("tool", "tool_calls" in delta), ("reasoning", "reasoning_content" in delta),
                          ("content", "content" in delta)):
        if present:
            return kind
    return "other"


@dataclass
class Observation:
    """One response as the comparison sees it: status, merged shape, and the values the suites judge by (finish
    reasons, error message/type/code)."""

    status: int
    shape: Any
    values: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @classmethod
    def of(cls, status: int, text: str) -> Observation:
        return cls(status, body_shape(text), judged_values(text), text)

    def compared(self) -> dict[str, Any]:
        """What :func:`differences` compares: status, shape and judged values."""
        return {"status": self.status, "body": self.shape, "values": self.values}


#: The error fields whose values the suites match (messages are quoted in failures, types and codes compared).
ERROR_FIELDS = ("message", "type", "code")


def judged_values(text: str) -> dict[str, Any]:
    """Finish reasons (in order, for every choice) and the error's message/type/code of a JSON or SSE body."""
    stripped = text.strip()
    if stripped.startswith("data:"):
        chunks = [json.loads(x[5:]) for x in stripped.splitlines()
                  if x.startswith("data:") and x[5:].strip() not in ("", "[DONE]")]
    else:
        try:
            chunks = [json.loads(stripped)] if stripped.startswith("{") else []
        except ValueError:
            chunks = []
    out: dict[str, Any] = {}
    finishes = [c.get("finish_reason") for ch in chunks for c in ch.get("choices") or []
                if c.get("finish_reason") is not None]
    if finishes:
        out["finish_reason"] = ",".join(finishes)
    for ch in chunks:
        err = ch.get("error") if isinstance(ch.get("error"), dict) else (ch if "message" in ch else None)
        if err:
            out.update({f"error.{k}": err.get(k) for k in ERROR_FIELDS if k in err})
    return out


def body_shape(text: str) -> Any:
    """The merged shape of a JSON body, of an SSE body (per chunk kind), or ``"empty"`` / ``"text"``."""
    stripped = text.strip()
    if stripped.startswith("data:"):
        return {"stream": stream_shape(stripped.splitlines())}
    if not stripped:
        return "empty"
    try:
        return merged_shape(json.loads(stripped))
    except ValueError:
        return "text"


def stream_shape(lines: Iterable[str]) -> dict[str, Any]:
    """Chunk kind -> the merged shape of every chunk of that kind; ``done`` when ``[DONE]`` ended it."""
    out: dict[str, Any] = {}
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            out["done"] = "[DONE]"
            continue
        chunk = json.loads(data)
        kind = chunk_kind(chunk)
        out[kind] = merge(out.get(kind), merged_shape(chunk))
    return out


def differences(a: Any, b: Any, path: str = "") -> dict[str, tuple[Any, Any]]:
    """Path -> (a's shape, b's shape) wherever the two merged shapes differ (leaves, or a key one lacks)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: dict[str, tuple[Any, Any]] = {}
        for k in sorted(set(a) | set(b)):
            out.update(differences(a.get(k, ABSENT), b.get(k, ABSENT), f"{path}.{k}" if path else k))
        return out
    if a == b:
        return {}
    return {path or "(body)": (_leaf(a), _leaf(b))}


def _leaf(shape: Any) -> Any:
    return "{...}" if isinstance(shape, dict) else shape


def metric_families(text: str, prefix: str = "vllm:") -> set[str]:
    """The metric families a Prometheus exposition declares (``# TYPE`` lines) under ``prefix``."""
    return {line.split()[2] for line in text.splitlines()
            if line.startswith("# TYPE ") and len(line.split()) > 2 and line.split()[2].startswith(prefix)}


def log_signatures(text: str) -> set[str]:
    """The names of the log-signature catalogue entries (pytest_ml4/data/logs/signatures.yaml) a log matches."""
    records = [LogRecord(text=line) for line in text.splitlines()]
    return {m.signature.name for m in load_catalogue().matches(records)}


# ------------------------------------------------------------------------------------------------ allowed data
@dataclass(frozen=True)
class Allowed:
    """One difference the data allows: in ``case`` (``*`` every case) at ``path`` (a prefix of the difference's
    path), for ``reason``."""

    case: str
    path: str
    reason: str
    #: A difference that depends on timing (e.g. a line the real worker logs only after 10 s of activity): it may
    #: not occur in a short run, so its absence does not make the entry stale.
    timing: bool = False

    def covers(self, case: str, path: str) -> bool:
        return self.case in ("*", case) and (path == self.path or path.startswith(self.path + "."))


@dataclass
class ConformanceData:
    """The request set and the allowed differences (``fixtures/dynamo/conformance.yaml``)."""

    requests: dict[str, dict[str, Any]]
    allowed: list[Allowed] = field(default_factory=list)
    source: str = ""

    def unexplained(self, case: str, diffs: Mapping[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
        return {p: d for p, d in diffs.items() if not any(a.covers(case, p) for a in self.allowed)}

    def stale(self, seen: Mapping[str, Iterable[str]]) -> list[Allowed]:
        """Allowed differences that no longer occur in any case they name (``seen``: case -> paths)."""
        return [a for a in self.allowed if not a.timing
                and not any(a.covers(case, p) for case, paths in seen.items() for p in paths)]


def load_conformance(path: Path) -> ConformanceData:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("requests"), dict):
        raise ConformanceDataError(f"{path}: needs a mapping 'requests' (name -> request)")
    allowed = []
    for i, entry in enumerate(data.get("allowed_differences") or []):
        missing = [k for k in ("case", "path", "reason") if not str((entry or {}).get(k) or "").strip()]
        if missing:
            raise ConformanceDataError(f"{path}: allowed_differences[{i}] lacks {', '.join(missing)}")
        if entry["case"] != "*" and entry["case"] not in data["requests"] and entry["case"] not in ("metrics", "logs"):
            raise ConformanceDataError(f"{path}: allowed_differences[{i}].case {entry['case']!r} names no request")
        allowed.append(Allowed(str(entry["case"]), str(entry["path"]), " ".join(str(entry["reason"]).split()),
                               timing=bool(entry.get("timing", False))))
    return ConformanceData(dict(data["requests"]), allowed, str(path))
