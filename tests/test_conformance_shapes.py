"""The shape comparison of harness/pytest_ml4_sim/deploy/conformance.py (no deployment): it sees a key null on one side and
absent on the other, a changed type, a chunk kind one stream lacks; the allowed-differences data covers only
the paths it names, flags entries that no longer occur, and refuses an entry without a reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkout import FIXTURES_DIR
from pytest_ml4_sim.deploy.conformance import (
    ConformanceData,
    ConformanceDataError,
    Observation,
    differences,
    load_conformance,
    log_signatures,
    metric_families,
)

REAL = FIXTURES_DIR / "transcripts" / "dynamo-vllm-1.6.1" / "kv" / "nomigration-sigkill-stream.txt"


def _sse(*chunks: str) -> str:
    return "\n\n".join(f"data: {c}" for c in chunks)


def test_null_and_absent_and_types_differ() -> None:
    a = Observation.of(200, '{"usage": {"prompt_tokens_details": null}, "n": 1}')
    b = Observation.of(200, '{"usage": {}, "n": "1"}')
    assert differences(a.shape, b.shape) == {"usage.prompt_tokens_details": ("null", "absent"),
                                             "n": ("number", "string")}
    assert differences(a.shape, a.shape) == {}


def test_streams_compare_per_chunk_kind() -> None:
    finish = '{"choices": [{"delta": {}, "finish_reason": "stop"}]}'
    usage = '{"choices": [], "usage": {"prompt_tokens": 3}}'
    with_usage = Observation.of(200, _sse(finish, usage, "[DONE]"))
    without = Observation.of(200, _sse(finish, "[DONE]"))
    assert differences(with_usage.shape, without.shape) == {"stream.usage": ("{...}", "absent")}


def test_a_real_stream_has_the_error_kind_and_no_usage() -> None:
    lines = [line[line.index("data: "):] for line in REAL.read_text().splitlines() if " data: " in line]
    shape = Observation.of(200, "\n\n".join(lines)).shape["stream"]
    assert set(shape) == {"role", "content", "error", "done"}
    assert shape["error"] == {"error": {"message": "string", "type": "string", "code": "number"}}


def test_allowed_differences_cover_their_paths_only_and_stale_ones_show() -> None:
    data = ConformanceData({"a": {}}, [])
    data.allowed = load_conformance(_write_yaml(
        "requests: {a: {}}\nallowed_differences:\n"
        "  - {case: a, path: nvext.timing, reason: simulated timing}\n"
        "  - {case: '*', path: usage.gone, reason: never seen}\n"
        "  - {case: '*', path: logs.stats, timing: true, reason: needs 10 s of activity}\n")).allowed
    diffs = {"nvext.timing.ttft_ms": ("number", "absent"), "nvext.worker_id": ("{...}", "absent")}
    assert data.unexplained("a", diffs) == {"nvext.worker_id": ("{...}", "absent")}
    # A timing-dependent difference that did not occur in this run is not stale; one that never occurs is.
    assert [a.path for a in data.stale({"a": list(diffs)})] == ["usage.gone"]


def test_an_allowed_difference_without_reason_is_refused() -> None:
    path = _write_yaml("requests: {a: {}}\nallowed_differences:\n  - {case: a, path: x}\n")
    with pytest.raises(ConformanceDataError, match=r"allowed_differences\[0\] lacks reason"):
        load_conformance(path)
    path = _write_yaml("requests: {a: {}}\nallowed_differences:\n  - {case: b, path: x, reason: y}\n")
    with pytest.raises(ConformanceDataError, match=r"allowed_differences\[0\]\.case 'b' names no request"):
        load_conformance(path)


def test_metric_families_and_log_signatures() -> None:
    text = "# HELP vllm:x X\n# TYPE vllm:x counter\nvllm:x_total 1\n# TYPE dynamo_y gauge\ndynamo_y 1\n"
    assert metric_families(text) == {"vllm:x"}
    log = "INFO 12-01 19:00:00 [kv_cache_utils.py:2464] CPU KV cache size: 1,048,576 tokens"
    assert log_signatures(log) == {"kv_cache_size"} and log_signatures("nothing to see") == set()


def _write_yaml(text: str) -> Path:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    return Path(f.name)
