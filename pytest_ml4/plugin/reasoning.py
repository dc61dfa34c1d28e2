"""pytest glue for the reasoning-share baseline (``suites/test_reasoning.py``); the core is
:mod:`pytest_ml4.checks.reasoning` and :mod:`pytest_ml4.target.baselines`."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ml4.checks.reasoning import ShareBaseline, ShareBaselineChoice
from pytest_ml4.plugin.option_group import group as ml4_group
from pytest_ml4.plugin.record import recording
from pytest_ml4.plugin.state import simulator_answers
from pytest_ml4.target.baselines import (
    BaselineRefused,
    default_baseline,
    pick_baseline,
    record_command,
    recording_path,
)
from pytest_ml4.target.model import Target


def pytest_addoption(parser: pytest.Parser) -> None:
    group = ml4_group(parser)
    group.addoption("--reasoning-share-baseline", dest="ml4_reasoning_share_baseline", default=None,
                    metavar="PATH", help="reasoning-share baseline to compare against (default: "
                    "pytest_ml4/data/baselines/reasoning-share-<target>.json when it was recorded on this deployment)")
    group.addoption("--reasoning-share-save", dest="ml4_reasoning_share_save", default=None, metavar="PATH",
                    help="write this run's reasoning shares as a baseline file (with its provenance and conditions)")


@pytest.fixture(scope="session")
def ml4_share_baseline(pytestconfig: pytest.Config, ml4_target: Target, ml4_endpoint: object) -> ShareBaselineChoice:
    given = pytestconfig.getoption("ml4_reasoning_share_baseline")
    save = pytestconfig.getoption("ml4_reasoning_share_save")
    default = default_baseline("reasoning-share", ml4_target.name, ml4_target.root)
    record = record_command("reasoning-share", ml4_target)
    if recording(pytestconfig):   # this run sets the baseline: nothing to compare with
        return ShareBaselineChoice(None, save=Path(save) if save else recording_path("reasoning-share", ml4_target),
                                   record=record, recording=True)
    common = {"save": Path(save) if save else None, "explicit": bool(given), "record": record}
    try:
        # Conditions depend on the request defaults the suite sends; it refuses other ones itself.
        base, why = pick_baseline(Path(given) if given else None, default, ShareBaseline.load,
                                  live=not simulator_answers(pytestconfig, ml4_endpoint), record=record)
    except BaselineRefused as err:
        return ShareBaselineChoice(None, refused=str(err), **common)
    return ShareBaselineChoice(base, why, **common)
