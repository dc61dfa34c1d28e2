"""Preflight: lint deployment configs (vLLM units/scripts, DGDs, LiteLLM configs, aiperf Jobs) against the
pitfalls the seeds paid for, without any endpoint.

Works without pytest::

    from pytest_ml4.preflight import lint_paths, RULES
    report = lint_paths(["targets/gb300-disagg/"])
    for finding in report.findings:
        print(finding.format())

Console: ``ml4-preflight PATH... [--target NAME]`` (exit 1 when any error-severity finding).
"""

from __future__ import annotations

from pytest_ml4.preflight.lint import Report, lint_documents, lint_paths
from pytest_ml4.preflight.loader import load_file, load_paths
from pytest_ml4.preflight.model import Document, Finding, Rule, Severity
from pytest_ml4.preflight.rules import RULES

__all__ = ["RULES", "Document", "Finding", "Report", "Rule", "Severity", "lint_documents", "lint_paths",
           "load_file", "load_paths"]
