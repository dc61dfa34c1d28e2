"""The one baseline store: the file format of the perf, accuracy and reasoning-share baselines
(``pytest_ml4/data/baselines/*.json``, or a team's ``baselines/`` beside its ``targets/``), where they came from, what they were measured under, and which direction of each
figure is better.

Every baseline file is::

    {"format": "ml4-baseline/1", "kind": "perf" | "accuracy" | "reasoning-share", "target": str,
     "provenance": {"kind": "simulator" | "deployment" | "seed",
                    "deployment": str, "model": str, "image": str, "date": str, "command": str, ...},
     "conditions": {<what the figures depend on: isl, osl, duration_s, prompts, max_tokens, size, seed, ...>},
     "tolerances": {<figure>: number},
     "figures": <the kind's figures: perf a list of points per concurrency, accuracy per-category counts,
                 reasoning-share per-prompt shares>,
     <the kind's own comparison settings, e.g. perf's "value_max_concurrency" and "short_run_metrics">}

:func:`read_baseline` reads any of them and refuses, with one line naming the file, one without provenance, of an
older layout or of another kind; :func:`write_baseline` writes them. The kinds' own classes
(:class:`pytest_ml4.perf.baseline.Baseline`, :class:`pytest_ml4.accuracy.gate.AccuracyBaseline`,
:class:`pytest_ml4.checks.reasoning.ShareBaseline`) interpret ``figures``.

Two rules follow:

* a baseline the simulator made never judges a live run (:func:`usable_on`): asked for explicitly it is refused
  with one line (:class:`BaselineRefused`); found by default it counts as no baseline for that deployment, and the
  check says "not judged" with the command that records one;
* a figure is compared only with a stored one measured under the same conditions (:func:`conditions_differ`);
  otherwise the comparison is refused with one line naming both.

Core code: no pytest.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pytest_ml4.datafile import read_json, validate
from pytest_ml4.locations import (  # noqa: F401 (baselines_dir re-exported)
    BASELINES_FOLDER,
    DATA_DIR,
    PACKAGE_DIR,
    baselines_dir,
    resolve_from,
)

if TYPE_CHECKING:
    from pytest_ml4.target.model import Target

#: The layout every baseline file states (``"format"``); a file without it predates the one store.
FORMAT = "ml4-baseline/1"
#: What a baseline measures, and the file a target's baseline of that kind has under ``baselines/`` (the team's,
#: else the package's) when no option names one (perf: the target file's ``perf.baseline`` names it).
BASELINE_FILES: dict[str, str] = {
    "perf": "{target}.json",
    "accuracy": "accuracy-{target}.json",
    "reasoning-share": "reasoning-share-{target}.json",
}
#: Which direction is better for each perf figure a gate or ``ml4-report compare`` judges: +1 higher is better, -1
#: lower is better. A figure not listed has no better direction (a count of requests describes the run, not the
#: deployment). Accuracy (a drop, tested for significance) and the reasoning share (a band either way) are judged by
#: their own rules.
DIRECTION: dict[str, int] = {
    "out_tok_s": +1, "tok_s_user": +1, "tok_s_user_p50": +1,
    "ttft_p50_s": -1, "ttft_p99_s": -1, "itl_p50_ms": -1, "itl_p99_ms": -1,
    "decode_conc_avg": +1, "error_rate_pct": -1,
}


def direction(figure: str) -> int:
    """+1 when higher is better, -1 when lower is better, 0 when the figure has no better direction."""
    return DIRECTION.get(figure, 0)


#: Provenance kinds: made by the simulator; recorded on a real deployment by this tool; transcribed from a seed's
#: real measurement (seed 000's perf table).
ProvenanceKind = Literal["simulator", "deployment", "seed"]
KINDS: tuple[str, ...] = get_args(ProvenanceKind)
#: The fields a deployment-recorded baseline states.
DEPLOYMENT_FIELDS = ("deployment", "endpoint", "model", "image", "date", "command")


class BaselineRefused(ValueError):
    """A baseline that must not judge this run; the message is one line naming the file and why."""


@dataclass(frozen=True)
class Provenance:
    kind: str
    fields: Mapping[str, Any]

    @property
    def simulated(self) -> bool:
        return self.kind == "simulator"

    def describe(self) -> str:
        shown = ", ".join(f"{k} {self.fields[k]}" for k in DEPLOYMENT_FIELDS if self.fields.get(k))
        return f"{self.kind}" + (f" ({shown})" if shown else "")

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.fields}


def provenance_of(data: Mapping[str, Any], path: str | Path) -> Provenance:
    """The ``provenance`` block of a loaded baseline file; :class:`BaselineRefused` when it states none."""
    block = data.get("provenance")
    if not isinstance(block, Mapping) or block.get("kind") not in KINDS:
        raise BaselineRefused(f"baseline {path} states no provenance (provenance.kind one of {', '.join(KINDS)}): "
                              "record it again with this version's save option")
    return Provenance(str(block["kind"]), {k: v for k, v in block.items() if k != "kind"})


def usable_on(prov: Provenance, path: str | Path, *, live: bool, explicit: bool) -> bool:
    """Whether a baseline may judge this run. A simulator baseline on a live run: refused when the user named it
    (``explicit``), otherwise False (no baseline for this deployment)."""
    if not (live and prov.simulated):
        return True
    if explicit:
        raise BaselineRefused(f"baseline {path} was made by the simulator and cannot judge a live deployment: "
                              "record one on this deployment")
    return False


def default_baseline(kind: str, target: str, root: Path | None = None) -> Path:
    """The stored baseline of ``kind`` for ``target`` when no option names one: the team's file in ``root``'s
    ``baselines/`` first, else the package's; neither: the team's path (where recording it puts it)."""
    return resolve_from(root or DATA_DIR, Path(BASELINES_FOLDER) / BASELINE_FILES[kind].format(target=target))


#: Suite marker and ``-k`` selection that measure each kind (the record command a not-judged check names).
RECORDED_BY: dict[str, str] = {
    "perf": "-m perf", "accuracy": "-m accuracy", "reasoning-share": "-m reasoning -k share_of_output",
}


def recording_path(kind: str, target: Target) -> Path:
    """Where ``--ml4-record-baselines`` writes ``kind`` for ``target``: the team's ``baselines/`` beside its
    ``targets/`` (created), the perf baseline at the path the target's ``perf.baseline`` names when it names one.
    The next run finds it there (:func:`default_baseline`, ``Target.resolve``)."""
    if kind == "perf" and target.perf.baseline:
        named = Path(target.perf.baseline)
        return named if named.is_absolute() else target.root / named
    return target.root / BASELINES_FOLDER / BASELINE_FILES[kind].format(target=target.name)


def package_target(target: Target) -> bool:
    """True when the target's folder is inside the installed package (a bundled target): never recorded into."""
    return target.root.resolve().is_relative_to(PACKAGE_DIR.resolve())


