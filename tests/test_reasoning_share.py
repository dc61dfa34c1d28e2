"""The reasoning-share gate against its stored baseline (issue 14 item 12): a shift fails, noise within the
tolerance passes, a baseline taken at another output length is not compared."""

from __future__ import annotations

import json

from pytest_ml4.checks.reasoning import share_baseline_drift
from pytest_ml4.targets import FIXTURES_DIR

BASELINE = json.loads((FIXTURES_DIR / "baselines" / "reasoning-share-rtxpro6000-tp8.json").read_text())
PROMPTS = list(BASELINE["shares"])


def _rows(*shares: float) -> list[dict[str, object]]:
    return [{"prompt": p, "share": s} for p, s in zip(PROMPTS, shares)]


def test_share_within_tolerance_passes() -> None:
    assert share_baseline_drift(_rows(0.60, 0.50), BASELINE, 256, "b.json") == []


def test_share_moved_past_tolerance_fails_naming_the_prompt() -> None:
    problems = share_baseline_drift(_rows(0.78, 0.55), BASELINE, 256, "b.json")
    assert len(problems) == 1 and "reasoning share 78.0%, baseline 58.2% (tolerance 10%, b.json)" in problems[0]


def test_other_output_length_or_unknown_prompt_fails() -> None:
    assert "this run uses 512" in share_baseline_drift(_rows(0.58, 0.54), BASELINE, 512, "b.json")[0]
    unknown = share_baseline_drift([{"prompt": "new prompt", "share": 0.5}], BASELINE, 256, "b.json")
    assert "no baseline share for prompt 'new prompt'" in unknown[0]
