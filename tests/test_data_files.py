"""Every data file the core reads is typed: a doctored copy of each fails with ONE line naming the file, the field
and the line (pytest_ml4/datafile.py), as a target file does."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field, ValidationError
from pytest_ml4_sim.deploy.real_dynamo_disagg import settings as disagg_settings
from pytest_ml4_sim.realvllm.model import _scale_checks, tiny_model
from pytest_ml4_sim.sim.perfmodel import _load_profiles
from pytest_ml4_sim.sim.responder import load_data as load_responder_data

from pytest_ml4.accuracy.bfcl import category_specs
from pytest_ml4.accuracy.gate import load_baseline as load_accuracy_baseline
from pytest_ml4.checks.reasoning import ShareBaseline
from pytest_ml4.checks.suite_data import ReplicasData, load_suite_data
from pytest_ml4.checks.tools import load_tool
from pytest_ml4.client.endpoint import key_refusals
from pytest_ml4.control.budget import deployment_start_overrides
from pytest_ml4.control.scenario import (
    SingleReplicaOutage,
    StaleInstances,
    load_requests,
)
from pytest_ml4.datafile import DataFileError, Strict, load_json, load_yaml
from pytest_ml4.discover.draft import FieldsTable as DiscoverFields
from pytest_ml4.discover.draft import HardwareTable as DiscoverHardware
from pytest_ml4.evidence.kv_load import LoadSettings
from pytest_ml4.evidence.memory import load_calibration
from pytest_ml4.evidence.worker_engine import INFO_KEY, Emulation, WorkerEngine
from pytest_ml4.locations import data_file
from pytest_ml4.perf.baseline import Baseline
from pytest_ml4.perf.probes import probe_table
from pytest_ml4.perf.runner import load_trace
from pytest_ml4.plugin.args import path_options
from pytest_ml4.plugin.breaker import BreakerMarkers
from pytest_ml4.preflight.applied import rule_needs
from pytest_ml4.report.categories import load_categories
from pytest_ml4.report.labels import load_suites
from pytest_ml4.stacks.litellm import RetryTable
from pytest_ml4.target.access import FieldsTable, NeedsTable
from pytest_ml4.target.baselines import BaselineRefused
from pytest_ml4.target.doc import readers
from pytest_ml4.target.hardware import families
from pytest_ml4.target.model import load_target


def doctored(tmp_path: Path, source: Path, old: str, new: str, count: int = 1) -> Path:
    """A copy of ``source`` with the first ``count`` occurrences of ``old`` replaced by ``new``."""
    text = source.read_text(encoding="utf-8")
    assert old in text, f"{old!r} is not in {source}: the test's anchor moved"
    path = tmp_path / source.name
    path.write_text(text.replace(old, new, count), encoding="utf-8")
    return path


def line_of(path: Path, needle: str, nth: int = 1) -> int:
    """The 1-based line of the ``nth`` line holding ``needle``."""
    hits = [i for i, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if needle in text]
    return hits[nth - 1]


def refusal(load: Callable[[Path], Any], path: Path, error: type[Exception] = DataFileError) -> str:
    with pytest.raises(error) as err:
        load(path)
    message = str(err.value)
    assert "\n" not in message, message
    assert str(path) in message, message
    return message


# --- the shared loader -------------------------------------------------------------------------------------------

class _Row(Strict):
    name: str
    weight_gib: float


class _Table(Strict):
    rows: dict[str, _Row]
    order: list[str] = Field(default_factory=list)


def test_a_wrong_type_names_the_file_the_field_and_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("rows:\n  a:\n    name: x\n    weight_gib: heavy\norder: [a]\n")
    message = refusal(lambda p: load_yaml(p, _Table), path)
    assert re.search(r": line 4: field 'rows\.a\.weight_gib': Input should be a valid number", message), message


def test_an_unknown_key_is_named_at_its_line_with_the_near_field(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("rows:\n  a:\n    name: x\n    weight_gb: 1\n    weight_gib: 1\n")
    message = refusal(lambda p: load_yaml(p, _Table), path)
    assert "line 4: field 'rows.a.weight_gb': unknown field; did you mean 'weight_gib'?" in message, message


def test_a_missing_field_names_the_mapping_that_lacks_it(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("order: []\nrows:\n  a:\n    name: x\n")
    assert "line 4: field 'rows.a.weight_gib': Field required" in refusal(lambda p: load_yaml(p, _Table), path)


def test_json_and_plain_annotations_are_typed_alike(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{\n  "a": {"name": "x", "weight_gib": 1},\n  "b": {"name": "y", "weight_gib": []}\n}\n')
    message = refusal(lambda p: load_json(p, dict[str, _Row]), path)
    assert "line 3: field 'b.weight_gib': Input should be a valid number" in message, message
    assert load_json(data_file("report", "categories.json"), list[dict[str, Any]])


def test_yaml_errors_are_one_line_with_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("rows:\n  a: {name: x}\n  a: {name: y}\n")
    assert "line 3, column 3: duplicate key 'a' (first at line 2)" in refusal(lambda p: load_yaml(p, _Table), path)
    path.write_bytes(b"rows:\n  a: \xff\n")
    assert "line 2: not UTF-8 text (byte 0xff)" in refusal(lambda p: load_yaml(p, _Table), path)
    assert "No such file" in refusal(lambda p: load_yaml(p, _Table), tmp_path / "absent.yaml")


# --- stored baselines --------------------------------------------------------------------------------------------

def test_a_perf_baseline_point_of_the_wrong_type_is_refused_at_its_line(tmp_path: Path) -> None:
    path = doctored(tmp_path, data_file("baselines", "gb300-agg.json"), '"concurrency": 4,', '"concurrency": "four",')
    message = refusal(Baseline.load, path, BaselineRefused)
    line = line_of(path, '"concurrency": "four"')
    assert f"invalid perf baseline {path}: line {line}: field 'figures.1.concurrency': Input should be a valid " \
           "integer" in message, message


def test_a_misspelt_perf_setting_is_refused_not_ignored(tmp_path: Path) -> None:
    path = doctored(tmp_path, data_file("baselines", "gb300-agg.json"), '"short_run_metrics"', '"short_run_metric"')
    message = refusal(Baseline.load, path, BaselineRefused)
    assert f"line {line_of(path, 'short_run_metric')}: field 'short_run_metric': unknown field; did you mean " \
           "'short_run_metrics'?" in message, message


def test_an_accuracy_baseline_without_counts_is_refused_at_its_line(tmp_path: Path) -> None:
    path = doctored(tmp_path, data_file("baselines", "accuracy-gb300-agg.json"), '"passed": 55,', '"passes": 55,')
    message = refusal(load_accuracy_baseline, path, BaselineRefused)
    line = line_of(path, '"simple_python": {')   # the mapping that lacks it
    assert f"line {line}: field 'figures.simple_python.passed': Field required" in message, message


def test_a_share_baseline_without_its_tolerance_is_refused(tmp_path: Path) -> None:
    path = doctored(tmp_path, data_file("baselines", "reasoning-share-gb300-agg.json"), '"share": 0.1', '"shares": 0.1')
    message = refusal(ShareBaseline.load, path, BaselineRefused)
    line = line_of(path, '"tolerances"')
    assert f"line {line}: field 'tolerances': Value error, needs 'share'" in message, message


def test_every_stored_baseline_reads() -> None:
    for path in sorted(data_file("baselines").glob("*.json")):
        kind = path.name.split("-")[0]
        load = {"accuracy": load_accuracy_baseline, "reasoning": ShareBaseline.load}.get(kind, Baseline.load)
        assert load(path).provenance.kind in ("simulator", "deployment", "seed"), path


def test_a_path_option_table_of_the_wrong_shape_is_a_usage_error_naming_file_field_and_line(tmp_path: Path) -> None:
    path = doctored(tmp_path, data_file("plugin", "path_options.yaml"), "  - --target-dir", "  - target-dir")
    message = refusal(path_options, path, pytest.UsageError)
    assert f"line {line_of(path, '- target-dir')}: field 'options.1': String should match pattern" in message, message


# --- the worker-engine record ------------------------------------------------------------------------------------

def _record(**over: Any) -> WorkerEngine:
    return WorkerEngine(dynamo_vllm="1.6.1", vllm="0.31.0", declared={"prefill": 2, "decode": 2},
                        started={"prefill": 1, "decode": 1}, **over)


def test_the_worker_engine_record_travels_as_plain_data_and_reads_back() -> None:
    record = _record(reduced="prefill 1 of 2, decode 1 of 2 (memory)",
                     emulation=Emulation(version="1.7.0", tool_form="legacy", think_before_tool_call=False))
    wire = record.wire()
    assert wire["dynamo.vllm"] == "1.6.1" and wire["emulation"]["tool_form"] == "legacy"
    assert WorkerEngine.of({"frontend": {}, INFO_KEY: json.loads(json.dumps(wire))}) == record
    assert WorkerEngine.of({"frontend": {}}) is None and WorkerEngine.of(None) is None
    assert record.reduced_to() == {"prefill": 1, "decode": 1} and _record().reduced_to() is None
    assert record.release() == ("1.6.1", " on vLLM 0.31.0")
    versions = record.report_versions()
    assert versions["dynamo_emulation"] == ("Dynamo 1.7.0 emulated on 1.6.1: tool calls in the legacy form, "
                                            "thinking before a tool call off")
    assert versions["deployment_reduced"].startswith("prefill 1 of 2") and "dynamo_disagg" not in versions


def test_a_worker_engine_record_of_the_wrong_shape_is_refused_by_field() -> None:
    wire = {**_record().wire(), "emulation": {"version": "1.7.0", "tool_form": "v12", "think_before_tool_call": True}}
    with pytest.raises(ValidationError, match=r"emulation\.tool_form"):
        WorkerEngine.of({INFO_KEY: wire})


# --- the tables: a doctored copy of each fails with file, field and line ----------------------------------------

#: (file under pytest_ml4/data, text replaced, replacement, loader of a path, field named, text on the line named)
DOCTORED: list[tuple[tuple[str, ...], str, str, Callable[[Path], Any], str, str]] = [
    (("hardware", "families.yaml"), "memory_model: estimate", "memory_model: guessed",
     lambda p: families.__wrapped__(p), "gb300.memory_model", "memory_model: guessed"),
    (("access", "needs.yaml"), "    at_start: true", "    at_start: often",
     lambda p: load_yaml(p, NeedsTable), "accesses.endpoint.at_start", "at_start: often"),
    (("access", "fields.yaml"), 'why: "the latency knee', 'whyy: "the latency knee',
     lambda p: load_yaml(p, FieldsTable), "fields.0.whyy", "whyy:"),
    (("accuracy", "categories.yaml"), "irrelevance: {scoring: no_call}", "irrelevance: {scoring: none}",
     lambda p: category_specs.__wrapped__(p), "categories.irrelevance.scoring", "irrelevance: {scoring: none}"),
    (("kv", "load.yaml"), "max_tokens: 192", "max_tokens: lots",
     lambda p: load_yaml(p, LoadSettings), "max_tokens", "max_tokens: lots"),
    (("memory", "calibration.yaml"), "kv_pool_tokens: 272636", "kv_pool_tokens: 272.6k",
     lambda p: load_calibration.__wrapped__(p), "anchors.0.kv_pool_tokens", "kv_pool_tokens: 272.6k"),
    (("preflight", "rule_needs.yaml"), "[target, memory-model]", "[target, memory-modle]",
     lambda p: rule_needs.__wrapped__(p), "kv-pool-below-max-model-len.1", "memory-modle"),
    (("report", "suites.yaml"), "severity: critical", "severity: dire",
     lambda p: load_suites.__wrapped__(p), "tools.severity", "severity: dire"),
    (("report", "categories.json"), '"broken"', '"borken"',
     lambda p: load_categories.__wrapped__(p), "0.matchedStatuses.1", '"borken"'),
    (("discover", "fields.yaml"), "  engine.version: {value:", "  engine.version: {valeu:",
     lambda p: load_yaml(p, DiscoverFields), "estimates.engine.version.valeu", "engine.version: {valeu:"),
    (("discover", "hardware.yaml"), "memory_per_gpu_gib: 131.0", "memory_per_gpu_gib: 131 GiB",
     lambda p: load_yaml(p, DiscoverHardware), "families.h200.memory_per_gpu_gib", "131 GiB"),
    (("plugin", "breaker.yaml"), "outage: [restart]", "outages: [restart]",
     lambda p: load_yaml(p, BreakerMarkers), "outages", "outages:"),
    (("restart", "deployment-start.yaml"), "vllm: 420", "vllm: 7 minutes",
     lambda p: deployment_start_overrides("sim", p), "vllm", "vllm: 7 minutes"),
    (("perfmodel", "profiles.yaml"), "  prefill_tok_s: 1280", "  prefill_toks: 1280",
     lambda p: _load_profiles.__wrapped__(p), "rtxpro6000-tp8.prefill_toks", "prefill_toks: 1280"),
    (("prompts", "probes.yaml"), "order: [tool_choice, reasoning,", "order: [tool_choice, reasonning,",
     lambda p: probe_table.__wrapped__(p), "order.1", "reasonning"),
    (("restart", "stale-instances.yaml"), "stale_window_s: [5, 10]", "stale_window_s: [5]",
     lambda p: StaleInstances.for_dynamo("1.6.1", p), "dynamo.1.6.1.stale_window_s.1", "stale_window_s: [5]"),
    (("dynamo", "single-replica-outage.yaml"), "      - status: 500", "      - status: five hundred",
     lambda p: SingleReplicaOutage.for_target(load_target("vr200-disagg"), p), "dynamo.1.6.1.answers.3.status",
     "status: five hundred"),
    (("target_readers.yaml",), "hardware.interconnect: []", "hardware.interconnect: {}",
     lambda p: readers.__wrapped__(p), "hardware.interconnect", "hardware.interconnect: {}"),
    (("vllm", "scale_checks.yaml"), '  - test: "suites/test_perf.py::test_latency_knee"',
     '  - tset: "suites/test_perf.py::test_latency_knee"',
     lambda p: _scale_checks.__wrapped__(p), "checks.2.tset", "tset:"),
    (("dynamo_vllm", "disagg.yaml"), "decode: {mode: decode, kv_role: kv_consumer}",
     "decode: {mode: decode, kv_role: kv_consumr}",
     lambda p: disagg_settings.__wrapped__(p), "roles.decode.kv_role", "kv_consumr"),
    (("vllm", "tiny_model.yaml"), "kv_cache_space_gib: 1", "kv_cache_space_gib: one",
     lambda p: tiny_model.__wrapped__(p), "serve.kv_cache_space_gib", "kv_cache_space_gib: one"),
    (("sim", "responder.json"), '"high": 4', '"high": "four"',
     lambda p: load_responder_data.__wrapped__(p), "reasoning_sentences_by_effort.high", '"high": "four"'),
    (("prompts", "replicas.yaml"), "tool_choices: [none, auto, required, named]",
     "tool_choices: [none, auto, required, named, any]",
     lambda p: load_suite_data(p, ReplicasData), "tool_choices.4", "tool_choices:"),
    (("restart", "litellm-retry.yaml"), "jitter_s: 0.75", "jitter_s: 0.75 s",
     lambda p: load_yaml(p, RetryTable), "litellm.1.108.7.jitter_s", "jitter_s: 0.75 s"),
    (("bad_input", "refused_keys.yaml"), "status: [401, 403]", "status: [401, forbidden]",
     lambda p: key_refusals.__wrapped__(p), "refusals.3.status.1", "status: [401, forbidden]"),
    (("restart", "requests.yaml"), "kill_after_events: 20", "kill_after_event: 20",
     lambda p: load_requests.__wrapped__(p), "crash.kill_after_event", "kill_after_event: 20"),
    (("traces", "agentic-mooncake.jsonl"), '"output_length": 1265', '"output_length": "long"',
     load_trace, "output_length", '"output_length": "long"'),
    (("tools", "get_weather.json"), '"type": "object"', '"type": "objekt"',
     lambda p: load_tool(p.stem, p.parent), "function.parameters", '"parameters": {'),
    (("tools", "set_alarm.json"), '"type": "function"', '"type": "tool"',
     lambda p: load_tool(p.stem, p.parent), "type", '"type": "tool"'),
]


@pytest.mark.parametrize(("parts", "old", "new", "load", "field", "on_line"), DOCTORED,
                         ids=["/".join(case[0]) for case in DOCTORED])
def test_a_doctored_table_names_file_field_and_line(tmp_path: Path, parts: tuple[str, ...], old: str, new: str,
                                                    load: Callable[[Path], Any], field: str, on_line: str) -> None:
    source = data_file(*parts)
    load(source)   # the shipped file reads
    path = doctored(tmp_path, source, old, new)
    message = refusal(load, path)
    assert message.startswith(f"invalid data file {path}: "), message
    assert f"line {line_of(path, on_line)}: field '{field}': " in message, message
