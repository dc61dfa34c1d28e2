"""The one reader interface every engine log source implements (file, journald, Kubernetes).

A :class:`LogReader` returns records oldest first; ``since_last_boot()`` cuts them to the current engine's lines
so checks judge the engine that is running now, not last week's crash.

Implementing a reader (e.g. ``pytest_ml4.logs.kubernetes``) means writing ``read(since)`` and ``describe()``;
``records_from_text`` turns raw text into records, and overriding ``boot_groups`` lets a source that knows its
restarts (journald's invocation id, a pod's container restarts) say where each boot starts. Apart from
:mod:`pytest_ml4.logs.records` because finding the last boot needs the signature catalogue, which reads records.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_ml4.logs.records import LogRecord, Since
from pytest_ml4.logs.signatures import last_boot_start


@dataclass(frozen=True)
class LogMark:
    """Where a window of the log starts: a time (a second early: stamps carry whole seconds) and, for an
    append-only source, the number of records it held then."""

    time: float
    records: int | None = None


class LogReader(ABC):
    """One source of engine log lines."""

    def mark(self) -> LogMark:
        """The start of a window, for :meth:`read_from`."""
        return LogMark(time.time() - 1.0)

    def read_from(self, mark: LogMark) -> list[LogRecord]:
        """The records logged since ``mark`` (by time unless the source can say better)."""
        return self.read(since=mark.time)

    @abstractmethod
    def read(self, since: Since = None) -> list[LogRecord]:
        """Records oldest first; ``since`` (epoch seconds or datetime) drops older ones."""

    @abstractmethod
    def describe(self) -> str:
        """Where the lines come from, for failure messages (never a secret)."""

    def boot_groups(self, records: Sequence[LogRecord]) -> list[list[LogRecord]]:
        """Records split per restart where the source knows its restarts (default: by ``boot_id`` changes)."""
        groups: list[list[LogRecord]] = [[]]
        current: str | None = None
        for r in records:
            # Lines without an id (a source that does not know) stay with the boot before them.
            if r.boot_id is not None and r.boot_id != current:
                if groups[-1] and current is not None:
                    groups.append([])
                current = r.boot_id
            groups[-1].append(r)
        return [g for g in groups if g]

    def since_last_boot(self, since: Since = None) -> list[LogRecord]:
        """Only the current engine's lines: the last restart group, cut at its last boot-marker line."""
        records = self.read(since)
        groups = self.boot_groups(records)
        current = groups[-1] if groups else []
        return current[last_boot_start(current):]

    def tail(self, n: int = 40) -> list[str]:
        return [r.text for r in self.read()[-n:]]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"
