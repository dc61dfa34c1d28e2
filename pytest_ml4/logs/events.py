"""Typed events parsed from engine log lines through the signature catalogue.

``parse_events(records)`` turns every catalogue match into a dataclass (``CudaOom``, ``KvCacheSize``,
``StatsLine``, ...) whose fields are typed values from the line; the two-line KV form of vLLM <= 0.26 is merged
into one ``KvCacheSize``. :class:`LogView` bundles records and events for checks: the first/all events of a type,
the failures, and an excerpt around matched lines to quote and attach.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pytest_ml4.logs.records import LogRecord
from pytest_ml4.logs.signatures import Catalogue, Match, load_catalogue

_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
#: How many records after a two-line ``GPU KV cache size`` line its ``Maximum concurrency`` line may come.
_TWO_LINE_WINDOW = 5


def parse_size(text: str | None) -> int | None:
    """``"792.00 MiB"`` -> bytes (PyTorch's format_size units)."""
    if not text:
        return None
    m = re.fullmatch(r"([\d.]+) (bytes|KiB|MiB|GiB)", text.strip())
    return int(round(float(m[1]) * _UNITS[m[2]])) if m else None


def _int(text: str | None) -> int | None:
    return int(text.replace(",", "")) if text else None


def _float(text: str | None) -> float | None:
    return float(text) if text else None


@dataclass(frozen=True, kw_only=True)
class LogEvent:
    """What every event carries: the signature that matched, its severity and the line it judged."""

    signature: str
    severity: str
    line: str
    meaning: str = dataclasses.field(default="", compare=False, repr=False)
    time: float | None = None
    index: int = 0
    position: int = 0

    @property
    def quote(self) -> str:
        return f"[{self.signature}] {self.line}"

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        """Typed fields from the regex's named groups (overridden per event type)."""
        return {}


@dataclass(frozen=True, kw_only=True)
class CudaOom(LogEvent):
    requested_bytes: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    gpu: int | None = None
    fused_moe: bool = False

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(requested_bytes=parse_size(g.get("requested")), free_bytes=parse_size(g.get("free")),
                    total_bytes=parse_size(g.get("total")), gpu=_int(g.get("gpu")))


@dataclass(frozen=True, kw_only=True)
class StartupRefused(LogEvent):
    device: str | None = None
    free_gib: float | None = None
    total_gib: float | None = None
    util: float | None = None
    requested_gib: float | None = None

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(device=g.get("device"), free_gib=_float(g.get("free_gib")), total_gib=_float(g.get("total_gib")),
                    util=_float(g.get("util")), requested_gib=_float(g.get("requested_gib")))


@dataclass(frozen=True, kw_only=True)
class NoKvMemory(LogEvent):
    max_model_len: int | None = None
    needed_gib: float | None = None
    available_gib: float | None = None
    estimated_max_len: int | None = None

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(max_model_len=_int(g.get("max_model_len")), needed_gib=_float(g.get("needed_gib")),
                    available_gib=_float(g.get("available_gib")), estimated_max_len=_int(g.get("estimated_max_len")))


@dataclass(frozen=True, kw_only=True)
class EngineFailure(LogEvent):
    phase: str = "dead"
    procs: str | None = None


@dataclass(frozen=True, kw_only=True)
class GrammarKill(LogEvent):
    kind: str = ""
    tokens: tuple[int, ...] = ()

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        toks = tuple(int(t) for t in re.findall(r"\d+", g.get("tokens", "")))
        return dict(kind=g.get("kind", ""), tokens=toks)


@dataclass(frozen=True, kw_only=True)
class GrammarSchemaRefused(LogEvent):
    """The grammar backend refused a request's JSON schema: ``keys`` are the keywords it does not implement."""

    keys: tuple[str, ...] = ()

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(keys=tuple(re.findall(r'"([^"]+)"', g.get("keys", ""))))


@dataclass(frozen=True, kw_only=True)
class SymmMemUnsupported(LogEvent):
    capability: str = ""

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(capability=g.get("capability", ""))


@dataclass(frozen=True, kw_only=True)
class KvCacheSize(LogEvent):
    where: str = "GPU"
    tokens: int = 0
    max_model_len: int | None = None
    max_concurrency: float | None = None

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(where=g.get("where", "GPU"), tokens=_int(g.get("tokens")) or 0,
                    max_model_len=_int(g.get("max_model_len")), max_concurrency=_float(g.get("max_concurrency")))


@dataclass(frozen=True, kw_only=True)
class KvMaxConcurrency(LogEvent):
    max_model_len: int = 0
    max_concurrency: float = 0.0

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(max_model_len=_int(g.get("max_model_len")) or 0,
                    max_concurrency=_float(g.get("max_concurrency")) or 0.0)


@dataclass(frozen=True, kw_only=True)
class AvailableKvMemory(LogEvent):
    gib: float = 0.0

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(gib=_float(g.get("gib")) or 0.0)


@dataclass(frozen=True, kw_only=True)
class StatsLine(LogEvent):
    engine: int | None = None
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    running: int = 0
    waiting: int = 0
    kv_usage_pct: float = 0.0
    prefix_hit_pct: float | None = None

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(engine=_int(g.get("engine")), prompt_tps=_float(g.get("prompt_tps")) or 0.0,
                    generation_tps=_float(g.get("generation_tps")) or 0.0, running=_int(g.get("running")) or 0,
                    waiting=_int(g.get("waiting")) or 0, kv_usage_pct=_float(g.get("kv_usage_pct")) or 0.0,
                    prefix_hit_pct=_float(g.get("prefix_hit_pct")))


@dataclass(frozen=True, kw_only=True)
class SpecDecodeMetrics(LogEvent):
    mean_acceptance_length: float = 0.0
    accepted: int = 0
    drafted: int = 0
    per_position: tuple[float, ...] = ()
    draft_acceptance_pct: float = 0.0

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(mean_acceptance_length=_float(g.get("mean_acceptance_length")) or 0.0,
                    accepted=_int(g.get("accepted")) or 0, drafted=_int(g.get("drafted")) or 0,
                    per_position=tuple(float(p) for p in g.get("per_position", "").split(", ") if p),
                    draft_acceptance_pct=_float(g.get("draft_acceptance_pct")) or 0.0)


@dataclass(frozen=True, kw_only=True)
class KvTransferFailure(LogEvent):
    request_id: str | None = None
    code: str | None = None

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(request_id=g.get("request_id"), code=g.get("code"))


@dataclass(frozen=True, kw_only=True)
class HealthCanaryFailure(LogEvent):
    kind: str = ""
    endpoint: str = ""

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(kind=g.get("kind", ""), endpoint=g.get("endpoint", "").strip())


@dataclass(frozen=True, kw_only=True)
class ServerStart(LogEvent):
    version: str | None = None
    model: str | None = None

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(version=g.get("version"), model=g.get("model"))


@dataclass(frozen=True, kw_only=True)
class SpeculativeSetting(LogEvent):
    """The speculative-decoding config a booting engine logged: ``None`` or its repr (a dict or SpeculativeConfig)."""

    spec: str = ""

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        return dict(spec=g.get("spec", ""))

    @property
    def synthetic(self) -> bool:
        """Synthetic acceptance is on: DSpark's alternative names itself ``synthetic_*`` in the config."""
        return "synthetic" in self.spec.lower()


@dataclass(frozen=True, kw_only=True)
class EngineArgsLogged(LogEvent):
    """vLLM's ``non-default args`` line as a dict (Python's repr, read with ``ast.literal_eval``: never executed);
    empty when the repr holds something that is not a literal."""

    args: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def fields_from(cls, g: dict[str, str]) -> dict[str, Any]:
        try:
            parsed = ast.literal_eval(g.get("args", ""))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return {}
        return {"args": parsed} if isinstance(parsed, dict) else {}


EVENT_TYPES: dict[str, type[LogEvent]] = {c.__name__: c for c in (
    CudaOom, StartupRefused, NoKvMemory, EngineFailure, GrammarKill, GrammarSchemaRefused, SymmMemUnsupported, KvCacheSize,
    KvMaxConcurrency, AvailableKvMemory, StatsLine, SpecDecodeMetrics, KvTransferFailure, HealthCanaryFailure,
    ServerStart, SpeculativeSetting, EngineArgsLogged)}
E = TypeVar("E", bound=LogEvent)


def event_from_match(m: Match) -> LogEvent:
    cls = EVENT_TYPES.get(m.signature.event)
    if cls is None:
        raise KeyError(f"signature {m.signature.name} names unknown event type {m.signature.event}")
    extra = cls.fields_from(m.groups)
    if cls is CudaOom:
        extra["fused_moe"] = m.signature.context is not None
    if cls is EngineFailure:
        extra.update(phase="init" if m.signature.name == "engine_init_failed" else "dead", procs=m.groups.get("procs"))
    return cls(signature=m.signature.name, severity=m.signature.severity, line=m.record.text,
               meaning=m.signature.meaning, time=m.record.time, index=m.record.index, position=m.position, **extra)


def _merge_two_line_kv(events: list[LogEvent]) -> list[LogEvent]:
    """vLLM <= 0.26 logs ``GPU KV cache size`` and ``Maximum concurrency`` on two lines: make them one event."""
    out: list[LogEvent] = []
    for ev in events:
        if isinstance(ev, KvMaxConcurrency):
            prev = next((i for i in range(len(out) - 1, -1, -1) if isinstance(out[i], KvCacheSize)), None)
            size = out[prev] if prev is not None else None
            if (isinstance(size, KvCacheSize) and size.max_concurrency is None
                    and ev.position - size.position <= _TWO_LINE_WINDOW):
                out[prev] = dataclasses.replace(size, max_model_len=ev.max_model_len,
                                                max_concurrency=ev.max_concurrency, line=f"{size.line}\n{ev.line}")
                continue
        out.append(ev)
    return out


def parse_events(records: Sequence[LogRecord], catalogue: Catalogue | None = None) -> list[LogEvent]:
    """Every catalogue match in ``records`` as a typed event, in line order."""
    cat = catalogue or load_catalogue()
    return _merge_two_line_kv([event_from_match(m) for m in cat.matches(records)])


class LogView:
    """Records of one engine (usually since its last boot) and their events, for checks to query."""

    def __init__(self, records: Sequence[LogRecord], source: str = "", catalogue: Catalogue | None = None) -> None:
        self.records = list(records)
        self.source = source
        self.events = parse_events(self.records, catalogue)

    def all(self, cls: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, cls)]

    def first(self, cls: type[E]) -> E | None:
        found = self.all(cls)
        return found[0] if found else None

    def last(self, cls: type[E]) -> E | None:
        found = self.all(cls)
        return found[-1] if found else None

    def with_severity(self, *severities: str) -> list[LogEvent]:
        return [e for e in self.events if e.severity in severities]

    def failures(self) -> list[LogEvent]:
        """Events that mean the engine cannot serve (OOM, refusal, no KV memory, init failure, death)."""
        return self.with_severity("critical")

    def excerpt(self, events: Sequence[LogEvent], context: int = 3, limit: int = 200) -> str:
        """The matched lines with ``context`` lines around each, gaps marked, at most ``limit`` lines."""
        keep: set[int] = set()
        for ev in events:
            keep.update(range(max(ev.position - context, 0), min(ev.position + context + 1, len(self.records))))
        lines: list[str] = []
        last = -2
        for i in sorted(keep):
            if i != last + 1 and lines:
                lines.append("...")
            lines.append(self.records[i].text)
            last = i
        return "\n".join(lines[:limit])

    def tail(self, n: int = 30) -> str:
        return "\n".join(r.text for r in self.records[-n:])


def quote(events: Sequence[LogEvent], limit: int = 5) -> str:
    """Up to ``limit`` judged lines, one per line, for a failure message."""
    shown = [f"  {e.quote}" for e in events[:limit]]
    if len(events) > limit:
        shown.append(f"  ... and {len(events) - limit} more")
    return "\n".join(shown)
