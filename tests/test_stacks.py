"""The serving stacks as adapters (pytest_ml4/stacks/): no code outside them tests a stack's name or spells a vLLM
metric family, every registered stack answers every member of the protocol, and a bad stack fails in one line."""

from __future__ import annotations

import re
import typing
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_ml4.datafile import DataFileError
from pytest_ml4.logs.signatures import CATALOGUE_FILE, CatalogueError, load_catalogue
from pytest_ml4.stacks import (
    REGISTRY,
    StackError,
    stack_for,
    stack_named,
    token_counters,
)
from pytest_ml4.stacks.base import STACKS_FILE, Stack, StackRow, stack_rows
from pytest_ml4.stacks.dynamo_versions import VERSIONS_FILE as DYNAMO_VERSIONS
from pytest_ml4.stacks.dynamo_versions import load_table
from pytest_ml4.stacks.vllm_versions import VERSIONS_FILE as VLLM_VERSIONS
from pytest_ml4.stacks.vllm_versions import load_versions
from pytest_ml4.target.model import Serving, TargetError, load_target

ROOT = Path(__file__).resolve().parent.parent
#: What a stack's name test looks like (issue 36's grep), and a vLLM metric family spelt out.
NAME_TEST = re.compile(r"is_dynamo|\.stack\b|stack ==|is_proxied")
METRIC_LITERAL = re.compile(r"\"vllm:")
#: Where stacks may be named: the adapters themselves and the target model (its field and validation).
ALLOWED = (ROOT / "pytest_ml4" / "stacks", ROOT / "pytest_ml4" / "target" / "model.py")


def offending_lines(pattern: re.Pattern[str]) -> list[str]:
    """``file:line: text`` of every line of pytest_ml4/ and suites/ outside :data:`ALLOWED` matching ``pattern``."""
    out = []
    for folder in (ROOT / "pytest_ml4", ROOT / "suites"):
        for path in sorted(folder.rglob("*.py")):
            if any(path == a or a in path.parents for a in ALLOWED):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    out.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return out


def test_no_stack_name_test_outside_the_stacks() -> None:
    found = offending_lines(NAME_TEST)
    assert not found, "ask pytest_ml4.stacks.stack_for(target) instead of testing the stack's name:\n" + "\n".join(found)


def test_no_vllm_metric_literal_outside_the_stacks() -> None:
    found = offending_lines(METRIC_LITERAL)
    assert not found, ("ask the stack for the family (engine_metric, token_counter: pytest_ml4/data/vllm/metrics.yaml, "
                       "pytest_ml4/data/stacks/stacks.yaml):\n" + "\n".join(found))


def test_the_guard_sees_a_name_test() -> None:
    """The patterns catch what they are for (a guard that matches nothing would pass forever)."""
    assert NAME_TEST.search("if target.is_dynamo:") and NAME_TEST.search('x = target.serving.stack')
    assert NAME_TEST.search('if stack == "vllm":') and METRIC_LITERAL.search('snap.sum("vllm:generation_tokens_total")')
    assert not NAME_TEST.search("stack_for(target).routes_workers")


def test_every_target_stack_value_has_an_adapter_and_a_row() -> None:
    declared = set(typing.get_args(Serving.model_fields["stack"].annotation))
    assert declared == set(REGISTRY) == set(stack_rows())


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_stack_answers_every_member(name: str) -> None:
    stack = stack_named(name)
    assert isinstance(stack, Stack) and stack.name == name
    members = [m for m in Stack.__annotations__] + ["engine_metric", "release", "release_row",
                                                    "sim_worker_engine_version"]
    for member in members:
        assert hasattr(stack, member), f"{name} lacks {member}"
    assert stack.health_path.startswith("/")
    assert stack.engine in REGISTRY and stack_named(stack.engine).proxy is None
    assert stack.token_counter in token_counters()
    assert stack.engine_metric("kv_cache_usage").startswith(stack.metric_prefix)
    with pytest.raises(StackError, match=r"metrics.yaml: field 'families.no_such_family'"):
        stack.engine_metric("no_such_family")


