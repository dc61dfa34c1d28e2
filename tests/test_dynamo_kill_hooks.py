"""The small hooks the gb300-agg kill matrix needs on the Dynamo path: how many workers
DynamoSim starts under ``workers_down``, the context a worker registers under ``served_max_model_len``, and a
perf sweep whose every request failed still writing its plots (so the checks that judge the failure run)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pytest_ml4_sim.deploy.dynamo import started_workers
from pytest_ml4_sim.sim.dynamo_worker import (
    guided_schema,
    served_context,
    tool_choice_of,
)
from pytest_ml4_sim.sim.faults import ActiveFaults

from pytest_ml4.control.dynamo import role_instance_ids
from pytest_ml4.perf.figures import PointFigures
from pytest_ml4.perf.plots import write_plots


def test_workers_down_starts_fewer_workers_but_never_none() -> None:
    assert started_workers(2, []) == 2
    assert started_workers(2, ["workers_down=1"]) == 1
    assert started_workers(2, ["workers_down"]) == 1          # default 1
    assert started_workers(2, ["workers_down=5"]) == 1        # the deployment still starts


def test_a_disagg_role_down_starts_fewer_of_that_role_only() -> None:
    assert started_workers(2, ["prefill_workers_down=1"], "prefill") == 1
    assert started_workers(2, ["prefill_workers_down=1"], "decode") == 2
    assert started_workers(2, ["decode_workers_down=1"], "decode") == 1
    assert started_workers(1, ["decode_workers_down=1"], "decode") == 1      # the model stays served
    assert started_workers(2, ["workers_down=1"], "prefill") == 2            # the agg fault leaves disagg roles alone


def test_health_instances_by_role() -> None:
    """A disagg /health body as 1.6.1 lists it (one entry per endpoint: only ``generate`` counts)."""
    body = {"status": "healthy", "instances": [
        {"component": "prefill", "endpoint": "generate", "instance_id": 1},
        {"component": "prefill", "endpoint": "worker_kv_query_source_1", "instance_id": 1},
        {"component": "backend", "endpoint": "generate", "instance_id": 2},
        {"component": "backend", "endpoint": "generate", "instance_id": 3}]}
    assert role_instance_ids(body) == {"prefill": {1}, "decode": {2, 3}}


def test_served_max_model_len_is_the_registered_context() -> None:
    assert served_context(1_048_576, ActiveFaults()) == 1_048_576
    assert served_context(1_048_576, ActiveFaults(["served_max_model_len=131072"])) == 131_072


#: The shape of 1.6.1's guided_decoding.json for tool_choice required over two tools
#: (fixtures/transcripts/dynamo-1.6.1/ml4-90_required_stream_guided.txt), reduced to what the worker reads.
GUIDED_REQUIRED = {"sampling_options": {"guided_decoding": {"json": {"type": "array", "minItems": 1, "items": {
    "anyOf": [{"properties": {"name": {"enum": ["get_weather"]}}}, {"properties": {"name": {"enum": ["search"]}}}]}}}}}


def test_guided_decoding_ignored_samples_as_under_auto() -> None:
    tools = [{"name": "get_weather"}, {"name": "search"}]
    assert tool_choice_of(GUIDED_REQUIRED, tools, ActiveFaults()) == "required"
    assert guided_schema(GUIDED_REQUIRED, ActiveFaults()) is not None
    ignored = ActiveFaults(["guided_decoding_ignored"])
    assert guided_schema(GUIDED_REQUIRED, ignored) is None
    assert tool_choice_of(GUIDED_REQUIRED, tools, ignored) == "auto"


def test_plots_of_a_sweep_where_every_request_failed(tmp_path: Path) -> None:
    names = [f.name for f in dataclasses.fields(PointFigures)]
    # No export, so no figure at all (what a sweep of only failed requests leaves); before the fix the log
    # y-axis made matplotlib raise "Data cannot be log-scaled" and the sweep fixture errored.
    empty = PointFigures(**dict.fromkeys(names) | {"concurrency": 32, "errors": 40})
    paths = write_plots([empty], tmp_path, "all failed")
    assert [p.name for p in paths] == ["throughput.png", "ttft.png", "itl.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_prefill_crashloop_refuses_the_boots_from_its_replacement_on_with_vllms_recorded_line(tmp_path: Path) -> None:
    """Only prefill workers booted by their pod's N-th replacement or later refuse to start, and what they log is
    vLLM's free-memory refusal as the signature catalogue knows it from the recorded real line."""
    from pytest_ml4_sim.deploy.dynamo_worker_cli import log_boot_refusal, refuses_boot

    from pytest_ml4.logs.records import LogRecord
    from pytest_ml4.logs.signatures import load_catalogue
    from pytest_ml4.target.model import load_target

    faults = ActiveFaults(["prefill_crashloop=3"])
    assert [refuses_boot("prefill", faults, g) for g in range(5)] == [False, False, False, True, True]
    assert not refuses_boot("decode", faults, 3) and not refuses_boot("prefill", ActiveFaults([]), 3)
    log = tmp_path / "prefill.log"
    log_boot_refusal(str(log), load_target("gb300-disagg"), "prefill")
    records = [LogRecord(text=line) for line in log.read_text().splitlines()]
    (match,) = load_catalogue().matches(records, ["startup_refused"])
    assert match.groups["util"] == "0.9" and match.groups["total_gib"] == "268.00", match.groups
