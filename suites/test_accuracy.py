"""Tool-calling accuracy after a model or image change: BFCL's single-turn categories, scored by BFCL's checker.

Seed 002: ``nvfp4_ds_mla`` "changes numerics, so re-run an accuracy check after any model or image change", and
DSpark's synthetic acceptance is "never [to be used] for accuracy evaluation". The deployment's chat endpoint gets
BFCL's prompts with BFCL's tools (its own ``convert_to_tool``) at temperature 0 and a fixed seed; each reply's
``tool_calls`` are judged by ``bfcl_eval``'s ``ast_checker``. A category fails the gate when it dropped by more
than the tolerance against the stored baseline with statistical significance (one-sided two-proportion test).
"""

from __future__ import annotations

import pytest

from pytest_ml4.accuracy.gate import failed_items, table
from pytest_ml4.accuracy.guard import refusal
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.report.attach import attach_json, attach_text

pytestmark = pytest.mark.accuracy


def _measured(run):  # type: ignore[no-untyped-def]
    if run.refused:
        pytest.fail(refusal(run.refused), pytrace=False)
    return run


def test_no_synthetic_acceptance(ml4_accuracy) -> None:  # type: ignore[no-untyped-def]
    """The deployment runs real speculative acceptance, so its accuracy can be certified"""
    assert not ml4_accuracy.refused, refusal(ml4_accuracy.refused)


def test_every_request_answered(ml4_accuracy) -> None:  # type: ignore[no-untyped-def]
    """Every BFCL request got a chat completion (an error would be scored as a wrong answer)"""
    run = _measured(ml4_accuracy)
    errors = [r for r in run.results if r.error_type.startswith(("http_error", "bad_response"))]
    assert not errors, (f"{len(errors)}/{len(run.results)} BFCL requests failed, e.g. {errors[0].id}: "
                        f"{errors[0].error_type} {errors[0].errors[0][:200]}")


def test_accuracy_vs_baseline(ml4_accuracy) -> None:  # type: ignore[no-untyped-def]
    """No BFCL category's accuracy dropped significantly below the stored baseline"""
    run = _measured(ml4_accuracy)
    text = table(run.scores, run.baseline)
    attach_text(text, "BFCL accuracy per category")
    attach_json(failed_items(run.results), "BFCL failed items (question, expected, got, error type)")
    print(text)
    if run.baseline is None:
        not_judged("no accuracy baseline for this target (fixtures/baselines/accuracy-<target>.json or "
                   "--accuracy-baseline); figures recorded in accuracy-summary.json")
    o = run.options
    assert not run.drops, (
        f"accuracy regression vs baseline {o.baseline} (tolerance {o.tolerance * 100:g} points, "
        f"alpha {o.alpha:g}): " + "; ".join(d.describe() for d in run.drops))
