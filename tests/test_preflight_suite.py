"""The preflight suite end to end through pytest: one test per rule, no endpoint, failing on a broken config."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ml4.preflight import RULES


def _run(pytester: pytest.Pytester, repo_root: Path, *extra: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--target", "rtxpro6000-tp8", "-m", "preflight", "-p", "no:randomly", "-p", "no:cacheprovider",
        "--ml4-reports", str(pytester.path / "reports"), str(repo_root / "suites" / "test_preflight.py"), *extra)


def test_suite_passes_on_the_shipped_manifests(pytester: pytest.Pytester, repo_root: Path) -> None:
    result = _run(pytester, repo_root)
    result.assert_outcomes(passed=len(RULES) + 1)


def test_suite_fails_the_rule_a_broken_config_breaks(pytester: pytest.Pytester, repo_root: Path) -> None:
    broken = repo_root / "fixtures" / "preflight" / "rtx-util-startup-refused" / "broken"
    result = _run(pytester, repo_root, "--preflight-path", str(broken), "-rf")
    failed = {line.split("[", 1)[1].split("]", 1)[0] for line in result.outlines
              if line.startswith("FAILED") and "test_rule[" in line}
    # 0.99 is refused at start-up and also differs from the target's 0.97.
    assert failed == {"rtx-util-startup-refused", "target-manifest-drift"}, result.outlines[-15:]
