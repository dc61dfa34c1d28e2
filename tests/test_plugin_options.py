"""The plugin's options, target validation errors and hardware/topology marker skipping, through pytester."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.plugin.markers import skip_reason
from pytest_ml4.target.model import (
    TargetError,
    known_targets,
    load_target,
    parse_override,
)

REPO = Path(__file__).resolve().parent.parent
FIVE = ["gb300-agg", "gb300-disagg", "rtxpro6000-tp8", "vr200-agg", "vr200-disagg"]


def test_the_five_seed_targets_load() -> None:
    assert known_targets() == FIVE
    families = {n: load_target(n).family for n in FIVE}
    assert families == {"gb300-agg": "gb300", "gb300-disagg": "gb300", "rtxpro6000-tp8": "rtxpro",
                        "vr200-agg": "vr200", "vr200-disagg": "vr200"}
    assert load_target("rtxpro6000-tp8").engine.max_num_seqs == 16
    assert load_target("rtxpro6000-tp8").gates.kv_pool_tokens_min == 256000
    assert load_target("gb300-disagg").prefill_engine is not None


def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(TargetError) as exc:
        load_target("gb200")
    for name in FIVE:
        assert name in str(exc.value)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["engine"].update(max_num_seqs="many"), "engine.max_num_seqs"),
        (lambda d: d["hardware"].update(family="H100"), "hardware.family"),
        (lambda d: d["engine"].update(max_num_seq=16), "engine.max_num_seq"),
        (lambda d: d.pop("endpoint"), "endpoint"),
    ],
)
def test_bad_target_file_names_file_and_field(tmp_path: Path, mutate, field: str) -> None:
    data = yaml.safe_load((BUNDLED_TARGETS_DIR / "rtxpro6000-tp8.yaml").read_text())
    mutate(data)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(TargetError) as exc:
        load_target(str(bad))
    assert str(bad) in str(exc.value)
    assert f"'{field}'" in str(exc.value)


def test_override_parsing() -> None:
    assert parse_override("engine.max_num_seqs=32") == {"engine": {"max_num_seqs": 32}}
    t = load_target("rtxpro6000-tp8", overrides=parse_override("engine.gpu_memory_utilization=0.98"))
    assert t.engine.gpu_memory_utilization == 0.98
    with pytest.raises(TargetError):
        parse_override("engine.max_num_seqs")


def test_skip_reason_names_both_sides() -> None:
    rtx = load_target("rtxpro6000-tp8")
    reason = skip_reason(rtx, {"gb300"})
    assert reason and "gb300" in reason and "rtxpro" in reason and "rtxpro6000-tp8" in reason
    assert skip_reason(rtx, {"rtxpro", "gb300"}) is None
    disagg = load_target("gb300-disagg")
    reason = skip_reason(disagg, {"agg"})
    assert reason and "agg" in reason and "disagg" in reason
    assert skip_reason(disagg, {"disagg", "gb300"}) is None
    assert skip_reason(disagg, {"needs_proxy"}) is not None
    assert skip_reason(rtx, {"dynamo"}) is not None


MARKED = textwrap.dedent(
    """
    import pytest

    @pytest.mark.rtxpro
    def test_rtx(ml4_target):
        assert ml4_target.family == "rtxpro"

    @pytest.mark.gb300
    @pytest.mark.disagg
    def test_gb300_disagg(ml4_target):
        assert ml4_target.topology.kind == "disagg"

    @pytest.mark.vr200
    def test_vr(ml4_target):
        assert ml4_target.family == "vr200"

    def test_any(ml4_target):
        assert ml4_target.name
    """
)


def test_markers_skip_with_reason_on_rtx(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("--target", "rtxpro6000-tp8", "-rs", "--strict-markers")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["*hardware mismatch: test is for gb300; target rtxpro6000-tp8 is rtxpro*",
                                 "*hardware mismatch: test is for vr200; target rtxpro6000-tp8 is rtxpro*"])


def test_markers_skip_with_reason_on_gb300_disagg(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("--target", "gb300-disagg", "-rs")
    result.assert_outcomes(passed=2, skipped=2)


def test_unknown_target_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--target", "h100-tp8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown target 'h100-tp8'; known targets: gb300-agg, gb300-disagg, rtxpro6000-tp8*"])


def test_target_path_and_bad_file(pytester: pytest.Pytester) -> None:
    bad = pytester.path / "variant.yaml"
    data = yaml.safe_load((BUNDLED_TARGETS_DIR / "rtxpro6000-tp8.yaml").read_text())
    data["engine"]["gpu_memory_utilization"] = 1.5
    bad.write_text(yaml.safe_dump(data))
    pytester.makepyfile("def test_x(ml4_target): pass")
    result = pytester.runpytest("--target", str(bad))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # One line: the file and the field.
    result.stderr.fnmatch_lines([f"ERROR: --target: invalid target file {bad}: field 'engine.gpu_memory_utilization': *"])


def test_bad_option_combinations_fail_early(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    r = pytester.runpytest("--target", "rtxpro6000-tp8", "--ml4-fault", "no_done")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*--ml4-fault needs --sim*"])
    r = pytester.runpytest("--target", "rtxpro6000-tp8", "--sim", "--endpoint", "http://127.0.0.1:1/v1")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r = pytester.runpytest("--sim")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*--sim needs --target*rtxpro6000-tp8*"])
    r = pytester.runpytest("--target", "rtxpro6000-tp8", "--ml4-set", "engine")
    assert r.ret == pytest.ExitCode.USAGE_ERROR


def test_header_shows_target_and_host_without_secrets(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("ML4_RTXPRO_URL", "https://user:s3cret@llm.example.internal:8443/v1")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--target", "rtxpro6000-tp8")
    result.stdout.fnmatch_lines(["ml4: target rtxpro6000-tp8 (8x *RTX PRO 6000*, single_node, vllm+litellm)",
                                 "ml4: endpoint llm.example.internal:8443 [live]"])
    assert "s3cret" not in result.stdout.str()


def test_ini_twins(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nml4_target = vr200-agg\n")
    pytester.makepyfile("def test_x(ml4_target):\n    assert ml4_target.name == 'vr200-agg'\n")
    pytester.runpytest().assert_outcomes(passed=1)


def test_strict_markers_clean(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import pytest\n"
        "@pytest.mark.smoke\n@pytest.mark.tools\n@pytest.mark.reasoning\n@pytest.mark.osl\n@pytest.mark.kv\n"
        "@pytest.mark.restart\n@pytest.mark.perf\n@pytest.mark.preflight\n@pytest.mark.rtxpro\n@pytest.mark.gb300\n"
        "@pytest.mark.vr200\n@pytest.mark.agg\n@pytest.mark.disagg\n@pytest.mark.single_node\n"
        "def test_x(): pass\n")
    pytester.runpytest("--strict-markers").assert_outcomes(passed=1)


def test_each_run_gets_its_own_folder(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(ml4_run_dir):\n    (ml4_run_dir / 'x.txt').write_text('1')\n")
    pytester.runpytest("--target", "rtxpro6000-tp8").assert_outcomes(passed=1)
    pytester.runpytest("--target", "rtxpro6000-tp8").assert_outcomes(passed=1)
    runs = sorted((pytester.path / "reports").iterdir())
    assert len(runs) == 2 and all((r / "x.txt").exists() for r in runs)
