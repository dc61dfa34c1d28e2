"""Preflight suite: lint the target's deployment configs, one test per rule.

Runs without any endpoint: ``pytest --target NAME -m preflight suites/``.  Each rule is one test (the Allure
report shows its message, fix and seed source) covering all of the target's manifests at once, so cross-file
rules such as the DGD name-prefix check see every file.  Error findings fail the test; warnings are attached.
A rule with no document of its kinds among the manifests is skipped with that reason: it judged nothing, so it
is no pass.
"""

from __future__ import annotations

from pathlib import Path

import allure
import pytest

from pytest_ml4.checks.codes import fails_with, require
from pytest_ml4.preflight import RULES, Report, Severity
from pytest_ml4.preflight.applied import of_kinds
from pytest_ml4.preflight.loader import collect_files, load_file
from pytest_ml4.target.model import Target

pytestmark = pytest.mark.preflight


def _findings_text(report: Report, rule_id: str) -> str:
    return "\n".join(f.format() for f in report.by_rule(rule_id)) or "no findings"


@pytest.mark.parametrize("rule_id", list(RULES))
@fails_with("preflight.rule_error", "a preflight rule found an error in the target's manifests")
def test_rule(rule_id: str, ml4_preflight_report: Report, ml4_preflight_paths: list[Path],
              ml4_target: Target) -> None:
    rule = RULES[rule_id]
    allure.dynamic.title(f"preflight {rule_id}")
    allure.dynamic.description(f"{rule.message}\n\nFix: {rule.fix}\n\nSource: {rule.source}")
    allure.dynamic.parameter("manifests", ", ".join(p.name for p in ml4_preflight_paths))
    allure.dynamic.parameter("target", ml4_target.name)
    skipped = ml4_preflight_report.skipped(rule_id)
    if skipped is not None:
        allure.attach(skipped.format(), name="not applied", attachment_type=allure.attachment_type.TEXT)
        if not skipped.judged:
            pytest.skip(skipped.format())
    for doc in of_kinds(rule, ml4_preflight_report.documents):
        with allure.step(f"{rule_id} on {doc.path} ({doc.kind})"):
            mine = [f for f in ml4_preflight_report.by_rule(rule_id) if f.path == doc.path]
            allure.attach("\n".join(f.format() for f in mine) or "no findings", name=f"{doc.path} findings",
                          attachment_type=allure.attachment_type.TEXT)
    findings = ml4_preflight_report.by_rule(rule_id)
    if findings:
        allure.attach(_findings_text(ml4_preflight_report, rule_id), name="findings",
                      attachment_type=allure.attachment_type.TEXT)
    errors = [f for f in findings if f.severity is Severity.ERROR]
    # One line per finding and the rule's fix and source once: the message stays short enough to be read (and to be
    # kept whole by the failure-message cap) when one rule fires on many documents; each finding's own fix and
    # source are in the "findings" attachment.
    require(not errors, "preflight.rule_error", lambda: (
        f"{len(errors)} {rule_id} error(s):\n"
        + "\n".join(f"{f.location()}: {f.severity.value}: {rule_id}: {f.message}" for f in errors)
        + f"\n    fix: {rule.fix}\n    source: {rule.source}"))


@fails_with("preflight.nothing_deployable", "a listed manifest holds no vLLM launch, DGD, LiteLLM config or aiperf run")
@fails_with("preflight.unparsable", "a listed manifest has a document that does not parse")
def test_manifests_parse(ml4_preflight_paths: list[Path], ml4_target: Target) -> None:
    """Every manifest the target lists yields at least one deployable document and no parse error."""
    empty, broken = [], []
    for path in collect_files(list(ml4_preflight_paths)):
        docs = load_file(path, ml4_target)
        if not docs:
            empty.append(str(path))
        broken += [f"{d.path}: {e}" for d in docs for e in d.errors]
    require(not empty, "preflight.nothing_deployable",
            lambda: f"no vLLM launch, DGD, LiteLLM config or aiperf run found in: {', '.join(empty)}")
    require(not broken, "preflight.unparsable", lambda: "\n".join(broken))
