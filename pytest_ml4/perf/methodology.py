"""Fixed-OSL methodology checks: ``min_tokens``, never ``ignore_eos``.

Seed 000, "One methodology note that matters": fixed-OSL benchmarks must use ``--extra-inputs 'min_tokens:N'``,
not ``ignore_eos: true``. With ``ignore_eos`` the EOS token can be sampled; the Mistral reasoning grammar then
rejects tokens [2, 34] and the request is killed (``ParserTooComplex``). :func:`ignore_eos_uses` finds the places
a config asks for it (aiperf command lines, aiperf YAML, request bodies), skipping comments, and
:data:`WHY_NOT_IGNORE_EOS` is the explanation a failing check prints.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WHY_NOT_IGNORE_EOS = (
    "fixed-OSL runs must hold the length with min_tokens = max_tokens = N (aiperf: --extra-inputs 'min_tokens:N'), "
    "not ignore_eos: with ignore_eos the EOS token can still be sampled, the Mistral reasoning grammar then rejects "
    "tokens [2, 34] and vLLM kills the request (ParserTooComplex / 'grammar rejected'), so the benchmark measures "
    "killed requests (seed 000, methodology note). min_tokens suppresses EOS until N tokens instead; LiteLLM's "
    "drop_params: true passes it through.")

# ignore_eos set to a true value: CLI (--extra-inputs ignore_eos:true), YAML (ignore_eos: true), JSON ("ignore_eos": true)
_TRUE_USE = re.compile(r"""["']?ignore_eos["']?\s*[:=]\s*["']?(true|True|1|yes)\b""")
_COMMENT = re.compile(r"^\s*(#|//)")


@dataclass(frozen=True)
class IgnoreEosUse:
    source: str
    line: int
    text: str

    def describe(self) -> str:
        return f"{self.source}:{self.line}: {self.text.strip()}"


def ignore_eos_uses(text: str, source: str = "<config>") -> list[IgnoreEosUse]:
    """Lines of ``text`` that switch ``ignore_eos`` on (comment lines and trailing comments are ignored)."""
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        if _COMMENT.match(line):
            continue
        code = line.split(" #", 1)[0]
        if _TRUE_USE.search(code):
            out.append(IgnoreEosUse(source, no, line))
    return out


def ignore_eos_in_files(paths: Iterable[Path]) -> list[IgnoreEosUse]:
    found: list[IgnoreEosUse] = []
    for p in paths:
        if p.is_file():
            found += ignore_eos_uses(p.read_text(errors="replace"), str(p))
    return found


def extra_inputs_ask_ignore_eos(extra: Mapping[str, Any]) -> bool:
    value = extra.get("ignore_eos")
    return value is True or str(value).lower() in ("true", "1", "yes")


def explain(uses: Iterable[IgnoreEosUse]) -> str:
    lines = [u.describe() for u in uses]
    return "ignore_eos requested by:\n  " + "\n  ".join(lines) + "\nwhy it must not be: " + WHY_NOT_IGNORE_EOS
