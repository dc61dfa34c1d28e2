"""Log reader over a plain file (the simulator's log, a ``vllm serve ... > engine.log`` redirect, a copied journal)."""

from __future__ import annotations

from pathlib import Path

from pytest_ml4.logs.reader import LogMark, LogReader
from pytest_ml4.logs.records import LogRecord, Since, filter_since, records_from_text


class FileLogReader(LogReader):
    """Every line of ``path``; a missing file reads as no lines (the engine may not have written any yet)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def describe(self) -> str:
        return f"file {self.path}"

    def read(self, since: Since = None) -> list[LogRecord]:
        try:
            text = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return filter_since(records_from_text(text, source=str(self.path)), since)

    def mark(self) -> LogMark:
        return LogMark(super().mark().time, len(self.read()))

    def read_from(self, mark: LogMark) -> list[LogRecord]:
        """The lines appended since ``mark``: uvicorn's access lines carry no stamp, so a window of a file would
        otherwise hold only what a stamped line happened to date; by time when the file shrank (rotated)."""
        records = self.read()
        if mark.records is None or len(records) < mark.records:
            return filter_since(records, mark.time)
        return records[mark.records:]
