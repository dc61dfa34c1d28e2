"""Where a stored baseline came from and what it was measured under: one block shared by the perf, accuracy and
reasoning-share baselines (``pytest_ml4/data/baselines/*.json``).

Every baseline file carries::

    "provenance": {"kind": "simulator" | "deployment" | "seed",
                   "deployment": str, "model": str, "image": str, "date": str, "command": str, ...}
    "conditions": {<what the figure depends on: isl, osl, duration_s, prompts, max_tokens, size, seed, ...>}

Two rules follow (issue 23 item 11, issue 26 item 3):

* a baseline the simulator made never judges a live run (:func:`usable_on`): asked for explicitly it is refused
  with one line (:class:`BaselineRefused`); found by default it counts as no baseline for that deployment, and the
  check says "not judged" with the command that records one;
* a figure is compared only with a stored one measured under the same conditions (:func:`conditions_differ`);
  otherwise the comparison is refused with one line naming both.

Core code: no pytest.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from pytest_ml4.targets import Target

#: Provenance kinds: made by the simulator; recorded on a real deployment by this tool; transcribed from a seed's
#: real measurement (seed 000's perf table).
KINDS = ("simulator", "deployment", "seed")
#: The fields a deployment-recorded baseline states (issue 23 item 11).
DEPLOYMENT_FIELDS = ("deployment", "model", "image", "date", "command")


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
                          simulated: bool) -> dict[str, Any]:
    """The provenance block a save option writes: the deployment, the served model, the image as the target
    declares it (the API does not tell), now, and the command as typed (secrets never travel in argv)."""
    cmd = command if isinstance(command, str) else " ".join(command)
    image = f"vLLM {target.engine.version}" + (f", Dynamo {target.serving.dynamo_version}"
                                               if target.serving.dynamo_version else "")
    return {"kind": "simulator" if simulated else "deployment", "deployment": target.name, "model": model,
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
