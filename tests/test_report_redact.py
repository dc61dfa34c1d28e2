"""Redaction: known keys, bearer tokens, sk- keys, key=value pairs, URL credentials, in str/bytes/JSON."""

from __future__ import annotations

import json

import pytest

from pytest_ml4.report.redact import MASK, Redactor

KEY = "k3y-V4lue-9f8e7d6c5b4a"


@pytest.fixture
def red() -> Redactor:
    return Redactor(env_names=["TEST_ML4_KEY"], env={"TEST_ML4_KEY": KEY})


def test_known_key_from_env_is_masked_everywhere(red: Redactor) -> None:
    text = f"request failed for key {KEY}; url https://h/v1?x={KEY}"
    out = red.redact_text(text)
    assert KEY not in out
    assert out.count(MASK) == 2
    assert red.find_leaks(out) == []


def test_env_is_read_at_redaction_time() -> None:
    env: dict[str, str] = {}
    red = Redactor(env_names=["LATE_KEY"], env=env)
    env["LATE_KEY"] = "generated-later-123456"
    assert red.redact_text("x generated-later-123456 y") == f"x {MASK} y"


def test_url_encoded_key_is_masked() -> None:
    red = Redactor(["a/b+c=d e&f1234"])
    assert "a%2Fb%2Bc%3Dd%20e%26f1234" not in red.redact_text("q=a%2Fb%2Bc%3Dd%20e%26f1234")


@pytest.mark.parametrize("text, kept", [
    ("Authorization: Bearer abc.DEF-123_xyz~", "Authorization: Bearer ***"),
    ("authorization: bearer abcdefgh12", "authorization: bearer ***"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic ***"),
    ("key sk-proj-AbCdEf0123456789 end", "key sk-*** end"),
    ('{"api_key": "s3cr3tvalue"}', '{"api_key": "***"}'),
    ("GET /v1/models?api_key=s3cr3tvalue&x=1", "GET /v1/models?api_key=***&x=1"),
    ("x-api-key: s3cr3tvalue", "x-api-key: ***"),
    ("{'api_key': ['s3cr3tvalue']}", "{'api_key': ['***']}"),
    ("https://user:p4ss@host:8000/v1", "https://***@host:8000/v1"),
])
def test_secret_shapes_are_masked_without_being_known(text: str, kept: str) -> None:
    red = Redactor()
    assert red.find_leaks(text), "the shape must count as a leak before redaction"
    assert red.redact_text(text) == kept
    assert red.find_leaks(kept) == []


@pytest.mark.parametrize("text", [
    "max_tokens=4096 prompt_tokens: 12",            # token counts are not credentials
    "the bearer of bad news",                       # prose
    "ttft p50 0.56 s, 90.1 tok/s/user",
    "sk-short",                                     # too short to be a key
])
def test_ordinary_text_is_left_alone(text: str) -> None:
    red = Redactor(["abc"])   # too short to register as a secret: it would mask ordinary words
    assert red.redact_text(text) == text
    assert red.find_leaks(text) == []


def test_bytes_keep_type_and_binary_survives(red: Redactor) -> None:
    blob = b"\x89PNG\r\n\x1a\n\xff\xfe" + KEY.encode() + b"\x00"
    out = red(blob)
    assert isinstance(out, bytes)
    assert KEY.encode() not in out
    assert out.startswith(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert isinstance(red(bytearray(b"Bearer abcdefgh1234")), bytearray)


def test_json_sensitive_keys_masked_whole_and_strings_scrubbed(red: Redactor) -> None:
    doc = {"headers": {"Authorization": "whatever-scheme xyz", "X-Api-Key": "zzzzzzzz"},
           "messages": [{"role": "user", "content": f"my key is {KEY}"}], "n": 3, "ok": True,
           "api_key": "", "nested": ("Bearer tok-1234567890",)}
    out = red(doc)
    assert out["headers"] == {"Authorization": MASK, "X-Api-Key": MASK}
    assert KEY not in json.dumps(out)
    assert out["n"] == 3 and out["ok"] is True and out["api_key"] == ""
    assert out["nested"] == ("Bearer ***",)
    assert doc["headers"]["Authorization"] == "whatever-scheme xyz", "input must not be mutated"


def test_repr_never_shows_values(red: Redactor) -> None:
    assert KEY not in repr(red)
    assert "1 secrets" in repr(Redactor(["abcdefghij"]))


def test_leak_context_does_not_contain_the_secret(red: Redactor) -> None:
    leaks = red.find_leaks(f"prefix {KEY} suffix")
    assert leaks and all(KEY not in leak.context for leak in leaks)
    assert leaks[0].kind == "known secret"


def test_truncated_fragments_of_a_long_key_are_masked() -> None:
    # pytest shows long strings in assertion diffs as "head...tail"; the tail alone is still a leak.
    key = "sk-ml4-plugin-test-3f9a2c7e5b1d4680"
    red = Redactor([key])
    text = "assert 'sk-ml4-plugin-test-3f9...a2c7e5b1d4680' == 'x' and 'plugin-t' is short"
    assert {lk.kind for lk in red.find_leaks(text)} >= {"part of a known secret"}
    out = red.redact_text(text)
    assert "a2c7e5b1d4680" not in out and "plugin-test-3f9" not in out
    assert "'plugin-t' is short" in out, "runs shorter than the fragment length stay"
    assert red.find_leaks(out) == []


@pytest.mark.parametrize("text", [
    "args: {'api_key': '[redacted]'}", "args: {'api_key': ['[redacted]']}", "api_key=None", "password: x", '"api_key": null', "api_key: ***",
    "export LLM_API_KEY; curl -H \"x-api-key: ${LLM_API_KEY}\"", "api_key=$LLM_API_KEY",
])
def test_placeholders_are_not_leaks(text: str) -> None:
    assert Redactor().find_leaks(text) == []
