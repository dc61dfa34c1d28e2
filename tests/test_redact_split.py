"""A key split across SSE chunks is redacted after the stream is assembled, and ``ml4-report scan`` finds it
(chunk by chunk no piece is long enough to look like a key, joined they are one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_ml4.report.cli import main
from pytest_ml4.report.redact import Redactor

#: Shaped like no key the redactor knows: only the registered value can find it.
KEY = "plainsecretvalue0123456789ABCDEF"
PIECES = ["The key is ", KEY[:4], KEY[4:9], KEY[9:15], KEY[15:22], KEY[22:], " - keep it safe."]


def _transcript(pieces: list[str], field: str = "content") -> str:
    """A stream as the probe's transcript writes it (pytest_ml4.client.stream_probe.StreamResult.to_transcript)."""
    def chunk(text: str) -> dict:
        if field == "arguments":
            return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        return {field: text}
    lines = [f"[+{0.01 * i:8.3f}s] data: " + json.dumps({"id": "c1", "choices": [{"index": 0, "delta": chunk(p)}]})
             for i, p in enumerate(pieces)]
    return "POST http://127.0.0.1:8000/v1/chat/completions\n" + "\n".join(lines) + "\n[+   0.100s] data: [DONE]\n"


@pytest.mark.parametrize("field", ["content", "reasoning_content", "arguments"])
def test_a_key_split_across_chunks_is_masked_in_every_chunk(field: str) -> None:
    redactor = Redactor(secrets=[KEY])
    out = redactor.redact_text(_transcript(PIECES, field))
    for piece in PIECES[1:-1]:
        assert json.dumps(piece) not in out, f"the chunk {piece!r} of the key survived:\n{out}"
    assert '"The key is "' in out and '" - keep it safe."' in out, "chunks without the key are kept"
    assert redactor.find_leaks(out) == []


def test_an_unknown_sk_key_split_across_chunks_is_masked() -> None:
    key = "sk-" + "abcdEFGH1234ijklMNOP"
    out = Redactor().redact_text(_transcript(["use ", key[:5], key[5:11], key[11:], "."], "arguments"))
    assert "abcdEFGH" not in out.replace('"', "").replace(" ", "") and "ijklMNOP" not in out, out


def test_control_an_innocent_stream_is_unchanged() -> None:
    text = _transcript(["Paris ", "is the ", "capital of ", "France."])
    assert Redactor(secrets=[KEY]).redact_text(text) == text


def test_scan_finds_a_split_key_and_passes_the_redacted_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ML4_TEST_SPLIT_KEY", KEY)
    leaked = tmp_path / "leaked"
    leaked.mkdir()
    (leaked / "abc-attachment.txt").write_text(_transcript(PIECES))
    assert main(["scan", str(leaked), "--secret-env", "ML4_TEST_SPLIT_KEY"]) == 1
    out = capsys.readouterr().out
    assert "split across SSE chunks (0.content)" in out and KEY not in out, out
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "abc-attachment.txt").write_text(Redactor(secrets=[KEY]).redact_text(_transcript(PIECES)))
    assert main(["scan", str(clean), "--secret-env", "ML4_TEST_SPLIT_KEY"]) == 0
