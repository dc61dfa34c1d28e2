"""Conformance of the embedded Dynamo deployment with recorded real Dynamo 1.6.1 responses.

A fixed request set (plain, streamed, tools, reasoning, errors, unknown model, bad bodies; ``cases.yaml``) is sent to
the embedded deployment; each response must match the transcript recorded against real Dynamo
(``fixtures/transcripts/dynamo-1.6.1/``, copied from shared/reference): status code, body shape key for key
(keys, null vs absent, value types; for streams every kind of chunk), and the error fields the case names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from checkout import FIXTURES_DIR
from pytest_ml4_sim.deploy.conformance import chunk_kind
from pytest_ml4_sim.deploy.dynamo import DynamoSim

from pytest_ml4.runtime.installed import ToolMissing, dynamo_python
from pytest_ml4.target.model import load_target

try:
    dynamo_python()
except ToolMissing as err:  # the install step is part of scripts/install.sh; CI always has it
    pytest.skip(str(err), allow_module_level=True)

TRANSCRIPTS = FIXTURES_DIR / "transcripts" / "dynamo-1.6.1"
CASES: dict[str, dict[str, Any]] = yaml.safe_load((TRANSCRIPTS / "cases.yaml").read_text())
CONTEXT = 4096
TARGET = load_target("gb300-agg", overrides={"engine": {"max_model_len": CONTEXT}})
MODEL = TARGET.serving.served_model_name
_STATUS = re.compile(r"^HTTP(?:/1\.1)? (\d{3})")
_HEADER = re.compile(r"^(?!data:)[a-z][a-z0-9-]*: ")


# ----------------------------------------------------------------------------------------- transcript reading
def recorded(name: str, section: int | None) -> tuple[int, str]:
    """(status, body text) of one recorded response (one ``=== ...`` section of a multi-section file)."""
    text = (TRANSCRIPTS / name).read_text()
    if section is not None:
        text = re.split(r"^=== .*$", text, flags=re.MULTILINE)[section + 1]
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _STATUS.match(line)), None)
    if start is None:
        # The python-worker harness printed streamed 200 answers without a status line.
        assert any(line.startswith("data: ") for line in lines), f"{name}: no status line and no stream"
        status, start = 200, 0
    else:
        status = int(_STATUS.match(lines[start]).group(1))  # type: ignore[union-attr]
    body: list[str] = []
    for line in lines[start + 1:]:
        if line.startswith("[exit="):
            break
        if not body and (not line.strip() or _HEADER.match(line)):
            continue
        body.append(line)
    return status, "\n".join(body).strip()


def shape(value: Any) -> Any:
    """Keys and value types, recursively (null kept distinct from absent)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return sorted({json.dumps(shape(v), sort_keys=True) for v in value})
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else "string"


#: Delta fields that carry generated text; a chunk may carry several when one engine step emits several tokens.
_TEXT_FIELDS = ("reasoning_content", "content")


