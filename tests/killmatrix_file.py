"""The kill-matrix file, typed: what ``fixtures/killmatrix/<name>.yaml`` may hold, and how a target's matrix is put
together from its file and the files it names as ``base`` (the format: rtxpro6000-tp8.yaml's header).

Each file is validated on its own, so a bad field is reported in the file that holds it: ONE line naming the file,
the line and the field path (``gb300-agg.yaml: line 412: suites/test_x.py::test_y: killed_by.k1: ...``). The line
comes from the YAML nodes, composed only when there is an error to place.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)

from pytest_ml4.checks.codes import CODE_FORM, known_codes
from pytest_ml4.datafile import DataFileError, compose, line_at, read_yaml

#: The entries a check may give, exactly one of which says how it is proven (or why it is not).
VERDICT_KEYS = ("killed_by", "measurement", "skipped", "pending")
#: What a verdict code looks like (``area.property``): a ``killed_by`` string of this form is a code, else a regex.
#: How a check may end under a kill that lists it as collateral (``{why, outcome}``): ``not_judged`` is a skip
#: whose reason starts with ``not judged: ``, ``skipped`` any other skip.
CollateralOutcome = Literal["failed", "skipped", "not_judged"]
#: The file every target's chain of bases ends at: the entries all targets share.
COMMON = "common"
#: The union tags pydantic writes into an error's location; no key of the file, left out of the field path.
_ONE, _LIST = "<one expectation>", "<expectations per instances>"


class MatrixError(ValueError):
    """A malformed matrix file: one line naming the file, the line and the entry."""


def _known_keys(model: type[BaseModel], data: Any) -> None:
    """Refuse keys the model lacks, naming them with the keys it takes (``except`` by its alias)."""
    if not isinstance(data, dict):
        return
    allowed = sorted(f.alias or name for name, f in model.model_fields.items())
    unknown = sorted(set(map(str, data)) - set(allowed))
    if unknown:
        raise ValueError(f"unknown keys {unknown} (allowed: {', '.join(allowed)})")


class _Entry(BaseModel):
    # numbers in option lists are the options' text, as on a command line
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True, populate_by_name=True)

    @classmethod
    def _expand(cls, data: Any) -> Any:
        """The entry's short form (a bare string or list) as its mapping; the mapping as it is."""
        return data

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        data = cls._expand(data)
        _known_keys(cls, data)
        return data


class ExpectEntry(_Entry):
    """``{kill: CODE}`` or ``{kill: {code: CODE, message: REGEX, only: [...], except: [...]}}``; a regex alone is
    refused (messages are free to change, codes are not)."""

    code: str | None = None
    message: str | None = None
    only: list[str] = Field(default_factory=lambda: ["*"])
    except_: list[str] = Field(default_factory=list, alias="except")

    @classmethod
    def _expand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"code": data} if CODE_FORM.match(data) else {"message": data}
        return data

    @model_validator(mode="after")
    def _declared_code(self) -> ExpectEntry:
        if self.code is None and self.message is None:
            raise ValueError("must be a verdict code or {code, message, only, except}")
        if self.code is None:
            raise ValueError("a message regex without a verdict code; name the code the check raises "
                             "(code: area.property, declared with @fails_with on the function that raises it)")
        if self.code not in known_codes():
            raise ValueError(f"verdict code {self.code!r} is not declared (no @fails_with names it)")
        return self


#: One expectation, or a list of them covering different instances of the check (each with its only/except).
KillExpect = Annotated[
    Annotated[ExpectEntry, Tag(_ONE)] | Annotated[list[ExpectEntry], Tag(_LIST)],
    Discriminator(lambda v: _LIST if isinstance(v, list) else _ONE)]


class CheckEntry(_Entry):
    """``checks: <file>::<function>``: exactly one of killed_by, measurement, skipped, pending."""

    killed_by: dict[str, KillExpect] = Field(default_factory=dict)
    measurement: str | None = None
    skipped: str | None = None
    pending: str | None = None
    #: Parametrized instances not proven yet: param id -> what is missing.
    pending_params: dict[str, str] = Field(default_factory=dict)
    #: Parametrized instances that do not apply on the target: param id -> the healthy run's skip reason.
    skipped_params: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_verdict(self) -> CheckEntry:
        given = [k for k in VERDICT_KEYS if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(VERDICT_KEYS)} (got {given or 'none'})")
        return self


