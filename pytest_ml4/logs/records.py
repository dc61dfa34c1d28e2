"""Log records: one line of an engine's log with the time it was written where the source knows it.

``records_from_text`` turns raw text into records; the readers (:mod:`pytest_ml4.logs.reader`) return them.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

#: Terminal colour codes: vLLM colours its prefix unless NO_COLOR is set, and journald keeps the bytes.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: vLLM (all versions, reference vllm.md §9.1): ``LEVEL MM-DD HH:MM:SS [file:line]``, optionally after ``(Proc pid=N) ``.
_VLLM_PREFIX = re.compile(r"^(?:\((?P<proc>[^)\s]+) pid=(?P<pid>\d+)\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                          r"(?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)? \[")
#: Dynamo / Rust tracing lines start with an RFC 3339 time stamp.
_ISO_PREFIX = re.compile(r"^(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s")

Since = float | _dt.datetime | None


@dataclass(frozen=True)
class LogRecord:
    """One log line. ``time`` is epoch seconds (None where the line carries none and nothing came before it)."""

    text: str
    time: float | None = None
    source: str = ""
    index: int = 0
    pid: int | None = None
    #: A restart id where the source has one (journald ``_SYSTEMD_INVOCATION_ID``, a container's restart count).
    boot_id: str | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __str__(self) -> str:
        return self.text


def since_epoch(since: Since) -> float | None:
    """``since`` as epoch seconds (naive datetimes are local time, like journalctl's --since)."""
    if since is None or isinstance(since, (int, float)):
        return since
    return since.timestamp()


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


@lru_cache(maxsize=4096)
def _vllm_stamp(md: str, hms: str, year: int | None, tz: _dt.tzinfo | None) -> float | None:
    # Cached: a busy log repeats each second's stamp many times, and building datetimes dominates reading.
    now = _dt.datetime.now(tz)
    y = year or now.year
    try:
        when = _dt.datetime(y, int(md[:2]), int(md[3:]), int(hms[:2]), int(hms[3:5]), int(hms[6:]), tzinfo=tz)
    except ValueError:
        return None
    if year is None and when > now + _dt.timedelta(days=1):
        when = when.replace(year=y - 1)
    return when.timestamp()


def line_time(text: str, *, year: int | None = None, tz: _dt.tzinfo | None = None) -> float | None:
    """The time a vLLM or Dynamo line was logged, as epoch seconds; None when the line has no stamp.

    vLLM stamps carry no year (``%m-%d %H:%M:%S``, local time): the current year is assumed, or last year when that
    would put the line in the future (a log read just after New Year).
    """
    m = _VLLM_PREFIX.match(text)
    if m:
        return _vllm_stamp(m["md"], m["hms"], year, tz)
    m = _ISO_PREFIX.match(text)
    if m:
        try:
            return _dt.datetime.fromisoformat(m["iso"].replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def line_pid(text: str) -> int | None:
    m = _VLLM_PREFIX.match(text)
    return int(m["pid"]) if m and m["pid"] else None


def records_from_text(text: str | Iterable[str], *, source: str = "", start_index: int = 0,
                      boot_id: str | None = None) -> list[LogRecord]:
    """Split raw log text into records; lines without a stamp (tracebacks) take the stamp of the line before."""
    lines = text.splitlines() if isinstance(text, str) else [ln.rstrip("\n") for ln in text]
    out: list[LogRecord] = []
    last: float | None = None
    for i, raw in enumerate(lines):
        line = strip_ansi(raw)
        t = line_time(line)
        last = t if t is not None else last
        out.append(LogRecord(text=line, time=last, source=source, index=start_index + i, pid=line_pid(line),
                             boot_id=boot_id))
    return out


def filter_since(records: Sequence[LogRecord], since: Since) -> list[LogRecord]:
    """Records at or after ``since`` (records without any time are kept: nothing proves they are older)."""
    t = since_epoch(since)
    if t is None:
        return list(records)
    return [r for r in records if r.time is None or r.time >= t - 1e-6]