def _single_field_chunks(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    """A reasoning+content delta split into one chunk per field: the simulated engine emits up to k+1 tokens per
    step (speculative decoding), so the frontend's parser can end reasoning and start content in one chunk, which
    the recorded one-token-per-chunk worker never did. Everything else stays as it is."""
    choices = chunk.get("choices") or []
    delta = (choices[0].get("delta") or {}) if choices else {}
    fields = [f for f in _TEXT_FIELDS if f in delta]
    if choices and choices[0].get("finish_reason") is not None:
        # The finish chunk carries the last text or none (real Dynamo does both: python-worker transcripts end
        # on text + finish, the mocker's on ``delta: {}``), depending on whether the final step held text.
        rest = {k: v for k, v in delta.items() if k not in _TEXT_FIELDS}
        return [{**chunk, "choices": [{**choices[0], "delta": rest}]}]
    if len(fields) < 2 or set(delta) != set(fields) or choices[0].get("finish_reason") is not None:
        return [chunk]
    return [{**chunk, "choices": [{**choices[0], "delta": {f: delta[f]}}]} for f in fields]


def stream_shapes(text: str) -> dict[str, list[str]]:
    """Chunk kind -> the distinct chunk shapes of an SSE body (plus whether it ended with ``[DONE]``)."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            out.setdefault("done", set()).add("[DONE]")
            continue
        for chunk in _single_field_chunks(json.loads(data)):
            out.setdefault(chunk_kind(chunk), set()).add(json.dumps(shape(chunk), sort_keys=True))
    return {k: sorted(v) for k, v in out.items()}


# ----------------------------------------------------------------------------------------- the deployment
@pytest.fixture(scope="module")
def dynamo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DynamoSim]:
    dsim = DynamoSim(TARGET, log_file=tmp_path_factory.mktemp("conformance") / "engine.log").start()
    yield dsim
    dsim.stop()


def _fill(obj: Any) -> Any:
    if isinstance(obj, str):
        return obj.replace("{model}", MODEL).replace("{overlong}", "word " * (CONTEXT + 200))
    if isinstance(obj, dict):
        return {k: _fill(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v) for v in obj]
    return obj


def send(dsim: DynamoSim, case: dict[str, Any]) -> httpx.Response:
    method = case.get("method", "POST")
    url = dsim.url + case.get("path", "/v1/chat/completions")
    headers = {} if case.get("content_type", "application/json") is None else {"Content-Type": "application/json"}
    content = _fill(case["raw"]) if "raw" in case else (json.dumps(_fill(case["body"])) if "body" in case else None)
    return httpx.request(method, url, content=content, headers=headers, timeout=60)


def _without_usage_details(text: str) -> str:
    """Our body without ``usage.prompt_tokens_details``: the recorded plain Python worker never sent it, Dynamo's
    vLLM worker (which ours stands in for) does (cases.yaml, ``python_worker``)."""
    def strip(obj: dict[str, Any]) -> str:
        if isinstance(obj.get("usage"), dict):
            obj["usage"].pop("prompt_tokens_details", None)
        return json.dumps(obj)

    if not text.startswith("data:"):
        return strip(json.loads(text)) if text.startswith("{") else text
    return "\n".join("data: " + strip(json.loads(line[6:])) if line.startswith("data: {") else line
                     for line in text.splitlines())


@pytest.mark.parametrize("name", sorted(CASES))
def test_response_matches_real_dynamo(dynamo: DynamoSim, name: str) -> None:
    case = CASES[name]
    want_status, want_body = recorded(case["transcript"], case.get("section"))
    resp = send(dynamo, case)
    text = _without_usage_details(resp.text) if case.get("python_worker") else resp.text
    assert resp.status_code == want_status, f"{name}: HTTP {resp.status_code}, real Dynamo {want_status}: {resp.text[:300]}"
    if want_body.startswith("data:"):
        got, want = stream_shapes(text), stream_shapes(want_body)
        assert got == want, f"{name}: stream chunk shapes differ from real Dynamo\n ours: {got}\n real: {want}"
        return
    if not want_body:
        assert resp.text == "", f"{name}: real Dynamo answers with an empty body, ours: {resp.text[:200]!r}"
        return
    got_json, want_json = json.loads(text), json.loads(want_body)
    assert shape(got_json) == shape(want_json), f"{name}: body shape differs\n ours: {got_json}\n real: {want_json}"
    for key in case.get("exact", []):
        assert got_json[key] == want_json[key], f"{name}: {key} {got_json[key]!r} != real {want_json[key]!r}"
    for key, prefix in (case.get("prefix") or {}).items():
        assert str(want_json[key]).startswith(prefix), f"{name}: cases.yaml prefix no longer matches the transcript"
        assert str(got_json[key]).startswith(prefix), f"{name}: {key} {got_json[key]!r} does not start with {prefix!r}"


def test_shape_comparison_can_fail() -> None:
    """The comparison notices a key that is null in one body and absent in the other, and a changed type."""
    assert shape({"a": None}) != shape({})
    assert shape({"a": 1}) != shape({"a": "1"})
    assert stream_shapes('data: {"choices": [], "usage": {"x": 1}}') != stream_shapes('data: {"choices": []}')
    mixed = 'data: {"choices": [{"delta": {"reasoning_content": "a", "content": "b"}, "finish_reason": null}]}'
    assert set(stream_shapes(mixed)) == {"reasoning", "content"}


def test_every_case_names_a_copied_transcript() -> None:
    assert {c["transcript"] for c in CASES.values()} <= {p.name for p in Path(TRANSCRIPTS).glob("*.txt")}
