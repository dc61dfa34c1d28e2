"""Preflight without known hardware: every rule that does not depend on it still runs, the
others are listed as not applied with the flag that would apply them, and only errors found fail the run."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.preflight import RULES, Severity, lint_documents, load_paths
from pytest_ml4.preflight.applied import rule_needs
from pytest_ml4.preflight.cli import main
from pytest_ml4.preflight.model import UNKNOWN_HARDWARE

REPO = Path(__file__).resolve().parent.parent
SEED_UNIT = BUNDLED_TARGETS_DIR / "rtxpro6000-tp8" / "vllm-ml4.service"  # the seed's stable unit
CASES = REPO / "fixtures" / "preflight"


@pytest.fixture
def unit_099(tmp_path: Path) -> Path:
    """A copy of the seed's unit with the start-up-refused --gpu-memory-utilization 0.99, tied to no target."""
    text = SEED_UNIT.read_text()
    assert "--gpu-memory-utilization 0.97" in text
    path = tmp_path / "unit.service"
    path.write_text(text.replace("--gpu-memory-utilization 0.97", "--gpu-memory-utilization 0.99"))
    return path


def _not_applied_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("ml4-preflight: not applied")]


def test_no_hardware_lists_the_hardware_rules_and_the_flag_and_exits_0(unit_099: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(unit_099)]) == 0, "no error found among the rules that could run"
    out = capsys.readouterr().out
    (hw_line,) = [ln for ln in _not_applied_lines(out) if "depends on the hardware" in ln]
    assert hw_line.startswith(f"ml4-preflight: not applied to {unit_099} (depends on the hardware, which is "
                              "unknown; pass --target NAME (known: ")
    assert "rtxpro6000-tp8" in hw_line and "'# ml4-target: NAME'" in hw_line
    assert hw_line.endswith("): rtx-moe-workspace-oom, rtx-util-startup-refused, rtx-expandable-segments")
    (target_line,) = [ln for ln in _not_applied_lines(out) if "no target is known" in ln]
    assert target_line.endswith("): kv-pool-below-max-model-len, target-manifest-drift")
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(r"ml4-preflight: 1 document\(s\), \d+ of \d+ rule\(s\) applied: 0 error\(s\), "
                        r"\d+ warning\(s\)", summary), summary
    assert "error: rtx-util-startup-refused" not in out


def test_the_flag_named_applies_the_rule(unit_099: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", "rtxpro6000-tp8", str(unit_099)]) == 1
    out = capsys.readouterr().out
    assert "error: rtx-util-startup-refused" in out and "--gpu-memory-utilization 0.99 asks for 94.11 GiB" in out
    assert not [ln for ln in _not_applied_lines(out) if "rtx-util-startup-refused" in ln]


def test_an_ml4_target_comment_applies_it_too(unit_099: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unit_099.write_text("# ml4-target: rtxpro6000-tp8\n" + unit_099.read_text())
    assert main([str(unit_099)]) == 1
    assert "error: rtx-util-startup-refused" in capsys.readouterr().out


def test_hardware_independent_errors_still_fail_without_hardware(unit_099: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    text = unit_099.read_text().replace("--api-key ${VLLM_API_KEY}", "--api-key sk-literal-0123456789abcdef")
    assert "sk-literal" in text, "the seed's unit references its key"
    unit_099.write_text(text)
    assert main([str(unit_099)]) == 1
    out = capsys.readouterr().out
    assert "error: literal-secret" in out and "sk-literal" not in out


def test_json_lists_what_was_not_applied(unit_099: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--format", "json", str(unit_099)]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_rule = {n["rule"]: n for n in doc["not_applied"]}
    assert by_rule["rtx-util-startup-refused"]["paths"] == [str(unit_099)]
    assert by_rule["rtx-util-startup-refused"]["judged"] == 0
    assert by_rule["rtx-util-startup-refused"]["flag"].startswith("pass --target NAME")
    assert by_rule["migration-limit"]["paths"] == [] and "dgd" in by_rule["migration-limit"]["reason"]


def test_the_needs_table_names_real_rules() -> None:
    assert set(rule_needs()) <= set(RULES)


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_the_needs_table_matches_what_each_rule_does_without_hardware(rule_id: str) -> None:
    """On its broken case with hardware and target taken away, a rule the table lists as needing them finds
    nothing and says it was not applied; any other rule still finds its error (else the table misses it)."""
    docs = [dataclasses.replace(d, hardware=UNKNOWN_HARDWARE, target=None)
            for d in load_paths([CASES / rule_id / "broken"])]
    report = lint_documents(docs, [RULES[rule_id]])
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    if rule_id in rule_needs():
        assert not errors, f"{rule_id} judged without what the table says it needs"
        skipped = report.skipped(rule_id)
        assert skipped is not None and skipped.judged == 0 and skipped.paths
    else:
        assert errors, (f"{rule_id} finds nothing on its broken case without hardware: list what it needs in "
                        "pytest_ml4/data/preflight/rule_needs.yaml")
        assert report.skipped(rule_id) is None


def _target_report(name: str):  # type: ignore[no-untyped-def]
    from pytest_ml4.target.model import load_target

    target = load_target(name)
    return lint_documents(load_paths([target.resolve(m) for m in target.manifests], target))


@pytest.mark.parametrize(("target", "rule_id", "family"), [
    ("gb300-agg", "vr200-stability", "VR200"),
    ("gb300-agg", "rtx-moe-workspace-oom", "RTX PRO 6000"),
    ("gb300-agg", "rtx-util-startup-refused", "RTX PRO 6000"),
    ("vr200-agg", "rtx-moe-workspace-oom", "RTX PRO 6000"),
])
def test_another_familys_rule_is_not_applied_on_a_known_family(target: str, rule_id: str, family: str) -> None:
    """Caught: on gb300-agg's own DGD the VR200 and RTX PRO rules judged it and passed (nothing of theirs to
    flag), so the suite counted a pass that judged nothing. Now not applied, without a flag."""
    skipped = _target_report(target).skipped(rule_id)
    assert skipped is not None and skipped.judged == 0 and skipped.paths
    assert skipped.reason.startswith(f"{family} hardware only") and skipped.flag is None


def test_a_familys_rule_is_applied_on_its_own_family() -> None:
    assert _target_report("vr200-agg").skipped("vr200-stability") is None
    assert _target_report("rtxpro6000-tp8").skipped("rtx-util-startup-refused") is None
