"""The suites' data files load into their models, and a bad one fails with one line naming file, field and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ml4.checks.suite_data import (
    REASONING_FILE,
    SMOKE_FILE,
    TOOLS_FILE,
    SmokeData,
    SuiteDataError,
    ToolsData,
    load_suite_data,
    reasoning_data,
    replicas_data,
    smoke_data,
    tools_data,
)


def test_the_bundled_files_load() -> None:
    assert smoke_data().question.expect_substring == "42"
    assert set(tools_data().cases) >= {"weather", "alarm", "flights"}
    assert reasoning_data().share.prompts == reasoning_data().seed_share.prompts  # one YAML anchor, two fields
    assert replicas_data().unpinned_rounds_per_worker >= 1
    # The error rows keep checks/expected.py's reader, with the file they came from.
    assert smoke_data().answers().expected("vllm", "unknown_model").statuses == (404,)
    assert tools_data().answers().source == TOOLS_FILE and reasoning_data().answers().source == REASONING_FILE


def _broken(tmp_path: Path, source: Path, old: str, new: str) -> Path:
    text = source.read_text()
    assert old in text, f"{source} changed: {old!r} is gone"
    path = tmp_path / source.name
    path.write_text(text.replace(old, new, 1))
    return path


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_wrong_type_names_file_field_and_line(tmp_path: Path) -> None:
    path = _broken(tmp_path, SMOKE_FILE, "requests: 8", "requests: eight")
    with pytest.raises(SuiteDataError) as err:
        load_suite_data(path, SmokeData)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"invalid data file {path}: line {_line_of(path, 'requests: eight')}: "
                              f"field 'burst.requests': ")


def test_a_misspelt_field_names_itself_and_the_missing_one(tmp_path: Path) -> None:
    path = _broken(tmp_path, TOOLS_FILE, "    expect_tool: get_weather\n", "    expect_tol: get_weather\n")
    with pytest.raises(SuiteDataError) as err:
        load_suite_data(path, ToolsData)
    message = str(err.value)
    assert f"line {_line_of(path, 'expect_tol:')}: field 'cases.weather.expect_tol': unknown field; did you mean 'expect_tool'?" in message
    assert "field 'cases.weather.expect_tool': Field required" in message


def test_broken_yaml_names_the_line(tmp_path: Path) -> None:
    path = _broken(tmp_path, SMOKE_FILE, "burst:\n", "burst: [\n")
    with pytest.raises(SuiteDataError, match=rf"^invalid data file {path}: line \d+, column \d+: "):
        load_suite_data(path, SmokeData)
