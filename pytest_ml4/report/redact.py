"""Secret redaction for everything that leaves a run: Allure attachments and results, logs, JUnit XML, console.

A :class:`Redactor` knows the run's secrets — the *values* of the environment variables the target names for
its API key (read at redaction time, so a key the simulator generates later is still covered), values added
explicitly — and also scrubs secrets it was never told about by shape: ``Authorization: Bearer …`` /
``Basic …`` credentials, ``sk-…`` style keys, ``api_key=…`` / ``"api_key": "…"`` pairs and URL userinfo.

Others call the module-level :func:`redact` before attaching anything::

    from pytest_ml4.report.redact import redact
    allure.attach(redact(response.text), "response", allure.attachment_type.JSON)

Text holding an SSE stream (``data: {...}`` lines) is also redacted *after it is assembled*: the deltas of each
choice (content, reasoning, tool-call arguments) are joined, and a secret found in the joined text masks every
chunk that carries part of it, so a key the server split across chunks does not survive in a transcript.

It keeps the type: ``str`` in, ``str`` out; ``bytes`` in, ``bytes`` out; dicts/lists are walked (values under
sensitive keys are masked whole). :func:`find_leaks` is the inverse check the secret-scan tests use.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

MASK = "***"

# Shorter "secrets" would turn ordinary words into masks all over the report; real API keys are far longer.
MIN_SECRET_LEN = 6
# pytest's assertion diffs and other truncating reprs show a long value as "head...tail": any run of this many
# characters of a known secret (of at least FRAGMENT_SECRET_LEN) counts as the secret.
FRAGMENT_LEN = 10
FRAGMENT_SECRET_LEN = 20

_SCHEME_RE = re.compile(r"(?i)\b(bearer|basic)(\s+)(?!\*\*\*)[A-Za-z0-9._~+/=:-]{6,}")
_SK_RE = re.compile(r"\bsk-(?!\*\*\*)[A-Za-z0-9_-]{8,}")
_KEY_NAMES = r"(?:x-)?api[_-]?key|access[_-]?token|auth[_-]?token|refresh[_-]?token|client[_-]?secret|password|passwd"
# Values that are already masks or empty placeholders (vLLM logs "api_key': '[redacted]'") are not secrets, nor are
# references to a variable: a shell's ${VAR} and LiteLLM's config syntax os.environ/VAR.
_PLACEHOLDER = r"(?:\*\*\*|\[redacted\]|<redacted>|redacted\b|none\b|null\b|\$\{?[A-Za-z_]|os\.environ/[A-Za-z_])"
_PAIR_RE = re.compile(
    r"(?i)(?<![A-Za-z0-9_])((?:" + _KEY_NAMES + r")[\"']?\s*[:=]\s*\[?\s*[\"']?)(?!" + _PLACEHOLDER
    + r")([^\"'\s,&;}\]]{4,})"
)
_USERINFO_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@:]+:[^/\s@]+@")
_SENSITIVE_KEY_RE = re.compile(r"(?i)^(?:authorization|proxy-authorization|cookie|set-cookie|" + _KEY_NAMES + r")$")

T = TypeVar("T")

#: Command-line flags whose value is a secret (vLLM's and LiteLLM's): in ``engine.extra_args`` a key is a
#: list item after the flag, where no text pattern sees it.
SECRET_FLAGS = ("--api-key", "--hf-token", "--ssl-keyfile-password", "--master-key", "--token")


def mask_secret_args(args: Iterable[Any]) -> list[Any]:
    """``args`` with the value of every :data:`SECRET_FLAGS` flag masked (``--flag VALUE`` and ``--flag=VALUE``)."""
    out: list[Any] = []
    masked_next = False
    for arg in args:
        text = str(arg)
        flag, eq, _value = text.partition("=")
        if masked_next:
            out.append(MASK)
        elif eq and flag in SECRET_FLAGS:
            out.append(f"{flag}={MASK}")
        else:
            out.append(arg)
        masked_next = not masked_next and not eq and text in SECRET_FLAGS
    return out


@dataclass(frozen=True)
class Leak:
    """One secret found in a text: what kind and where (the secret itself is never stored)."""

    kind: str
    start: int
    context: str


class Redactor:
    """Scrubs known secrets and secret-shaped strings from text, bytes and JSON-like data."""

    def __init__(self, secrets: Iterable[str] = (), env_names: Iterable[str] = (),
                 env: Mapping[str, str] | None = None) -> None:
        self._secrets: set[str] = set()
        self._env_names: set[str] = set()
        self._env = env
        self.add(*secrets)
        self.add_env(*env_names)

    def __repr__(self) -> str:
        # Never show the values; the count is enough to debug "was the key registered?".
        return f"Redactor({len(self._secrets)} secrets, env={sorted(self._env_names)})"

    # ------------------------------------------------------------------------------------------ registration
    def add(self, *secrets: str | None) -> None:
        """Register literal secret values (empty and very short values are ignored)."""
        for value in secrets:
            if value and len(value) >= MIN_SECRET_LEN:
                self._secrets.add(value)

    def add_env(self, *names: str | None) -> None:
        """Register environment variables whose *values* are secrets (read each time, so late keys count)."""
        self._env_names.update(n for n in names if n)

    def secrets(self) -> list[str]:
        """All literal secrets currently known, longest first (so a key containing another is masked whole)."""
        env = os.environ if self._env is None else self._env
        values = set(self._secrets)
        values.update(v for n in self._env_names if (v := env.get(n)) and len(v) >= MIN_SECRET_LEN)
        variants = values | {quote(v, safe="") for v in values}
        return sorted(variants, key=len, reverse=True)

    # ------------------------------------------------------------------------------------------ scrubbing
    def redact_text(self, text: str) -> str:
        """Redact a string (an SSE stream in it also after assembling its deltas)."""
        if _SSE_DATA_RE.search(text):
            text = self._redact_sse_pieces(text)
        return self._redact_plain(text)

    def _redact_plain(self, text: str) -> str:
        for secret in self.secrets():
            text = text.replace(secret, MASK)
        for secret in self.secrets():
            for start, end in reversed(_fragment_spans(text, secret)):
                text = text[:start] + MASK + text[end:]
        text = _SCHEME_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
        text = _SK_RE.sub("sk-" + MASK, text)
        text = _PAIR_RE.sub(lambda m: m.group(1) + MASK, text)
        return _USERINFO_RE.sub(lambda m: m.group(1) + MASK + "@", text)

    def redact_bytes(self, data: bytes) -> bytes:
        """Redact bytes; undecodable bytes are kept as they are (binary attachments such as PNGs pass through)."""
        text = data.decode("utf-8", errors="surrogateescape")
        return self.redact_text(text).encode("utf-8", errors="surrogateescape")

    def redact_json(self, obj: Any) -> Any:
        """Redact a JSON-like structure: values under sensitive keys are masked whole, strings are scrubbed."""
        if isinstance(obj, str):
            return self.redact_text(obj)
        if isinstance(obj, Mapping):
            out = {}
            for key, value in obj.items():
                skey = self.redact_text(key) if isinstance(key, str) else key
                if isinstance(key, str) and _SENSITIVE_KEY_RE.match(key) and isinstance(value, str) and value:
                    out[skey] = MASK
                else:
                    out[skey] = self.redact_json(value)
            return out
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.redact_json(v) for v in obj)
        return obj

    def __call__(self, obj: T) -> T:
        """Redact ``obj`` keeping its type (str, bytes/bytearray, dict/list/tuple); other objects pass through."""
        if isinstance(obj, (bytes, bytearray)):
            return type(obj)(self.redact_bytes(bytes(obj)))  # type: ignore[return-value]
        return self.redact_json(obj)

    def _redact_sse_pieces(self, text: str) -> str:
        """Mask every SSE chunk's piece of text that holds part of a secret found in its assembled stream."""
        lines = text.split("\n")
        masked: set[tuple[int, tuple[Any, ...]]] = set()
        for pieces in _sse_streams(lines).values():
            joined = "".join(piece.value for piece in pieces)
            spans = self._leak_spans(joined)
            offset = 0
            for piece in pieces:
                end = offset + len(piece.value)
                if any(a < end and offset < b for a, b in spans):
                    masked.add((piece.line, piece.path))
                offset = end
        for line_no in sorted({line for line, _ in masked}):
            m = _SSE_LINE_RE.match(lines[line_no])
            assert m is not None  # a piece came from this line
            obj = json.loads(m.group("payload"))
            for line, path in masked:
                if line == line_no:
                    _set_path(obj, path, MASK)
            lines[line_no] = f"{m.group('prefix')}data: {json.dumps(obj, ensure_ascii=False)}"
        return "\n".join(lines)

    def _leak_spans(self, text: str) -> list[tuple[int, int]]:
        spans: list[tuple[int, int]] = []
        for secret in self.secrets():
            spans += [(m.start(), m.end()) for m in re.finditer(re.escape(secret), text)]
            spans += _fragment_spans(text, secret)
        for regex in (_SCHEME_RE, _SK_RE, _PAIR_RE, _USERINFO_RE):
            spans += [(m.start(), m.end()) for m in regex.finditer(text)]
        return spans

    # ------------------------------------------------------------------------------------------ checking
    def find_leaks(self, text: str) -> list[Leak]:
        """Secrets (known values or secret-shaped strings) still present in ``text``, also in the assembled text
        of an SSE stream in it (a key split across chunks)."""
        leaks = self._find_plain_leaks(text)
        if _SSE_DATA_RE.search(text):
            for key, pieces in _sse_streams(text.split("\n")).items():
                joined = "".join(piece.value for piece in pieces)
                if not self._find_plain_leaks(joined):
                    continue
                masked = self._redact_plain(joined)
                leaks.append(Leak(f"split across SSE chunks ({'.'.join(map(str, key))})", 0,
                                  masked[:60].replace("\n", "\\n")))
        return leaks

    def _find_plain_leaks(self, text: str) -> list[Leak]:
        leaks: list[Leak] = []
        for secret in self.secrets():
            start = text.find(secret)
            if start >= 0:
                leaks.append(Leak("known secret", start, _context(text, start, len(secret))))
            else:
                leaks += [Leak("part of a known secret", a, _context(text, a, b - a))
                          for a, b in _fragment_spans(text, secret)]
        for kind, regex in (("bearer/basic credential", _SCHEME_RE), ("sk- key", _SK_RE),
                            ("key=value credential", _PAIR_RE), ("URL credentials", _USERINFO_RE)):
            for m in regex.finditer(text):
                leaks.append(Leak(kind, m.start(), _context(text, m.start(), m.end() - m.start())))
        return leaks