class CollateralEntry(_Entry):
    """``check: why`` (failed, skipped or not judged allowed) or ``check: {why: ..., outcome: not_judged}``."""

    why: str
    outcome: CollateralOutcome | None = None

    @classmethod
    def _expand(cls, data: Any) -> Any:
        return {"why": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _reason(self) -> CollateralEntry:
        if not self.why.strip():
            raise ValueError("give a reason, or {why: ..., outcome: failed|skipped|not_judged}")
        return self


class KillEntry(_Entry):
    """``kills: <name>``: the faults (``--ml4-fault``) and options that break the deployment, the conditions its
    control runs with, why it stands for a real failure, and how it runs."""

    why: str = ""
    faults: list[str] = Field(default_factory=list)
    #: Options that ARE the breakage (a recorded broken log or config, a broken setting): the kill's run only.
    breaks: list[str] = Field(default_factory=list)
    #: Conditions (no proxy, a shorter sweep, a threshold): the kill's run AND its control.
    args: list[str] = Field(default_factory=list)
    #: Kills of one group run in one subprocess; the kill's own name when absent.
    group: str | None = None
    #: Why the kill's runs are too heavy for CI (scripts/nightly.sh runs them); empty: they run in CI.
    nightly: str = ""
    collateral: dict[str, CollateralEntry] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _breaks_something(self) -> KillEntry:
        if not self.faults and not self.breaks:
            raise ValueError("neither faults nor breaks: the kill would break nothing")
        if not self.why.strip():
            raise ValueError("no why (which real failure it stands for)")
        return self


class ProfileEntry(_Entry):
    """``profiles: <name>``: the options of the profile's runs (a bare list is its args)."""

    args: list[str] = Field(default_factory=list)
    #: False: the profile's checks need no endpoint (preflight, config checks): run without ``--sim``.
    sim: bool = True
    #: Why the profile's runs are too heavy for CI on the target (scripts/nightly.sh runs them).
    nightly: str | None = None

    @classmethod
    def _expand(cls, data: Any) -> Any:
        if isinstance(data, list):
            return {"args": data}
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v is not None}     # `args:` with nothing under it: none


