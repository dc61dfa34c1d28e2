"""The fixed-OSL suite's judgement of aiperf's export (``assert_aiperf_export_exactly_n``) on a recorded aiperf 0.13
run (``fixtures/aiperf/basic_c2_reasoning_servermetrics``: 8 requests at min_tokens 256, every one 256 tokens)
and on copies of it doctored the way a run goes wrong: failed requests, records that do not match the summary, a
request short of the length."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_ml4.checks.codes import Violation
from pytest_ml4.checks.osl import assert_aiperf_export_exactly_n
from pytest_ml4.perf.export import RECORDS_FILE, SUMMARY_FILE, ProfileExport
from pytest_ml4.perf.runner import AiperfSpec, RunResult

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "aiperf" / "basic_c2_reasoning_servermetrics"
N = 256
INJECTED = '{"error": {"message": "injected failure", "type": "server_error"}}'


def run_of(folder: Path) -> RunResult:
    spec = AiperfSpec(model="m", url="http://127.0.0.1:1/v1", concurrency=4, isl=256, osl=N, duration_s=None,
                      request_count=8, min_tokens=N)
    return RunResult(spec=spec, out_dir=folder, argv=[], returncode=0, wall_s=1.0,
                     export=ProfileExport.load(folder), problems=[])


@pytest.fixture
def recorded_copy(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(RECORDED, out)
    return out


def lines(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / RECORDS_FILE).read_text().splitlines() if x.strip()]


def write_lines(folder: Path, records: list[dict]) -> None:
    (folder / RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))


def edit_summary(folder: Path, error_summary: list[dict], **scalars: float) -> None:
    """Replace the summary's ``error_summary`` and the named request-count scalars (aiperf writes them avg-only)."""
    path = folder / SUMMARY_FILE
    data = json.loads(path.read_text())
    data.update({name: {"unit": "requests", "avg": value} for name, value in scalars.items()})
    data["error_summary"] = error_summary
    path.write_text(json.dumps(data))


def code_of(folder: Path) -> Violation:
    with pytest.raises(Violation) as err:
        assert_aiperf_export_exactly_n(run_of(folder), N)
    return err.value


def test_the_recorded_fixed_length_run_passes(recorded_copy: Path) -> None:
    assert_aiperf_export_exactly_n(run_of(recorded_copy), N)


def test_failed_requests_are_named_as_failures_with_the_body(recorded_copy: Path) -> None:
    """4 of 8 failed: the summary counts 4 successful, the jsonl holds 8 records. This read as "8 records for 4
    requests" (records missing) before; it is the requests that failed, and the message quotes what came back."""
    records = lines(recorded_copy)
    for r in records[4:]:
        r["error"] = {"code": 500, "type": "Internal Server Error", "message": INJECTED}
        r["metrics"] = {}
    write_lines(recorded_copy, records)
    injected = {"error_details": {"code": 500, "type": "Internal Server Error", "message": INJECTED}, "count": 4}
    edit_summary(recorded_copy, [injected], request_count=4, error_request_count=4, completed_request_count=8)
    v = code_of(recorded_copy)
    assert v.code == "osl.aiperf_request_errors"
    assert "4 failed request(s) in the summary, 4 failed record(s) of 8, 4 successful" in v.message
    assert "injected failure" in v.message


def test_a_failed_record_alone_is_a_failure(recorded_copy: Path) -> None:
    """A failed record the summary does not count (no error_summary) still fails, quoting the record's error."""
    records = lines(recorded_copy)
    records[0]["error"] = {"code": 502, "type": "Bad Gateway", "message": "upstream reset"}
    write_lines(recorded_copy, records)
    v = code_of(recorded_copy)
    assert v.code == "osl.aiperf_request_errors"
    assert "upstream reset" in v.message


def test_records_other_than_one_per_request_fail(recorded_copy: Path) -> None:
    records = lines(recorded_copy)
    write_lines(recorded_copy, records + records[:2])
    v = code_of(recorded_copy)
    assert v.code == "osl.aiperf_records_missing"
    assert v.message.startswith("10 per-request records (profiling phase) for the 8 successful requests")


def test_a_record_short_of_the_length_fails(recorded_copy: Path) -> None:
    records = lines(recorded_copy)
    records[3]["metrics"]["usage_completion_tokens"]["value"] = N - 1
    write_lines(recorded_copy, records)
    assert code_of(recorded_copy).code == "osl.aiperf_records_not_n"