@pytest.mark.parametrize(("target", "health", "routes", "release", "counter"), [
    ("rtxpro6000-tp8", "/health/liveliness", False, None, "vllm:generation_tokens_total"),
    ("gb300-agg", "/health", True, "1.7.0-mistral-large-4-dev.1", "dynamo_frontend_output_tokens_total"),
])
def test_a_target_gets_its_stack(target: str, health: str, routes: bool, release: str | None, counter: str) -> None:
    t = load_target(target)
    stack = stack_for(t)
    assert (stack.health_path, stack.routes_workers, stack.release(t), stack.token_counter) == (
        health, routes, release, counter)
    assert (stack.release_row(t) is None) == (release is None)
    assert stack_for(t.without_proxy()).health_path == "/health"


def test_only_dynamo_serves_the_dynamo_marker() -> None:
    assert {name: dict(stack_named(name).markers) for name in REGISTRY} == {
        "vllm": {}, "vllm+litellm": {}, "dynamo+vllm": {"dynamo": "Dynamo"}}


def test_an_unknown_stack_in_a_target_names_file_and_field(tmp_path: Path) -> None:
    text = (ROOT / "pytest_ml4" / "data" / "targets" / "rtxpro6000-tp8.yaml").read_text()
    bad = tmp_path / "sglang.yaml"
    bad.write_text(text.replace("stack: vllm+litellm", "stack: sglang+dynamo"))
    with pytest.raises(TargetError) as err:
        load_target(str(bad))
    message = str(err.value)
    assert "\n" not in message and str(bad) in message and "field 'serving.stack'" in message


def test_an_unknown_stack_name_fails_in_one_line() -> None:
    with pytest.raises(StackError) as err:
        stack_named("sglang", "targets/x.yaml: field 'serving.stack'")
    assert str(err.value) == ("targets/x.yaml: field 'serving.stack': unknown stack 'sglang'; known stacks: "
                              f"{', '.join(REGISTRY)}")


def test_a_bad_stack_row_names_file_field_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "stacks.yaml"
    bad.write_text(STACKS_FILE.read_text().replace("  health_path: /health/liveliness", "  health_path: liveliness"))
    line = next(i for i, text in enumerate(bad.read_text().splitlines(), 1) if "health_path: liveliness" in text)
    with pytest.raises(DataFileError) as err:
        stack_rows(bad)
    assert str(err.value).startswith(f"invalid stack table {bad}: line {line}: field 'vllm+litellm.health_path'")
    assert set(StackRow.model_fields) <= set(STACKS_FILE.read_text().split("# Fields:")[1].split("\nvllm:")[0].split())


def _doctored(tmp_path: Path, source: Path, old: str, new: str) -> tuple[Path, int]:
    """A copy of ``source`` with the first ``old`` replaced by ``new``, and the line it is on."""
    text = source.read_text()
    assert old in text
    bad = tmp_path / source.name
    bad.write_text(text.replace(old, new, 1))
    return bad, text[: text.index(old)].count("\n") + 1


@pytest.mark.parametrize(("source", "load", "what", "old", "new", "field", "reason"), [
    (DYNAMO_VERSIONS, load_table, "Dynamo versions table", "    reasoning_split_needs_effort: true",
     "    reasoning_split_needs_effort: maybe", "versions.1.6.1.reasoning_split_needs_effort",
     "Input should be a valid boolean"),
    (VLLM_VERSIONS, load_versions, "vLLM versions table", "    tokenize_endpoint: true", "    tokenize_endpoint: [yes]",
     "versions.0.11.tokenize_endpoint", "Input should be a valid boolean"),
    (CATALOGUE_FILE, load_catalogue, "signature catalogue", "  severity: critical", "  severity: fatal", "0.severity",
     "Input should be 'critical', 'error', 'warning' or 'info'"),
], ids=["dynamo-versions", "vllm-versions", "signatures"])
def test_a_bad_table_names_file_field_and_line(tmp_path: Path, source: Path, load: Callable[[Path], object],
                                               what: str, old: str, new: str, field: str, reason: str) -> None:
    bad, line = _doctored(tmp_path, source, old, new)
    with pytest.raises((DataFileError, CatalogueError)) as err:
        load(bad)
    assert str(err.value) == f"invalid {what} {bad}: line {line}: field '{field}': {reason}"


def test_a_typo_in_a_dynamo_versions_row_is_named_with_its_line(tmp_path: Path) -> None:
    bad, line = _doctored(tmp_path, DYNAMO_VERSIONS, "    status: verified\n", "    status: verified\n    typo: 1\n")
    with pytest.raises(DataFileError, match=rf"line {line + 1}: field 'versions.1.6.1.typo': unknown field"):
        load_table(bad)
