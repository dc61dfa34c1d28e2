"""Run the rules over documents and collect a :class:`Report` (used by the CLI and the pytest suite)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pytest_ml4.preflight.applied import NotApplied, not_applied
from pytest_ml4.preflight.loader import load_paths
from pytest_ml4.preflight.model import Document, Finding, LintContext, Rule, Severity
from pytest_ml4.preflight.rules import RULES
from pytest_ml4.target.model import Target


@dataclass
class Report:
    """Findings of one lint run, with the documents they came from, the rules that ran, and those that could not
    judge some or all documents (``not_applied``: never to be read as passes)."""

    documents: list[Document]
    findings: list[Finding] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    not_applied: list[NotApplied] = field(default_factory=list)

    def skipped(self, rule_id: str) -> NotApplied | None:
        """Why the rule judged none or only some of the documents, or None when it judged all of them."""
        return next((n for n in self.not_applied if n.rule_id == rule_id), None)

    def applied(self) -> list[Rule]:
        """The rules that judged at least one document."""
        return [r for r in self.rules if (n := self.skipped(r.id)) is None or n.judged > 0]

    def by_rule(self, rule_id: str) -> list[Finding]:
        return [f for f in self.findings if f.rule_id == rule_id]

    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def ok(self) -> bool:
        return not self.errors()


def lint_documents(documents: list[Document], rules: list[Rule] | None = None) -> Report:
    """All rules (or the given ones) over ``documents`` together, so cross-file rules see every file."""
    chosen = list(RULES.values()) if rules is None else rules
    ctx = LintContext(documents=documents)
    report = Report(documents=documents, rules=chosen)
    for r in chosen:
        found = list(r.check(ctx))
        report.findings += found
        skipped = not_applied(r, documents, bool(found))
        if skipped is not None:
            report.not_applied.append(skipped)
    return report


def lint_paths(paths: list[str | Path], target: Target | None = None, rules: list[Rule] | None = None) -> Report:
    """Parse every config file under ``paths`` and lint them together."""
    return lint_documents(load_paths(paths, target), rules)