class MatrixFile(_Entry):
    """One matrix file. A target's file names the target; a file with ``base`` changes its base's matrix: its own
    kills and checks replace the base's of the same name (a kill set to null is dropped), its own common_args,
    profiles and profile_of replace the base's whole."""

    target: str | None = None
    base: str | None = None
    common_args: list[str] | None = None
    profiles: dict[str, ProfileEntry] | None = None
    #: suite file -> timing profile
    profile_of: dict[str, str] | None = None
    kills: dict[str, KillEntry | None] = Field(default_factory=dict)
    checks: dict[str, CheckEntry] = Field(default_factory=dict)

    @classmethod
    def _expand(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        # an empty section (`kills:` with nothing under it) is an empty one
        return {k: v for k, v in data.items() if v is not None or k not in ("kills", "checks")}


# ------------------------------------------------------------------------------------------------ locating errors
def line_of(path: Path, loc: tuple[str | int, ...]) -> int:
    """The line of the value at ``loc`` in the file (of the nearest enclosing one where ``loc`` is missing)."""
    return line_at(compose(path.read_text(encoding="utf-8")), loc) or 1


def where(loc: tuple[str | int, ...]) -> str:
    """A field path as the matrix's readers name it: ``<check key>: killed_by.k1``, ``kills.k1.collateral.<key>``."""
    parts = [str(p) for p in loc if p not in (_ONE, _LIST)]
    if parts[:1] == ["checks"] and len(parts) > 1:
        return ": ".join([parts[1], ".".join(parts[2:])]) if len(parts) > 2 else parts[1]
    return ".".join(parts) or "<top level>"


def refusal(path: Path, loc: tuple[str | int, ...], reason: str) -> MatrixError:
    """The one line for a bad field: ``file: line N: field path: reason``."""
    return MatrixError(f"{path.name}: line {line_of(path, loc)}: {where(loc)}: {reason}")


def _reason(error: Any) -> str:
    return str(error["msg"]).removeprefix("Value error, ")


def read_file(path: Path) -> MatrixFile:
    """One matrix file, typed; a bad one is a :class:`MatrixError` of one line (the first bad field, and how many
    more there are)."""
    try:
        data = read_yaml(path, "kill matrix")
    except DataFileError as err:    # not UTF-8, not YAML, a key given twice: its line too
        raise MatrixError(f"{path.name}: {str(err).removeprefix(f'invalid kill matrix {path}: ')}") from None
    if not isinstance(data, dict):
        raise MatrixError(f"{path.name}: line 1: the file must be a mapping (target, kills, checks, ...), "
                          f"got {type(data).__name__}")
    try:
        return MatrixFile.model_validate(data)
    except ValidationError as err:
        first, *more = err.errors()
        also = f" (and {len(more)} more)" if more else ""
        raise refusal(path, tuple(first["loc"]), _reason(first) + also) from None


# ------------------------------------------------------------------------------------------------ bases
@dataclass(frozen=True)
class Placed:
    """An entry with the file that gives it (its errors name that file and line)."""

    path: Path
    section: str
    name: str

    def refusal(self, tail: tuple[str | int, ...], reason: str) -> MatrixError:
        return refusal(self.path, (self.section, self.name, *tail), reason)


@dataclass
class Resolved:
    """A target's matrix with its bases merged in: each entry from the file that gives it last."""

    path: Path
    target: str
    common_args: list[str] = field(default_factory=list)
    profiles: dict[str, ProfileEntry] | None = None
    profile_of: dict[str, str] | None = None
    kills: dict[str, tuple[KillEntry, Placed]] = field(default_factory=dict)
    checks: dict[str, tuple[CheckEntry, Placed]] = field(default_factory=dict)
    #: Where profiles and profile_of come from (their errors name that file).
    placed: dict[str, Path] = field(default_factory=dict)


def _chain(path: Path) -> list[tuple[Path, MatrixFile]]:
    """The file and its bases, the file first; a missing base or a cycle is refused with the chain."""
    chain = [(path, read_file(path))]
    while (base := chain[-1][1].base) is not None:
        here = chain[-1][0]
        base_path = path.parent / f"{base}.yaml"
        if not base_path.is_file():
            raise refusal(here, ("base",), f"{base!r} has no matrix file {base_path.name}")
        if base_path in [p for p, _ in chain]:
            names = " -> ".join(p.name for p, _ in [*chain, (base_path, None)])
            raise refusal(here, ("base",), f"{base!r} makes a cycle ({names})")
        chain.append((base_path, read_file(base_path)))
    return chain


def resolve(target: str, directory: Path) -> Resolved:
    """The target's matrix: ``<target>.yaml`` over its bases, each file changing the one it names."""
    path = directory / f"{target}.yaml"
    chain = _chain(path)
    own = chain[0][1]
    if own.target != target:
        raise refusal(path, ("target",), f"{own.target!r}, the file name says {target!r}")
    out = Resolved(path, target)
    for file_path, f in reversed(chain):
        for name in ("common_args", "profiles", "profile_of"):
            if getattr(f, name) is not None:
                setattr(out, name, getattr(f, name))
                out.placed[name] = file_path
        for name, kill in f.kills.items():
            if kill is None:
                out.kills.pop(name, None)
            else:
                out.kills[name] = (kill, Placed(file_path, "kills", name))
        out.checks.update({key: (c, Placed(file_path, "checks", key)) for key, c in f.checks.items()})
    _consistent(out)
    return out


def matches(name: str, pattern: str) -> bool:
    """``*`` is the only wildcard (parametrize ids hold brackets and dashes)."""
    escaped = "".join("[[]" if ch == "[" else "[]]" if ch == "]" else ch for ch in pattern)
    return fnmatch.fnmatchcase(name, escaped)


#: The matrix every target's chain of bases ends at: the entries the same on every target.
COMMON = "common.yaml"


def _consistent(m: Resolved) -> None:
    """What no single file can tell: the kills a check names exist, the checks a collateral names exist, every
    suite file's profile is defined."""
    for section in ("profiles", "profile_of"):
        if getattr(m, section) is None:
            raise refusal(m.path, (section,), "missing, in the file and in its bases")
    assert m.profiles is not None and m.profile_of is not None
    for suite, profile in m.profile_of.items():
        if profile not in m.profiles:
            raise refusal(m.placed["profile_of"], ("profile_of", suite),
                          f"{profile!r} is not a profile ({', '.join(m.profiles)})")
    for check, placed in m.checks.values():
        unknown = sorted(set(check.killed_by) - set(m.kills))
        if unknown:
            raise placed.refusal(("killed_by",), f"names kills {m.target}'s matrix does not define: {unknown}")
    for kill, placed in m.kills.values():
        unknown = sorted(key for key in kill.collateral if not any(matches(check, key) for check in m.checks))
        if unknown:
            raise placed.refusal(("collateral",), f"names checks {m.target}'s matrix lacks: {unknown}")


def shared_outside_common(targets: list[str], directory: Path) -> list[str]:
    """The check and kill entries every target resolves alike but not from ``common.yaml``: each belongs there, once
    (a copy per target is what a new check's author would have to find and edit in every file)."""
    resolved = [resolve(t, directory) for t in targets]
    found = []
    for section in ("checks", "kills"):
        tables = [getattr(r, section) for r in resolved]
        for key in sorted(set.intersection(*(set(t) for t in tables))):
            entries = [t[key] for t in tables]
            first = entries[0][0].model_dump()
            same = all(e.model_dump() == first for e, _ in entries)
            if same and any(placed.path.name != COMMON for _, placed in entries):
                files = sorted({placed.path.name for _, placed in entries})
                found.append(f"{section}.{key}: the same on every target, given by {', '.join(files)}: "
                             f"belongs in {COMMON}")
    return found
