"""What a Dynamo version does with Mistral Large 4's output: the table in ``fixtures/dynamo/versions.yaml``.

Works without pytest::

    from pytest_ml4.dynamo_versions import behaviour, image_version
    b = behaviour("1.6.1")                      # DynamoBehaviour(mistral_v11_tool_calls_parsed=False, ...)
    image_version("nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1")   # "1.6.1"

Per-version differences live in the table, not in ``if`` chains: a suite asks ``behaviour(v).<field>``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from pytest_ml4.targets import FIXTURES_DIR

VERSIONS_FILE = FIXTURES_DIR / "dynamo" / "versions.yaml"


class DynamoVersionError(ValueError):
    """The versions table is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class DynamoBehaviour:
    version: str
    public: bool
    mistral_v11_tool_calls_parsed: bool
    mistral_legacy_tool_calls_parsed: bool
    mistral_parser_v2: bool
    reasoning_split_needs_effort: bool
    source: str
    covers: tuple[str, ...] = ()
    #: How a deployment on public Dynamo 1.6.1 is made to behave as this version (real dynamo.vllm workers under
    #: ``--sim-engine vllm``): what the scripted model emits; empty for a version that runs as itself.
    emulation: dict[str, object] = field(default_factory=dict)


_BOOL_FIELDS = ("public", "mistral_v11_tool_calls_parsed", "mistral_legacy_tool_calls_parsed", "mistral_parser_v2",
                "reasoning_split_needs_effort")


def _row(version: str, raw: object, path: Path) -> DynamoBehaviour:
    if not isinstance(raw, dict):
        raise DynamoVersionError(f"{path}: versions.{version} must be a mapping")
    unknown = set(raw) - set(_BOOL_FIELDS) - {"source", "covers", "emulation"}
    if unknown:
        raise DynamoVersionError(f"{path}: versions.{version}: unknown field(s) {sorted(unknown)}")
    for name in _BOOL_FIELDS:
        if not isinstance(raw.get(name), bool):
            raise DynamoVersionError(f"{path}: versions.{version}.{name} must be true or false, "
                                     f"got {raw.get(name)!r}")
    return DynamoBehaviour(version=version, source=" ".join(str(raw.get("source", "")).split()),
                           covers=tuple(str(c) for c in raw.get("covers") or ()),
                           emulation=_emulation(version, raw.get("emulation"), path),
                           **{name: raw[name] for name in _BOOL_FIELDS})


#: ``emulation`` keys: the tool-call form the model emits (``legacy`` or ``v11``) and whether it thinks before a
#: tool call (1.6.1's reasoning parser swallows a call after ``[/THINK]``).
EMULATION_FIELDS = {"tool_form": ("legacy", "v11"), "think_before_tool_call": (True, False)}
#: Mistral Large 4's own output (a version without an emulation row runs the model as it is).
OWN_OUTPUT: dict[str, object] = {"tool_form": "v11", "think_before_tool_call": True}


def _emulation(version: str, raw: object, path: Path) -> dict[str, object]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or set(raw) - set(EMULATION_FIELDS):
        raise DynamoVersionError(f"{path}: versions.{version}.emulation must be a mapping of "
                                 f"{sorted(EMULATION_FIELDS)}, got {raw!r}")
    for key, value in raw.items():
        if value not in EMULATION_FIELDS[key]:
            raise DynamoVersionError(f"{path}: versions.{version}.emulation.{key} must be one of "
                                     f"{list(EMULATION_FIELDS[key])}, got {value!r}")
    return dict(raw)


def model_output(version: str | None) -> dict[str, object]:
    """What the scripted model on a real 1.6.1 deployment emits for a target declaring ``version``: the row's
    ``emulation`` over Mistral Large 4's own output (unknown version or no emulation: the model's own)."""
    row = behaviour(version) if version else None
    return {**OWN_OUTPUT, **(row.emulation if row is not None else {})}


@lru_cache(maxsize=4)
def load_table(path: Path = VERSIONS_FILE) -> dict[str, DynamoBehaviour]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("versions"), dict):
        raise DynamoVersionError(f"{path}: top level needs a 'versions' mapping")
    return {str(v): _row(str(v), raw, path) for v, raw in data["versions"].items()}


def behaviour(version: str, path: Path = VERSIONS_FILE) -> DynamoBehaviour | None:
    """The row for ``version`` (exact key first, then a row whose ``covers`` pattern matches); None if unknown."""
    table = load_table(path)
    if version in table:
        return table[version]
    return next((row for row in table.values() if any(fnmatch.fnmatchcase(version, c) for c in row.covers)), None)


def known_versions(path: Path = VERSIONS_FILE) -> list[str]:
    return sorted(load_table(path))


def image_version(image: str | None) -> str | None:
    """The tag of a container image reference (``repo/name:TAG[@digest]``), or None when it has no tag."""
    if not image:
        return None
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def tool_call_drop_cause(version: str) -> str | None:
    """Why no tool call comes back from a Dynamo ``version`` whose ``mistral`` parser drops Mistral Large 4's
    ``[TOOL_CALLS]name[ARGS]{...}`` form; None where the table says the form is parsed (or the version is unknown)."""
    row = behaviour(version)
    if row is None or row.mistral_v11_tool_calls_parsed:
        return None
    parsed = [v for v, r in load_table().items() if r.mistral_v11_tool_calls_parsed]
    return (f"Dynamo {version}'s `mistral` tool parser silently drops Mistral Large 4's "
            f"[TOOL_CALLS]name[ARGS]{{...}} form (no tool_calls; content null or the raw markup, finish_reason stop; "
            f"fixtures/dynamo/versions.yaml mistral_v11_tool_calls_parsed: false); serve it with a Dynamo that "
            f"parses that form ({', '.join(parsed) or 'none known'})")
