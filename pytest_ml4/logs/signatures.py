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
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError

from pytest_ml4.datafile import Strict, compose, read_yaml, validation_line
from pytest_ml4.locations import data_file
from pytest_ml4.logs.records import LogRecord

CATALOGUE_FILE = data_file("logs", "signatures.yaml")
Severity = Literal["critical", "error", "warning", "info"]
SEVERITIES: tuple[str, ...] = get_args(Severity)


class CatalogueError(ValueError):
    """The catalogue file is malformed; the message is one line naming the file, line and field."""


def _compiled(value: Any) -> Any:
    """A regex field compiled, or the reason it does not compile (pydantic's own message drops it)."""
    if not isinstance(value, str):
        return value
    if not value:
        raise ValueError("empty regex")
    try:
        return re.compile(value)
    except re.error as err:
        raise ValueError(f"bad regex: {err}") from None


Regex = Annotated[re.Pattern[str], BeforeValidator(_compiled)]


class SignatureRow(Strict):
    """One entry of ``signatures.yaml`` (its header comment says what each field means)."""

    name: str = Field(min_length=1)
    event: str = Field(min_length=1)
    severity: Severity
    regex: Regex
    meaning: str = Field(min_length=1)
    source: str = Field(min_length=1)
    hints: list[str] = Field(default_factory=list)
    context: Regex | None = None
    window: int = 40
    supersedes: list[str] = Field(default_factory=list)
    boot_marker: int = 0
    unrecorded: str = ""


CATALOGUE_MODEL = list[SignatureRow]


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


def _signature(row: SignatureRow) -> Signature:
    return Signature(name=row.name, event=row.event, severity=row.severity, regex=row.regex,
                     meaning=" ".join(row.meaning.split()), source=" ".join(row.source.split()),
                     hints=tuple(row.hints), context=row.context, window=row.window,
                     supersedes=tuple(row.supersedes), boot_marker=row.boot_marker,
                     unrecorded=" ".join(row.unrecorded.split()))


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


def parse_catalogue(data: Any, where: str = "catalogue", text: str | None = None) -> Catalogue:
    """The catalogue from ``data`` (read from ``where``, whose YAML ``text`` gives the line of a bad field)."""
    try:
        rows = TypeAdapter(CATALOGUE_MODEL).validate_python(data)
    except ValidationError as err:
        root = compose(text) if text is not None else None
        raise CatalogueError(validation_line(Path(where), CATALOGUE_MODEL, err, root, "signature catalogue")) from None
    sigs = [_signature(row) for row in rows]
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
    path = Path(path)
    data = read_yaml(path, "signature catalogue", CatalogueError)
    return parse_catalogue(data, str(path), path.read_text(encoding="utf-8"))


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
