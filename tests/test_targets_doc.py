"""docs/targets.md and docs/targets.schema.json are generated from the target model and must not drift from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from pytest_ml4.locations import BUNDLED_TARGETS_DIR
from pytest_ml4.target.doc import (
    DOC,
    READERS_FILE,
    REGENERATE,
    SCHEMA,
    main,
    outputs,
    read_by,
    sections,
)
from pytest_ml4.target.model import Target

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("relpath", [DOC, SCHEMA])
def test_the_committed_file_is_what_the_model_generates(relpath: Path) -> None:
    generated = outputs(REPO)[REPO / relpath]
    committed = (REPO / relpath).read_text(encoding="utf-8") if (REPO / relpath).is_file() else ""
    assert committed == generated, f"{relpath} differs from the target model; regenerate with: {REGENERATE}"


def test_every_field_of_every_section_has_a_row_with_a_description() -> None:
    doc = (REPO / DOC).read_text(encoding="utf-8")
    for prefix, model in sections():
        title = prefix.rstrip(".") or "top level"
        assert f"## `{title}`" in doc
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no Field(description=...)"
            assert f"| `{name}` |" in doc


def test_every_readers_row_names_a_real_field() -> None:
    """A row for a field the model does not have (renamed, removed) would document nothing."""
    for path in yaml.safe_load(READERS_FILE.read_text()):
        model: type[BaseModel] | None = Target
        for part in str(path).split("."):
            assert model is not None and part in model.model_fields, f"{READERS_FILE}: {path} is not a target field"
            sub = model.model_fields[part].annotation
            model = next((t for t in getattr(sub, "__args__", (sub,)) if isinstance(t, type)
                          and issubclass(t, BaseModel)), None)


def test_readers_fall_back_to_the_section() -> None:
    assert read_by("gates.kv_usage_pct_max") == "kv"
    assert read_by("gates.ttft_p99_knee_s") == "perf"
    assert read_by("perf.workloads.chat.slo.ttft_p99_s") == "perf"
    assert read_by("hardware.interconnect") == "-"


def test_check_mode_names_the_stale_file_and_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(tmp_path), "--check"]) == 1
    assert capsys.readouterr().err.strip().endswith(f"differ from the target model; regenerate with: {REGENERATE}")
    assert main(["--root", str(tmp_path)]) == 0
    assert main(["--root", str(tmp_path), "--check"]) == 0


def test_the_schema_accepts_the_bundled_targets_shape() -> None:
    schema = json.loads((REPO / SCHEMA).read_text())
    data = yaml.safe_load((BUNDLED_TARGETS_DIR / "gb300-disagg.yaml").read_text())
    assert set(data) <= set(schema["properties"])
    assert set(schema["required"]) <= set(data)
    assert schema["additionalProperties"] is False
