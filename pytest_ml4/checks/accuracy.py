"""Accuracy verdicts: the run may certify accuracy, every BFCL request was answered, and no category dropped
significantly below the stored baseline.

Which categories dropped (more than the tolerance, with statistical significance) is decided in the core
(:func:`pytest_ml4.accuracy.gate.compare`) because the accuracy summary records it whatever the outcome; this module
only judges. Nothing here needs pytest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pytest_ml4.accuracy.gate import Drop
from pytest_ml4.accuracy.score import ItemResult
from pytest_ml4.accuracy.synthetic import refusal
from pytest_ml4.checks.codes import fails_with, require
from pytest_ml4.checks.verdict import not_judged

#: BFCL error types that mean the deployment did not answer (scored as a wrong answer otherwise).
UNANSWERED = ("http_error", "bad_response")


@fails_with("accuracy.synthetic_acceptance",
            "an engine runs synthetic speculative acceptance: its accuracy cannot be certified")
def assert_no_synthetic_acceptance(refused: Sequence[str], engine_unread: str = "") -> None:
    """No engine launch runs synthetic speculative acceptance (its outputs are not the model's): neither what the
    deployment declares nor what the running engine logged. Not judged when the engine's config was not seen."""
    require(not refused, "accuracy.synthetic_acceptance", lambda: refusal(list(refused)))
    if engine_unread:
        not_judged(f"synthetic acceptance: the declared configuration has none, but {engine_unread}")


@fails_with("accuracy.requests_failed", "BFCL requests got no chat completion (an error scored as a wrong answer)")
def assert_every_request_answered(results: Sequence[ItemResult]) -> None:
    errors = [r for r in results if r.error_type.startswith(UNANSWERED)]
    require(not errors, "accuracy.requests_failed",
            lambda: f"{len(errors)}/{len(results)} BFCL requests failed, e.g. {errors[0].id}: "
                    f"{errors[0].error_type} {errors[0].errors[0][:200]}")


@fails_with("accuracy.regression", "a BFCL category's accuracy dropped significantly below the stored baseline")
def assert_no_significant_drop(drops: Sequence[Drop], baseline: Path | None, missing: str, tolerance: float,
                               alpha: float, recorded: Path | None = None) -> None:
    """No category dropped significantly; not judged without a baseline (``missing`` says why there is none);
    passes as recorded when this run wrote the deployment's baseline (``recorded``, --ml4-record-baselines)."""
    if recorded is not None:
        print(f"accuracy recorded as this deployment's baseline: {recorded}")
        return
    if baseline is None:
        not_judged(f"accuracy (figures in accuracy-summary.json): {missing}")
    require(not drops, "accuracy.regression",
            lambda: f"accuracy regression vs baseline {baseline} (tolerance {tolerance * 100:g} points, "
                    f"alpha {alpha:g}): " + "; ".join(d.describe() for d in drops))
