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
from pytest_ml4.accuracy.synthetic import refusal
from pytest_ml4.checks.accuracy import (
    assert_every_request_answered,
    assert_no_significant_drop,
    assert_no_synthetic_acceptance,
)
from pytest_ml4.checks.codes import fail, fails_with
from pytest_ml4.report.attach import attach_json, attach_text

pytestmark = pytest.mark.accuracy


@fails_with("accuracy.run_refused", "the accuracy run was refused (synthetic acceptance): no accuracy figure may pass")
def _measured(run):  # type: ignore[no-untyped-def]
    if run.refused:
        fail("accuracy.run_refused", refusal(run.refused))
    return run


def test_no_synthetic_acceptance(ml4_accuracy) -> None:  # type: ignore[no-untyped-def]
    """The deployment runs real speculative acceptance (declared, and in the running engine's logged config), so
    its accuracy can be certified"""
    assert_no_synthetic_acceptance(ml4_accuracy.refused, ml4_accuracy.engine_unread)


def test_every_request_answered(ml4_accuracy) -> None:  # type: ignore[no-untyped-def]
    """Every BFCL request got a chat completion (an error would be scored as a wrong answer)"""
    assert_every_request_answered(_measured(ml4_accuracy).results)


@fails_with("baseline.refused")
def test_accuracy_vs_baseline(ml4_accuracy) -> None:  # type: ignore[no-untyped-def]
    """No BFCL category's accuracy dropped significantly below the stored baseline"""
    run = _measured(ml4_accuracy)
    text = table(run.scores, run.baseline.scores if run.baseline else None)
    attach_text(text, "BFCL accuracy per category")
    attach_json(failed_items(run.results), "BFCL failed items (question, expected, got, error type)")
    print(text)
    if run.baseline_refused:
        fail("baseline.refused", run.baseline_refused)
    assert_no_significant_drop(run.drops, run.baseline.path if run.baseline else None, run.baseline_missing,
                               run.options.tolerance, run.options.alpha, recorded=run.recorded)
