"""What the project knows per GPU family: the table ``pytest_ml4/data/hardware/families.yaml``.

A target may name any lowercase family (``hardware.family``); only the families this table lists as simulated run
under ``--sim``, and only those with a ``memory_model`` get the memory model's plan. Elsewhere a check keyed by
family says what it lacks (:func:`no_calibration`), as not judged or not applied, never as a pass.

Works without pytest::

    from pytest_ml4.target.hardware import family_info, simulation_refusal
    family_info("h200")            # FamilyInfo(name="H200", memory_model=None, simulated=False, ...)
    simulation_refusal(target)     # None, or one line naming the family and the families --sim can simulate
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import Field

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.target.model import Hardware

FAMILIES_FILE = data_file("hardware", "families.yaml")

MemoryModel = Literal["calibrated", "estimate"]


class FamilyInfo(Strict):
    """One family's row; ``family`` is the row's key."""

    family: str = Field("", exclude=True)
    name: str
    products: tuple[str, ...] = ()
    memory_model: MemoryModel | None = None
    simulated: bool = False
    source: str = ""


@cache
def families(path: Path = FAMILIES_FILE) -> dict[str, FamilyInfo]:
    """family -> what is known of it; a malformed row is a :class:`~pytest_ml4.datafile.DataFileError` naming the
    file, the line and the field."""
    rows = load_yaml(path, dict[str, FamilyInfo])
    return {family: row.model_copy(update={"family": family}) for family, row in rows.items()}


def family_info(family: str | None) -> FamilyInfo | None:
    return families().get(family) if family else None


def simulated_families() -> list[str]:
    return [f for f, info in families().items() if info.simulated]


def has_memory_model(family: str | None) -> bool:
    info = family_info(family)
    return info is not None and info.memory_model is not None


def memory_model_families() -> list[str]:
    return [f for f, info in families().items() if info.memory_model is not None]


def no_memory_calibration(family: str | None) -> str:
    """The reason a memory-model check gives on a family the table has no memory model for."""
    return (f"no memory-model calibration for {family or 'unknown hardware'} "
            f"(calibrated or estimated: {', '.join(memory_model_families())})")


def family_of_product(product: str) -> str | None:
    """The family a ``nvidia.com/gpu.product`` value names (longest match first: GB200 is not a B200)."""
    upper = product.upper()
    needles = sorted(((p.upper(), f) for f, info in families().items() for p in info.products),
                     key=lambda pf: -len(pf[0]))
    return next((family for needle, family in needles if needle in upper), None)


#: Fields the simulator reads that a live target may leave out: field -> when the simulator needs it.
SIM_FIELDS: dict[str, str] = {
    "compute_capability": "for the SymmMemCommunicator boot warning of a target without symmetric memory",
}


def simulation_refusal(hw: Hardware) -> str | None:
    """One line when ``--sim`` cannot stand in for this hardware, else None."""
    if hw.family not in simulated_families():
        return (f"--sim cannot simulate hardware.family {hw.family}: no seed describes its boot, memory and timing "
                f"(it simulates: {', '.join(simulated_families())}); run it live, or pick one of those families")
    if not hw.symmetric_memory and not hw.compute_capability:
        return (f"--sim needs hardware.compute_capability {SIM_FIELDS['compute_capability']} "
                "(symmetric_memory: false)")
    return None