def record_command(kind: str, target: Target) -> str:
    """The command that records this deployment's ``kind`` baseline, and where it writes (the team's path)."""
    cmd = f"pytest --target {target.name} {RECORDED_BY[kind]} --ml4-record-baselines"
    if package_target(target):
        return (f"{cmd} from a repository holding targets/{target.name}.yaml (a copy of the bundled target): it "
                f"writes {BASELINES_FOLDER}/{recording_path(kind, target).name} beside that targets/ folder, never "
                f"into the installed package")
    return f"{cmd} (writes {recording_path(kind, target)})"


class ProvenanceBlock(BaseModel):
    """A baseline's ``provenance``: its kind and whatever the recording stated (deployment, model, image, ...)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: ProvenanceKind

    def view(self) -> Provenance:
        return Provenance(self.kind, dict(self.model_extra or {}))


class BaselineFile(BaseModel):
    """The block every baseline file shares; a kind's model (:class:`pytest_ml4.perf.baseline.PerfBaselineFile`,
    ...) types its ``figures`` and adds its own comparison settings. Unknown keys are refused: a misspelt setting
    would silently fall back to its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["ml4-baseline/1"]
    kind: str
    target: str | None = None
    provenance: ProvenanceBlock
    conditions: dict[str, Any] = Field(default_factory=dict)
    tolerances: dict[str, float] = Field(default_factory=dict)
    figures: Any

    @field_validator("conditions", "tolerances", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("figures")
    @classmethod
    def _has_figures(cls, value: Any) -> Any:
        if not value:
            raise ValueError("no figures")
        return value


F = TypeVar("F", bound=BaselineFile)


def read_baseline(path: str | Path, kind: str, model: type[F]) -> F:
    """A baseline file of ``kind`` as the kind's ``model``; :class:`BaselineRefused` (one line naming the file)
    when it is missing, not JSON, states no provenance, predates :data:`FORMAT`, is of another kind, or breaks the
    model (then with the field and its line)."""
    p = Path(path)
    what = f"{kind} baseline"
    if not p.is_file():
        raise BaselineRefused(f"{kind} baseline {p} does not exist")
    doc = read_json(p, what, BaselineRefused)
    if not isinstance(doc, dict):
        raise BaselineRefused(f"{kind} baseline {p} is not a JSON object")
    provenance_of(doc, p)
    if doc.get("format") != FORMAT:
        raise BaselineRefused(f"{kind} baseline {p} is in an older layout (no \"format\": \"{FORMAT}\"): record it "
                              "again with this version's save option")
    if doc.get("kind") != kind:
        raise BaselineRefused(f"baseline {p} is a {doc.get('kind')!r} baseline, not a {kind!r} one")
    return validate(p, p.read_text(encoding="utf-8"), doc, model, what, error=BaselineRefused)


def baseline_target(stored: BaselineFile, path: Path) -> str:
    """The deployment a baseline was recorded for: its ``target``, else the file's name."""
    return stored.target or path.stem


def write_baseline(path: str | Path, kind: str, target: str, provenance: Mapping[str, Any],
                   conditions: Mapping[str, Any], tolerances: Mapping[str, float], figures: Any,
                   **extra: Any) -> Path:
    """Write a baseline file of ``kind`` (the save options of the perf, accuracy and reasoning-share suites)."""
    if kind not in BASELINE_FILES:
        raise ValueError(f"unknown baseline kind {kind!r}; known: {', '.join(BASELINE_FILES)}")
    doc = {"format": FORMAT, "kind": kind, "target": target, "provenance": dict(provenance),
           "conditions": dict(conditions), "tolerances": dict(tolerances), **extra, "figures": figures}
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return p


class _HasProvenance(Protocol):
    @property
    def provenance(self) -> Provenance: ...


B = TypeVar("B", bound=_HasProvenance)


def pick_baseline(explicit: Path | None, default: Path, load: Callable[[Path], B], *, live: bool, record: str,
                  other_conditions: Callable[[B], str | None] = lambda _: None) -> tuple[B | None, str]:
    """The baseline that may judge this run, or None and why the check is not judged (naming ``record``, the
    command that records one). A named file that is missing, unreadable, simulator-made on a live run or of other
    conditions (``other_conditions`` gives the one line) raises :class:`BaselineRefused`; a default one that is
    absent, simulator-made on a live run or of other conditions is no baseline for this run."""
    path = explicit or default
    if not path.is_file():
        if explicit is not None:
            raise BaselineRefused(f"baseline {path} does not exist")
        return None, f"no baseline recorded for this deployment ({path} absent); record one with: {record}"
    base = load(path)
    if not usable_on(base.provenance, path, live=live, explicit=explicit is not None):
        return None, (f"{path} was made by the simulator, not recorded on this deployment; record one with: "
                      f"{record}")
    refusal = other_conditions(base)
    if refusal and explicit is not None:
        raise BaselineRefused(refusal)
    if refusal:
        return None, f"{refusal}; record one under these conditions with: {record}"
    return base, ""


def deployment_provenance(target: Target, model: str, command: Sequence[str] | str,
                          simulated: bool, endpoint: str | None = None) -> dict[str, Any]:
    """The provenance block a save option writes: the deployment, the endpoint's host (no path, no credentials),
    the served model, the image as the target declares it (the API does not tell), now, and the command as typed
    (secrets never travel in argv)."""
    cmd = command if isinstance(command, str) else " ".join(command)
    image = f"vLLM {target.engine.version}" + (f", Dynamo {target.serving.dynamo_version}"
                                               if target.serving.dynamo_version else "")
    host = urlsplit(endpoint).hostname if endpoint else None
    port = urlsplit(endpoint).port if endpoint else None
    return {"kind": "simulator" if simulated else "deployment", "deployment": target.name,
            **({"endpoint": f"{host}:{port}" if port else host} if host else {}), "model": model,
            "image": f"{image} (as {target.name}'s target file declares)",
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "command": cmd}


def conditions_differ(stored: Mapping[str, Any], run: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    """``"osl 4096 vs 256"`` for each of ``keys`` whose stored value differs from this run's (absent counts)."""
    return [f"{k} {stored.get(k)!r} vs {run.get(k)!r}" for k in keys if stored.get(k) != run.get(k)]


def refusal_line(what: str, path: str | Path, differ: Sequence[str]) -> str:
    """One line refusing a comparison across conditions (baseline's value first, this run's second)."""
    return f"{what} not compared with {path}: measured under other conditions (baseline vs this run: " \
           f"{'; '.join(differ)})"


def describe_conditions(cond: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    """``"isl 512, osl 4096, duration_s 300"`` for a legend or a message."""
    names = keys if keys is not None else list(cond)
    return ", ".join(f"{k} {cond[k]}" for k in names if cond.get(k) is not None)
