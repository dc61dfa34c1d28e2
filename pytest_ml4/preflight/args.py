"""Command-line flag parsing for ``vllm serve``, ``dynamo.vllm``, ``dynamo.frontend`` and ``aiperf profile``.

vLLM accepts ``--flag value``, ``--flag=value``, ``--flag_name`` spellings and dotted sub-keys of JSON flags
(``--speculative-config.method dspark``); all are normalised here so rules ask for ``max-model-len`` once.
JSON-valued flags are checked for valid JSON so a broken ``--speculative-config`` is reported, not ignored.
"""

from __future__ import annotations

import json

from pytest_ml4.preflight.model import EngineArgs

# Flags whose value is a JSON object (vLLM 0.33 engine args and their Dynamo pass-through).
JSON_FLAGS = frozenset({"speculative-config", "kv-transfer-config", "kv-events-config", "compilation-config",
                        "additional-config", "hf-overrides", "override-generation-config"})

# Switches that never take a value, so a following positional word is not swallowed as their value.
BOOLEAN_FLAGS = frozenset({
    "enforce-eager", "enable-auto-tool-choice", "disable-custom-all-reduce", "disable-flashinfer-autotune",
    "disable-hybrid-kv-cache-manager", "enable-expert-parallel", "enable-chunked-prefill", "no-async-scheduling",
    "async-scheduling", "enable-prefix-caching", "no-enable-prefix-caching", "trust-remote-code",
    "disable-log-requests", "disable-log-stats", "router-kv-events", "no-router-kv-events", "streaming",
    "use-server-token-count", "export-http-trace", "enable-log-requests", "is-prefill-worker",
    "is-decode-worker", "disable-eagle-block-drop",
})


def normalise(flag: str) -> str:
    return flag.lstrip("-").replace("_", "-").lower()


def parse_flags(program: str, words: list[str], line: int | None = None) -> EngineArgs:
    """Parse the words after the program name into an :class:`EngineArgs`."""
    out = EngineArgs(program=program, line=line)
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-") or word in ("-", "--"):
            if out.model is None and program == "vllm serve":
                out.model = word
            i += 1
            continue
        name, eq, inline = word.partition("=")
        key = normalise(name)
        value: str | None
        if eq:
            value = inline
        elif key not in BOOLEAN_FLAGS and i + 1 < len(words) and not _looks_like_flag(words[i + 1]):
            value = words[i + 1]
            i += 1
        else:
            value = None
        i += 1
        base, dot, _ = key.partition(".")
        if dot and base in JSON_FLAGS:
            # Keep the JSON sub-key as written (JSON keys use underscores).
            out.dotted.setdefault(base, {})[name.lstrip("-").partition(".")[2]] = value or "true"
            continue
        out.flags.setdefault(key, []).append(value)
        if key in JSON_FLAGS and value is not None:
            _check_json(out, key, value)
    if program == "dynamo.vllm" and out.model is None:
        out.model = out.get("model")
    return out


def _looks_like_flag(word: str) -> bool:
    if not word.startswith("-") or word == "-":
        return False
    try:
        float(word)  # a negative number is a value
    except ValueError:
        return True
    return False


def _check_json(out: EngineArgs, key: str, value: str) -> None:
    if value.startswith("$"):
        return  # filled in at run time from the environment; nothing to check statically
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as err:
        out.parse_errors.append(f"--{key} is not valid JSON ({err.msg} at column {err.colno})")
        return
    if not isinstance(parsed, dict):
        out.parse_errors.append(f"--{key} must be a JSON object, got {type(parsed).__name__}")
