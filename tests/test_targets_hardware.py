"""Open hardware: any lowercase GPU family is a valid target; what is known per family applies only where known."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.perf.roofline import roofline
from pytest_ml4.plugin.markers import skip_reason
from pytest_ml4.preflight.cli import main as preflight_main
from pytest_ml4.preflight.parsers import infer_hardware
from pytest_ml4.target.hardware import simulation_refusal
from pytest_ml4.target.model import TargetError, load_target

SIM_REFUSAL = ("--sim cannot simulate hardware.family {family}: no seed describes its boot, memory and timing "
               "(it simulates: rtxpro, gb300, vr200); run it live, or pick one of those families")
SEED_UNIT = BUNDLED_TARGETS_DIR / "rtxpro6000-tp8" / "vllm-ml4.service"  # the seed's stable unit


def h200_data(**hardware: Any) -> dict[str, Any]:
    """The rtxpro target rewritten as an 8x H200 box: only what a team knows from its spec sheet."""
    data = yaml.safe_load((BUNDLED_TARGETS_DIR / "rtxpro6000-tp8.yaml").read_text())
    data["name"] = "mine"
    data["hardware"] = {"gpu": "NVIDIA H200", "family": "h200", "count": 8, "memory_per_gpu_gib": 139.8,
                        **hardware}
    return data


def write_target(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "targets" / "mine.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("family", ["h100", "h200", "b200", "gb200", "mi300x", "rtx-6000"])
def test_any_lowercase_family_loads_without_the_simulator_only_fields(tmp_path: Path, family: str) -> None:
    data = h200_data(family=family)
    t = load_target(str(write_target(tmp_path, data)))
    assert t.family == family
    assert t.hardware.compute_capability is None
    assert t.hardware.memory_bandwidth_tb_s is None
    assert t.hardware.interconnect is None


@pytest.mark.parametrize("family", ["H200", "h 200", "", "200h"])
def test_a_family_that_is_not_a_lowercase_name_is_refused_naming_the_field(tmp_path: Path, family: str) -> None:
    path = write_target(tmp_path, h200_data(family=family))
    with pytest.raises(TargetError) as exc:
        load_target(str(path))
    assert str(path) in str(exc.value) and "'hardware.family'" in str(exc.value)


def test_a_gb300_test_on_an_h200_target_is_skipped_naming_both(tmp_path: Path) -> None:
    t = load_target(str(write_target(tmp_path, h200_data())))
    reason = skip_reason(t, {"gb300"})
    assert reason is not None and "gb300" in reason and "h200" in reason and "mine" in reason
    assert skip_reason(t, {"smoke"}) is None


def test_no_bandwidth_no_roofline(tmp_path: Path) -> None:
    t = load_target(str(write_target(tmp_path, h200_data())))
    assert roofline(t, 50.0, 1) is None
    with_bw = load_target(str(write_target(tmp_path, h200_data(memory_bandwidth_tb_s=4.8))))
    roof = roofline(with_bw, 50.0, 1)
    assert roof is not None and roof.bandwidth_tb_s == pytest.approx(4.8 * 8)


def test_a_gpu_product_names_its_family_longest_first() -> None:
    assert infer_hardware({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB200"}}).family == "gb200"
    assert infer_hardware({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"}}).family == "b200"
    assert infer_hardware({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}).family == "h200"
    assert infer_hardware({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"}}).family == "gb300"
    assert infer_hardware({"nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"}}).family is None


def test_preflight_on_h200_says_no_memory_calibration_and_applies_no_rtx_rule(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The seed's unit on an H200: what the seeds measured on other cards (the RTX memory rules, the memory model)
    judges nothing here, so those rules are listed as not applied, with the family named, never passed."""
    target = write_target(tmp_path, h200_data())
    unit = tmp_path / SEED_UNIT.name
    unit.write_text(SEED_UNIT.read_text())
    assert preflight_main(["--target", str(target), str(unit)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("ml4-preflight: not applied")]
    (memory,) = [ln for ln in lines if "no memory-model calibration for h200" in ln]
    assert memory.endswith(": kv-pool-below-max-model-len")
    assert "rtxpro, gb300, vr200" in memory
    (rtx,) = [ln for ln in lines if "RTX PRO 6000 hardware only" in ln]
    assert "rtx-util-startup-refused" in rtx and "rtx-moe-workspace-oom" in rtx


def test_preflight_on_a_known_family_still_applies_the_memory_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = h200_data(family="gb300", memory_per_gpu_gib=268.0)
    unit = tmp_path / SEED_UNIT.name
    unit.write_text(SEED_UNIT.read_text().replace("--max-model-len 256000", "--max-model-len 9000000"))
    assert preflight_main(["--target", str(write_target(tmp_path, data)), str(unit)]) == 1
    out = capsys.readouterr().out
    assert "error: kv-pool-below-max-model-len" in out and "(estimate)" in out


def test_sim_refuses_an_unknown_family_in_one_line(pytester: pytest.Pytester) -> None:
    target = write_target(pytester.path, h200_data())
    pytester.makepyfile("def test_x(ml4_target): pass")
    result = pytester.runpytest("--target", str(target), "--sim")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: target mine: {SIM_REFUSAL.format(family='h200')}"])
    live = pytester.runpytest("--target", str(target), "-p", "no:randomly")
    live.assert_outcomes(passed=1)


def test_ml4_sim_refuses_an_unknown_family_in_one_line(tmp_path: Path) -> None:
    target = write_target(tmp_path, h200_data(family="mi300x"))
    proc = subprocess.run([sys.executable, "-m", "pytest_ml4_sim.deploy.sim_cli", "--target", str(target), "--port", "0"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "LLM_API_KEY": "x"},
                          check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: target mine: {SIM_REFUSAL.format(family='mi300x')}"]


def test_sim_of_a_target_without_symmetric_memory_needs_its_compute_capability(tmp_path: Path) -> None:
    t = load_target(str(write_target(tmp_path, h200_data(family="rtxpro", symmetric_memory=False))))
    assert simulation_refusal(t.hardware) == ("--sim needs hardware.compute_capability for the SymmMemCommunicator "
                                              "boot warning of a target without symmetric memory "
                                              "(symmetric_memory: false)")
    assert simulation_refusal(load_target("rtxpro6000-tp8").hardware) is None
