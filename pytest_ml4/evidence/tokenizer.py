"""Tekken tokenizer (core; the simulator and the checks share it): prompt token counts and output token boundaries.

mistral-common ships the ``tekken_240911.json`` vocabulary as a v3 file without a special-token list.  Like the
harness that produced the reference transcripts (vllm-0.33-transcripts/README.md), we derive a v13 (or v15)
Tekken from it with the special tokens ``</s>``=2, ``[TOOL_CALLS]``=9, ``[ARGS]``=20, ``[THINK]``=22,
``[/THINK]``=23 (and ``[MODEL_SETTINGS]``/``[/MODEL_SETTINGS]`` for v15).  The derived JSON is written once to a
cache directory (``$ML4_TOOLS/sim``), never committed.

Prompt tokens come from mistral-common's own chat request encoding (tools, system prompt and, for v15, the
``[MODEL_SETTINGS]{"reasoning_effort": ...}[/MODEL_SETTINGS]`` block included); output text is split into the
token pieces the engine would emit.
"""

from __future__ import annotations

import json
import os
import threading
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import mistral_common

# Special tokens in rank order (ranks 0-19 are mistral-common's deprecated defaults; 20-25 follow the transcripts).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
    "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]", "[ARGS]", "[CALL_ID]", "[THINK]",
    "[/THINK]", "[MODEL_SETTINGS]", "[/MODEL_SETTINGS]",
)
#: Every control token that must never reach a client-visible field.
CONTROL_MARKERS: tuple[str, ...] = ("[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]",
                                    "[MODEL_SETTINGS]", "[/MODEL_SETTINGS]")
REASONING_EFFORTS: tuple[str, ...] = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_SOURCE_VOCAB = "tekken_240911.json"


def cache_dir() -> Path:
    """Where the derived tokenizer file lives (``$ML4_TOOLS/sim``, default ``~/.cache/pytest-ml4/sim``)."""
    root = Path(os.environ.get("ML4_TOOLS") or Path.home() / ".cache" / "pytest-ml4").expanduser()
    return root / "sim"


def tekken_path(version: int) -> Path:
    """Build (once) and return the derived Tekken file for tokenizer ``version`` (13 or 15; others map to 13)."""
    version = 15 if version >= 15 else 13
    path = cache_dir() / f"tekken_240911_v{version}_mc{mistral_common.__version__}.json"
    if path.is_file():
        return path
    write_tekken(path, version)
    return path


def derived_tekken(version: int, efforts: tuple[str, ...] = REASONING_EFFORTS,
                   default_effort: str = "none") -> dict[str, Any]:
    """mistral-common's bundled vocabulary relabelled as a v13/v15 Tekken with :data:`SPECIAL_TOKENS`; a v15
    file's ``model_settings_builder`` offers ``efforts`` (older mistral-common releases validate fewer)."""
    src = Path(mistral_common.__file__).parent / "data" / _SOURCE_VOCAB
    data = json.loads(src.read_text())
    data["special_tokens"] = [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(SPECIAL_TOKENS)]
    data["config"]["version"] = f"v{version}"
    if version >= 15:
        data["model_settings_builder"] = {"reasoning_effort": {
            "type": "enum", "values": list(efforts), "accepts_none": True, "default": default_effort}}
    return data


