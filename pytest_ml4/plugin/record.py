"""``--ml4-record-baselines``: the first run on a new deployment records its baselines instead of comparing.

The selected suites run as a gate; the accuracy, reasoning-share and perf checks (whichever are selected) write
this deployment's figures with their provenance (target, endpoint host, model, version and image as the target
declares them, date, the command line) into the team's ``baselines/`` beside its ``targets/``
(:func:`pytest_ml4.target.baselines.recording_path`), and pass as "recorded" instead of ending not judged for want of a
baseline; the next plain run judges against those files. A bundled target (its folder is the installed package) is
refused before anything runs: the package is never written into. No ini twin: recording is a one-off action, an
ini line would re-record on every run.
"""

from __future__ import annotations

import pytest

from pytest_ml4.plugin.option_group import group as ml4_group
from pytest_ml4.plugin.state import get_state
from pytest_ml4.target.baselines import package_target, recording_path


def pytest_addoption(parser: pytest.Parser) -> None:
    ml4_group(parser).addoption(
        "--ml4-record-baselines", dest="ml4_record_baselines", action="store_true", default=False,
        help="record this deployment's accuracy, reasoning-share and perf baselines (whichever the selected suites "
             "measure) into baselines/ beside the team's targets/; those checks pass as recorded, the next run "
             "judges against them")


def recording(config: pytest.Config) -> bool:
    return bool(config.getoption("ml4_record_baselines", False))


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    target = get_state(config).target
    if not recording(config) or target is None:
        return
    if package_target(target):
        raise pytest.UsageError(
            f"--ml4-record-baselines: target {target.name} is the package's own ({target.root}), which is never "
            f"written into; copy it into your repository's targets/ (targets/{target.name}.yaml) and run from "
            f"there: the baselines go to baselines/ beside it (e.g. baselines/"
            f"{recording_path('reasoning-share', target).name})")
