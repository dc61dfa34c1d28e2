"""Secret redaction for everything that leaves a run: Allure attachments and results, logs, JUnit XML, console.

A :class:`Redactor` knows the run's secrets — the *values* of the environment variables the target names for
its API key (read at redaction time, so a key the simulator generates later is still covered), values added
explicitly — and also scrubs secrets it was never told about by shape: ``Authorization: Bearer …`` /
``Basic …`` credentials, ``sk-…`` style keys, ``api_key=…`` / ``"api_key": "…"`` pairs and URL userinfo.

Others call the module-level :func:`redact` before attaching anything::

    from pytest_ml4.report.redact import redact
    allure.attach(redact(response.text), "response", allure.attachment_type.JSON)

It keeps the type: ``str`` in, ``str`` out; ``bytes`` in, ``bytes`` out; dicts/lists are walked (values under
sensitive keys are masked whole). :func:`find_leaks` is the inverse check the secret-scan tests use.
"""

from __future__ import annotations

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
# Values that are already masks or empty placeholders (vLLM logs "api_key': '[redacted]'") are not secrets.
_PLACEHOLDER = r"(?:\*\*\*|\[redacted\]|<redacted>|redacted\b|none\b|null\b|\$\{?[A-Za-z_])"
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
        """Redact a string."""
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

    # ------------------------------------------------------------------------------------------ checking
    def find_leaks(self, text: str) -> list[Leak]:
        """Secrets (known values or secret-shaped strings) still present in ``text``."""
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
