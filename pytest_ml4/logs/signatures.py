"""The signature catalogue (``pytest_ml4/data/logs/signatures.yaml``): named regexes over engine log lines.

Each signature names the typed event it becomes, its severity, what it means and the seed/reference line it comes
from. :func:`load_catalogue` reads and compiles it; :meth:`Catalogue.matches` finds every signature in a list of
records (honouring ``context`` windows and ``supersedes``); :func:`last_boot_start` finds where the last boot
begins using the ``boot_marker`` signatures.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml

from pytest_ml4.locations import data_file
from pytest_ml4.logs.records import LogRecord

CATALOGUE_FILE = data_file("logs", "signatures.yaml")
Severity = Literal["critical", "error", "warning", "info"]
SEVERITIES: tuple[str, ...] = ("critical", "error", "warning", "info")
_REQUIRED = ("name", "event", "severity", "regex", "meaning", "source")


class CatalogueError(ValueError):
    """The catalogue file is malformed; the message names the signature and field."""


@dataclass(frozen=True)
class Signature:
    name: str
    event: str
    severity: Severity
    regex: re.Pattern[str]
    meaning: str
    source: str
    hints: tuple[str, ...] = ()
    context: re.Pattern[str] | None = None
    window: int = 40
    supersedes: tuple[str, ...] = ()
    boot_marker: int = 0
    #: Why no real log line this project holds is known to match (fixtures/logs/provenance.yaml); empty: one is.
    unrecorded: str = ""

    def search(self, text: str) -> re.Match[str] | None:
        # The literal hints skip the regex on the vast majority of lines.
        if self.hints and not any(h in text for h in self.hints):
            return None
        return self.regex.search(text)


@dataclass(frozen=True)
class Match:
    """One signature found on one record (``position`` indexes the list that was searched)."""

    signature: Signature
    record: LogRecord
    groups: dict[str, str]
    position: int


def _compile(entry: dict[str, Any], where: str) -> Signature:
    missing = [k for k in _REQUIRED if not entry.get(k)]
    if missing:
        raise CatalogueError(f"{where}: missing field(s) {', '.join(missing)}")
    if entry["severity"] not in SEVERITIES:
        raise CatalogueError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
    try:
        regex = re.compile(entry["regex"])
        context = re.compile(entry["context"]) if entry.get("context") else None
    except re.error as err:
        raise CatalogueError(f"{where}: bad regex: {err}") from None
    return Signature(name=entry["name"], event=entry["event"], severity=entry["severity"], regex=regex,
                     meaning=" ".join(str(entry["meaning"]).split()), source=" ".join(str(entry["source"]).split()),
                     hints=tuple(entry.get("hints") or ()), context=context, window=int(entry.get("window", 40)),
                     supersedes=tuple(entry.get("supersedes") or ()), boot_marker=int(entry.get("boot_marker", 0)),
                     unrecorded=" ".join(str(entry.get("unrecorded") or "").split()))


class Catalogue:
    """The compiled signatures, in file order."""

    def __init__(self, signatures: Sequence[Signature]) -> None:
        self.signatures = list(signatures)
        self.by_name = {s.name: s for s in self.signatures}
        # One scan per line finds which hints occur (longest first); a found hint also stands for every shorter
        # hint inside it, so overlapping hints ("Health check" in "Health check timeout") still select theirs.
        hints = sorted({h for s in self.signatures for h in s.hints}, key=len, reverse=True)
        self._hint_re = re.compile("|".join(re.escape(h) for h in hints)) if hints else None
        self._by_hint = {h: [s for s in self.signatures if any(x in h for x in s.hints)] for h in hints}
        self._unhinted = [s for s in self.signatures if not s.hints]

    def candidates(self, text: str) -> list[Signature]:
        """Signatures whose hints occur in ``text`` (plus those without hints), in catalogue order."""
        found = set(self._hint_re.findall(text)) if self._hint_re else set()
        if not found:
            return self._unhinted
        picked = {id(s) for h in found for s in self._by_hint[h]}
        return [s for s in self.signatures if id(s) in picked or not s.hints]

    def __len__(self) -> int:
        return len(self.signatures)

    def __getitem__(self, name: str) -> Signature:
        return self.by_name[name]

    def matches(self, records: Sequence[LogRecord], names: Sequence[str] | None = None) -> list[Match]:
        """Every (signature, record) match, in record order; superseded general matches are dropped."""
        wanted = None if names is None else set(names)
        out: list[Match] = []
        for pos, rec in enumerate(records):
            sigs = [s for s in self.candidates(rec.text) if wanted is None or s.name in wanted]
            found = [Match(s, rec, {k: v for k, v in m.groupdict().items() if v is not None}, pos)
                     for s in sigs if (m := s.regex.search(rec.text)) and self._in_context(s, records, pos)]
            gone = {n for f in found for n in f.signature.supersedes}
            out.extend(f for f in found if f.signature.name not in gone)
        return out

    @staticmethod
    def _in_context(sig: Signature, records: Sequence[LogRecord], pos: int) -> bool:
        if sig.context is None:
            return True
        lo, hi = max(pos - sig.window, 0), min(pos + sig.window + 1, len(records))
        return any(sig.context.search(records[i].text) for i in range(lo, hi))


def parse_catalogue(data: Any, where: str = "catalogue") -> Catalogue:
    if not isinstance(data, list):
        raise CatalogueError(f"{where}: top level must be a list of signatures")
    sigs = [_compile(e if isinstance(e, dict) else {}, f"{where}: signature #{i + 1} ({(e or {}).get('name', '?')})")
            for i, e in enumerate(data)]
    names = [s.name for s in sigs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise CatalogueError(f"{where}: duplicate signature name(s): {', '.join(dupes)}")
    for s in sigs:
        unknown = [n for n in s.supersedes if n not in names]
        if unknown:
            raise CatalogueError(f"{where}: {s.name} supersedes unknown signature(s) {', '.join(unknown)}")
    return Catalogue(sigs)


@lru_cache(maxsize=4)
def load_catalogue(path: Path = CATALOGUE_FILE) -> Catalogue:
    """The catalogue from ``path`` (default: the package's ``signatures.yaml``)."""
    return parse_catalogue(yaml.safe_load(Path(path).read_text()), str(path))


def last_boot_start(records: Sequence[LogRecord], catalogue: Catalogue | None = None) -> int:
    """Index of the first line of the last boot in ``records`` (0 when no boot marker is there)."""
    markers = [s for s in (catalogue or load_catalogue()).signatures if s.boot_marker]
    best: tuple[int, int] | None = None  # (priority, index)
    for pos, rec in enumerate(records):
        for s in markers:
            if s.search(rec.text) and (best is None or s.boot_marker < best[0]
                                       or (s.boot_marker == best[0] and pos > best[1])):
                best = (s.boot_marker, pos)
    return best[1] if best else 0
