"""Open hardware: any lowercase GPU family is a valid target; what is known per family applies only where known."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.perf.roofline import roofline
from pytest_ml4.plugin.markers import skip_reason
from pytest_ml4.targets import TargetError, load_target


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