# A data line as sent, or as the probe's transcript writes it ("[+   0.012s] event: x data: {...}").
_SSE_DATA_RE = re.compile(r"(?m)^[^{\"\n]*data: ?\{")
_SSE_LINE_RE = re.compile(r"^(?P<prefix>[^{\"]*?)data: ?(?P<payload>\{.*\})\s*$")
#: Where a chunk carries generated text (OpenAI chat and completions streams): joined per choice and field.
_DELTA_FIELDS = ("content", "reasoning_content", "reasoning")


@dataclass(frozen=True)
class _Piece:
    line: int
    path: tuple[Any, ...]
    value: str


def _sse_streams(lines: list[str]) -> dict[tuple[Any, ...], list[_Piece]]:
    """The text pieces of an SSE stream by (choice, field[, tool call]), in order."""
    streams: dict[tuple[Any, ...], list[_Piece]] = {}
    for no, line in enumerate(lines):
        obj = _sse_payload(line)
        for key, path, value in _chunk_pieces(obj):
            streams.setdefault(key, []).append(_Piece(no, path, value))
    return streams


def _sse_payload(line: str) -> Any:
    """The JSON object of an SSE data line, None for any other line."""
    m = _SSE_LINE_RE.match(line)
    if m is None:
        return None
    try:
        return json.loads(m.group("payload"))
    except ValueError:
        return None