def write_tekken(path: Path, version: int, **kwargs: Any) -> None:
    """Write :func:`derived_tekken` (``kwargs`` passed on) to ``path`` atomically (the simulator's cache, a real
    vLLM model dir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write to a temp name and rename so concurrent simulators never read a half-written file.
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(derived_tekken(version, **kwargs)))
    os.replace(tmp, path)


class PromptError(ValueError):
    """mistral-common refused the conversation (vLLM returns it as a 400)."""


class SimTokenizer:
    """A loaded Tekken tokenizer with cached text -> piece splitting."""

    def __init__(self, version: int = 15, path: Path | None = None) -> None:
        """``path``: a Tekken file to load instead of the derived one (a real vLLM model dir's ``tekken.json``)."""
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

        self.version = 15 if version >= 15 else 13
        self._mt = MistralTokenizer.from_file(str(path or tekken_path(self.version)))
        self._tok = self._mt.instruct_tokenizer.tokenizer
        self._lock = threading.Lock()
        self._pieces_cache: dict[str, tuple[str, ...]] = {}

    # ---------------------------------------------------------------- output side
    def pieces(self, text: str) -> tuple[str, ...]:
        """The text of each token of ``text`` (multi-byte characters split across tokens are merged)."""
        cached = self._pieces_cache.get(text)
        if cached is not None:
            return cached
        ids = self._tok.encode(text, bos=False, eos=False)
        out: list[str] = []
        pending = b""
        for i in ids:
            pending += self._tok.id_to_byte_piece(i)
            try:
                out.append(pending.decode("utf-8"))
                pending = b""
            except UnicodeDecodeError:
                continue
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        result = tuple(out)
        if len(self._pieces_cache) > 4096:
            self._pieces_cache.clear()
        self._pieces_cache[text] = result
        return result

    @cached_property
    def max_chars_per_token(self) -> int:
        """Characters of the longest vocabulary piece: vLLM's bound for its character pre-check."""
        longest = 0
        for i in range(self._tok.n_words):
            try:
                longest = max(longest, len(self._tok.id_to_byte_piece(i).decode("utf-8", errors="replace")))
            except Exception:  # noqa: BLE001, S112 - special-token ids have no byte piece
                continue
        return longest

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, bos=False, eos=False))

    # ---------------------------------------------------------------- prompt side
    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """Prompt length of an OpenAI chat request, through mistral-common's chat encoding where it applies."""
        return len(self.prompt_ids(body))

    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        """Prompt token ids through mistral-common's chat encoding.

        A conversation mistral-common refuses (e.g. one starting with a tool message) raises
        :class:`PromptError`, as vLLM answers 400 for it; request shapes our conversion does not cover fall back
        to a plain-text approximation."""
        from mistral_common.exceptions import MistralCommonException

        try:
            return self._encode_request(body)
        except MistralCommonException as e:
            raise PromptError(str(e)) from None
        except Exception:  # noqa: BLE001 - shapes vLLM accepts that our conversion does not map
            return self._fallback_ids(body)

    def _encode_request(self, body: dict[str, Any]) -> list[int]:
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        req: dict[str, Any] = {"messages": [_clean_message(m) for m in body.get("messages") or []]}
        if body.get("tools"):
            req["tools"] = body["tools"]
        effort = body.get("reasoning_effort")
        if self.version >= 15 and effort is not None:
            req["reasoning_effort"] = effort
        with self._lock:
            return list(self._mt.encode_chat_completion(ChatCompletionRequest.model_validate(req)).tokens)

    def _fallback_ids(self, body: dict[str, Any]) -> list[int]:
        ids = [1]  # <s>
        for m in body.get("messages") or []:
            ids += [3, *self._tok.encode(message_text(m), bos=False, eos=False), 4]
        if body.get("tools"):
            ids += [5, *self._tok.encode(json.dumps(body["tools"]), bos=False, eos=False), 6]
        return ids


def _clean_message(m: Any) -> Any:
    """Drop OpenAI-only keys mistral-common's message models reject (names, nulls)."""
    if not isinstance(m, dict):
        return m
    out = {k: v for k, v in m.items() if v is not None and k not in ("name", "refusal", "annotations", "audio",
                                                                      "function_call", "reasoning",
                                                                      "reasoning_content")}
    if out.get("role") == "assistant" and out.get("tool_calls") and not out.get("content"):
        out.pop("content", None)
    return out


def prompt_text_len(body: dict[str, Any]) -> int:
    """Characters of a chat request's text (messages and tool definitions), counted without tokenising."""
    n = sum(len(message_text(m)) for m in body.get("messages") or [])
    if body.get("tools"):
        n += len(json.dumps(body["tools"]))
    return n


def message_text(m: Any) -> str:
    """The plain text of a chat message (string content or the text parts of a content list)."""
    if not isinstance(m, dict):
        return ""
    content = m.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


@lru_cache(maxsize=2)
def get_tokenizer(version: int = 15) -> SimTokenizer:
    """Process-wide tokenizer per version (loading takes ~0.7 s)."""
    return SimTokenizer(version)


if __name__ == "__main__":
    # ``python -m pytest_ml4.evidence.tokenizer``: pre-build the derived tokenizer files (scripts/install.d/15-sim-tekken.sh).
    for v in (13, 15):
        print(tekken_path(v))
