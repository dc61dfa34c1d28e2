"""A team writing its own target file: near names for typos, overrides blamed as overrides, free-text sources,
the Kubernetes place given once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ml4.datafile import field_names_at
from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.target.model import (
    Target,
    TargetError,
    load_target,
    parse_override,
)


def team_target(tmp_path: Path, name: str = "gb300-agg", mutate: Any = None) -> Path:
    """A copy of a bundled target in a team's ``targets/`` folder, changed by ``mutate(data)``."""
    data = yaml.safe_load((BUNDLED_TARGETS_DIR / f"{name}.yaml").read_text())
    if mutate:
        mutate(data)
    path = tmp_path / "targets" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("section, typo, near", [
    ("gates", "ttft_p99_knee", "ttft_p99_knee_s"),
    ("engine", "max_num_seq", "max_num_seqs"),
    ("hardware", "memory_per_gpu", "memory_per_gpu_gib"),
])
def test_an_unknown_key_gets_the_near_field_name(tmp_path: Path, section: str, typo: str, near: str) -> None:
    path = team_target(tmp_path, mutate=lambda d: d[section].update({typo: 1}))
    with pytest.raises(TargetError) as exc:
        load_target(str(path))
    assert str(exc.value) == (f"invalid target file {path}: field '{section}.{typo}': unknown field; "
                              f"did you mean '{near}'?")


def test_a_typo_inside_a_workload_slo_is_found_through_the_mapping(tmp_path: Path) -> None:
    path = team_target(tmp_path, mutate=lambda d: d["perf"]["workloads"]["chat"]["slo"].update(ttft_p99=3))
    with pytest.raises(TargetError, match=r"field 'perf\.workloads\.chat\.slo\.ttft_p99': unknown field; did you "
                                          r"mean 'ttft_p99_s'\?"):
        load_target(str(path))


def test_an_unknown_key_far_from_any_field_says_only_unknown() -> None:
    assert "did you mean" not in str(_error_of({"gates": {"zzzz": 1}}))
    assert field_names_at(Target, ("gates",))[:2] == ["ttft_p50_s_max", "decode_tok_s_user_p50_min"]
    assert field_names_at(Target, ("nope",)) == []


def _error_of(overrides: dict[str, Any]) -> TargetError:
    with pytest.raises(TargetError) as exc:
        load_target("rtxpro6000-tp8", overrides=overrides, option="--ml4-set")
    return exc.value


def test_an_override_error_names_the_option_and_value_not_the_file() -> None:
    err = _error_of(parse_override("engine.max_num_seqs=many"))
    assert err.from_override
    assert str(err).startswith("invalid --ml4-set engine.max_num_seqs=many: field 'engine.max_num_seqs': ")
    assert "rtxpro6000-tp8.yaml" not in str(err)
    typo = _error_of(parse_override("gates.ttft_p99_knee=4"))
    assert str(typo) == ("invalid --ml4-set gates.ttft_p99_knee=4: field 'gates.ttft_p99_knee': unknown field; "
                         "did you mean 'ttft_p99_knee_s'?")


def test_an_override_breaking_a_section_rule_is_blamed_on_the_override() -> None:
    with pytest.raises(TargetError) as exc:
        load_target("gb300-agg", overrides=parse_override("serving.stack=vllm"), option="--set")
    assert exc.value.from_override and str(exc.value).startswith("invalid --set serving.stack=vllm: field 'serving'")


def test_the_plugin_reports_an_override_error_as_the_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(ml4_target): pass")
    result = pytester.runpytest("--target", "rtxpro6000-tp8", "--ml4-set", "engine.max_num_seqs=-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    line = "ERROR: invalid --ml4-set engine.max_num_seqs=-1: field 'engine.max_num_seqs': Input should be greater than 0"
    result.stderr.fnmatch_lines([line])


def test_a_team_target_cites_its_own_slo_document(tmp_path: Path) -> None:
    doc = "platform SLO v3 (wiki/slo#chat), 2026-11"
    path = team_target(tmp_path, mutate=lambda d: d["perf"]["workloads"]["chat"]["slo"].update(source=doc))
    assert load_target(str(path)).perf.workloads["chat"].slo.source == doc


def test_a_bundled_target_still_cites_a_seed() -> None:
    with pytest.raises(TargetError, match="must cite a seed"):
        load_target("gb300-agg", overrides={"perf": {"workloads": {"chat": {"source": "made up"}}}})


def test_the_dgd_and_namespace_are_given_once_under_control(tmp_path: Path) -> None:
    t = load_target("gb300-agg")
    assert t.control.dgd == "mistral-large-4-agg-gb300" and t.control.namespace_env == "ML4_NAMESPACE"
    old = team_target(tmp_path, mutate=lambda d: d["logs"].update(dgd="mistral-large-4-agg-gb300",
                                                                    namespace_env="ML4_NAMESPACE"))
    with pytest.raises(TargetError) as exc:
        load_target(str(old))
    assert str(exc.value) == (f"invalid target file {old}: field 'logs': Value error, dgd, namespace_env moved to "
                              "the control section: the DGD and its namespace are given once, under control, for "
                              "log reading and restarts alike (remove them from logs)")


def test_kubernetes_logs_need_a_kubernetes_control(tmp_path: Path) -> None:
    path = team_target(tmp_path, mutate=lambda d: d.update(control={"kind": "systemd", "unit": "x.service"}))
    with pytest.raises(TargetError, match="logs of kind kubernetes read the pods of control.dgd"):
        load_target(str(path))
    no_dgd = team_target(tmp_path, mutate=lambda d: d["control"].pop("dgd"))
    with pytest.raises(TargetError, match="control of kind kubernetes needs 'dgd'"):
        load_target(str(no_dgd))