def _chunk_pieces(obj: Any) -> list[tuple[tuple[Any, ...], tuple[Any, ...], str]]:
    """(stream key, path in the chunk, text) of each piece of generated text in one chunk."""
    out: list[tuple[tuple[Any, ...], tuple[Any, ...], str]] = []
    choices = obj.get("choices") if isinstance(obj, dict) else None
    for i, choice in enumerate(choices if isinstance(choices, list) else []):
        if not isinstance(choice, dict):
            continue
        index = choice.get("index", i)
        if isinstance(choice.get("text"), str):
            out.append(((index, "text"), ("choices", i, "text"), choice["text"]))
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        out += [((index, f), ("choices", i, "delta", f), delta[f]) for f in _DELTA_FIELDS
                if isinstance(delta.get(f), str)]
        for j, call in enumerate(delta.get("tool_calls") or []):
            args = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
            if isinstance(args, str):
                out.append(((index, "tool_call", call.get("index", j)),
                            ("choices", i, "delta", "tool_calls", j, "function", "arguments"), args))
    return out


def _set_path(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        obj = obj[step]
    obj[path[-1]] = value


def _fragment_spans(text: str, secret: str) -> list[tuple[int, int]]:
    """Non-overlapping spans of ``text`` that are runs of >= FRAGMENT_LEN characters of ``secret``, in order."""
    if len(secret) < FRAGMENT_SECRET_LEN:
        return []
    spans: list[tuple[int, int]] = []
    for i in range(len(secret) - FRAGMENT_LEN + 1):
        frag = secret[i:i + FRAGMENT_LEN]
        pos = text.find(frag)
        while pos >= 0:
            # Grow the match both ways while text and secret keep agreeing, so the whole fragment is masked.
            a, b, si, sj = pos, pos + FRAGMENT_LEN, i, i + FRAGMENT_LEN
            while a > 0 and si > 0 and text[a - 1] == secret[si - 1]:
                a, si = a - 1, si - 1
            while b < len(text) and sj < len(secret) and text[b] == secret[sj]:
                b, sj = b + 1, sj + 1
            spans.append((a, b))
            pos = text.find(frag, pos + 1)
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def _context(text: str, start: int, length: int) -> str:
    """Text around a leak with the leaked part itself masked, safe to print in a failure message."""
    before = text[max(0, start - 30):start]
    after = text[start + length:start + length + 30]
    return f"{before}<{length} chars>{after}".replace("\n", "\\n")


#: The run-wide redactor; the report plugin registers the target's API-key variable on it.
DEFAULT = Redactor(env_names=("LLM_API_KEY",))


def redact(obj: T) -> T:
    """Redact ``obj`` with the run-wide :data:`DEFAULT` redactor (same type out as in)."""
    return DEFAULT(obj)


def register_secret(*values: str | None) -> None:
    """Tell the run-wide redactor about literal secret values."""
    DEFAULT.add(*values)


def register_secret_env(*names: str | None) -> None:
    """Tell the run-wide redactor about environment variables holding secrets."""
    DEFAULT.add_env(*names)


def find_leaks(text: str) -> list[Leak]:
    """Leaks the run-wide redactor would have removed from ``text``."""
    return DEFAULT.find_leaks(text)
