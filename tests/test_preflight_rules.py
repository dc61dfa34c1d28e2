"""Preflight rules against their fixtures, the shipped target manifests and the ``ml4-preflight`` CLI.

Every rule has ``fixtures/preflight/<rule-id>/broken/`` (which it must flag with an error) and ``clean/``
(which no rule may flag with an error).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from checkout import FIXTURES_DIR, REPO_ROOT

from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.preflight import RULES, Severity, lint_paths
from pytest_ml4.preflight.cli import main
from pytest_ml4.target.model import known_targets, load_target

CASES = FIXTURES_DIR / "preflight"


@pytest.mark.parametrize("rule_id", list(RULES))
def test_broken_fixture_is_flagged(rule_id: str) -> None:
    broken = CASES / rule_id / "broken"
    assert broken.is_dir(), f"rule {rule_id} has no broken fixture at {broken}"
    report = lint_paths([broken])
    hits = [f for f in report.by_rule(rule_id) if f.severity is Severity.ERROR]
    assert hits, f"{rule_id} did not flag {broken}; findings: {[f.rule_id for f in report.findings]}"
    for f in hits:
        assert f.message and f.fix and f.source and f.path.startswith("fixtures/preflight/")


@pytest.mark.parametrize("rule_id", list(RULES))
def test_clean_fixture_passes(rule_id: str) -> None:
    clean = CASES / rule_id / "clean"
    assert clean.is_dir(), f"rule {rule_id} has no clean fixture at {clean}"
    report = lint_paths([clean])
    assert report.documents, f"nothing parsed in {clean}"
    assert not report.by_rule(rule_id), "\n".join(f.format() for f in report.by_rule(rule_id))
    assert report.ok, "\n".join(f.format() for f in report.errors())


def test_every_fixture_dir_names_a_rule() -> None:
    assert sorted(p.name for p in CASES.iterdir() if p.is_dir()) == sorted(RULES)


def test_rules_carry_id_message_fix_and_source() -> None:
    for r in RULES.values():
        assert r.id and r.message and r.fix and r.kinds
        assert "seeds/" in r.source or ".md" in r.source or "issue" in r.source, r.id
        assert "\n" not in r.message and "\n" not in r.fix


@pytest.mark.parametrize("name", known_targets())
def test_shipped_target_manifests_are_clean(name: str) -> None:
    target = load_target(name)
    assert target.manifests, f"target {name} lists no manifests"
    paths = [target.resolve(m) for m in target.manifests]
    report = lint_paths(paths, target)
    assert len(report.documents) >= len(paths)
    assert report.ok, "\n".join(f.format() for f in report.errors())


def test_all_targets_linted_together_are_clean() -> None:
    # Cross-file rules (DGD name prefixes, perf Job -> DGD) see all four Dynamo deployments at once.
    report = lint_paths(sorted(BUNDLED_TARGETS_DIR.glob("*/")))
    assert report.ok, "\n".join(f.format() for f in report.errors())
    assert {d.kind for d in report.documents} >= {"systemd", "litellm", "dgd", "perf-job"}


def test_cli_exit_codes_and_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(CASES / "rtx-util-startup-refused" / "broken")]) == 1
    out = capsys.readouterr().out
    assert "rtx-util-startup-refused" in out and "fix:" in out and "source: seeds/000" in out
    assert main([str(CASES / "rtx-util-startup-refused" / "clean")]) == 0
    assert main(["--rule", "no-such-rule", str(CASES)]) == 2
    assert main(["does/not/exist.yaml"]) == 2
    assert main([]) == 2
    capsys.readouterr()
    assert main(["--list-rules"]) == 0
    listed = capsys.readouterr().out
    assert all(rule_id in listed for rule_id in RULES)


def test_cli_json_and_target_option(capsys: pytest.CaptureFixture[str]) -> None:
    # The clean DGD fixture of the VR rule, forced onto GB300: the Vera Rubin rule no longer applies.
    vr_broken = CASES / "vr200-stability" / "broken"
    assert main(["--format", "json", str(vr_broken)]) == 1
    assert '"rule": "vr200-stability"' in capsys.readouterr().out
    assert main(["--target", "gb300-disagg", "--rule", "vr200-stability", str(vr_broken)]) == 0


def test_console_script_on_targets_and_a_broken_fixture(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("ml4-preflight")
    ok = subprocess.run([str(exe), *sorted(str(p) for p in BUNDLED_TARGETS_DIR.glob("*/"))], cwd=REPO_ROOT, check=False,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([str(exe), str(CASES / "aiperf-ignore-eos" / "broken")], cwd=REPO_ROOT, check=False,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "aiperf-ignore-eos" in bad.stdout


def test_literal_secret_value_never_printed(capsys: pytest.CaptureFixture[str]) -> None:
    broken = CASES / "literal-secret" / "broken"
    secret = "sk-fixture-not-a-real-key-0000"
    assert secret in (broken / "vllm-ml4.service").read_text()
    assert main([str(broken)]) == 1
    assert main(["--format", "json", str(broken)]) == 1
    out = capsys.readouterr()
    assert secret not in out.out + out.err
    report = lint_paths([broken])
    assert all(secret not in repr(d) for d in report.documents)


def test_cli_notes_a_file_with_nothing_to_lint(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(BUNDLED_TARGETS_DIR / "gb300-agg.yaml")]) == 0
    assert "no vLLM launch, DGD, LiteLLM config or aiperf run found" in capsys.readouterr().err
