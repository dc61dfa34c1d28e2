"""pytest glue for the preflight concern: the ``ml4_preflight_report`` fixture and the ``--preflight-path`` option.

The suite (``suites/test_preflight.py``) lints the target's ``manifests:`` (or the paths given with
``--preflight-path``) once per session, with the target's hardware, and reports one test per rule.
No endpoint is needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ml4.plugin.option_group import group as ml4_group
from pytest_ml4.preflight.lint import Report, lint_paths
from pytest_ml4.target.model import Target


def pytest_addoption(parser: pytest.Parser) -> None:
    group = ml4_group(parser)
    group.addoption("--preflight-path", dest="ml4_preflight_paths", action="append", default=[], metavar="PATH",
                    help="config file/directory for the preflight suite to lint instead of the target's manifests "
                         "(repeatable)")
    parser.addini("ml4_preflight_paths", type="linelist", default=[],
                  help="config files/directories for the preflight suite (instead of the target's manifests)")


def preflight_paths(config: pytest.Config, target: Target) -> list[Path]:
    """What the preflight suite lints: --preflight-path, the ini twin, or the target's manifests."""
    given = config.getoption("ml4_preflight_paths") or config.getini("ml4_preflight_paths")
    if given:
        return [Path(p) for p in given]
    return [target.resolve(m) for m in target.manifests]


@pytest.fixture(scope="session")
def ml4_preflight_paths(pytestconfig: pytest.Config, ml4_target: Target) -> list[Path]:
    return preflight_paths(pytestconfig, ml4_target)


@pytest.fixture(scope="session")
def ml4_preflight_report(pytestconfig: pytest.Config, ml4_preflight_paths: list[Path], ml4_target: Target) -> Report:
    """All rules over all the paths together (cross-file rules need them at once), tied to the target's hardware."""
    missing = [str(p) for p in ml4_preflight_paths if not p.exists()]
    if missing:
        pytest.fail(f"preflight: manifests listed for target {ml4_target.name} do not exist: {', '.join(missing)}")
    # The files describe the deployment as declared, proxy included, even when this run goes around the proxy.
    from pytest_ml4.plugin.state import get_state

    declared = get_state(pytestconfig).declared_target or ml4_target
    return lint_paths(list(ml4_preflight_paths), declared)
