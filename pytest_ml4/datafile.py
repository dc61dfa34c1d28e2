"""Reading the package's data files (and a team's) into typed models, with one-line errors.

Every YAML or JSON table the core reads goes through :func:`load_yaml` or :func:`load_json` with the pydantic
model (or any annotation pydantic validates, e.g. ``dict[str, Family]``) that describes it::

    from pytest_ml4.datafile import load_yaml
    table = load_yaml(data_file("kv", "load.yaml"), KvLoadTable)

A file that breaks its model raises :class:`DataFileError` with ONE line: the file, the line, and the field path
with pydantic's reason (``invalid data file .../load.yaml: line 7: field 'prompt_tokens': Input should be a valid
integer``); an unknown key names the allowed field it is most likely a typo of. YAML errors (syntax, a tag the safe
loader refuses, a key given twice, text that is not UTF-8) are one line with the line too. Line numbers come from
the composed node tree (PyYAML's ``start_mark``), read only when a file is refused; JSON is composed the same way
(JSON is YAML as far as the node tree goes).

The target model (:mod:`pytest_ml4.target.model`) reads its files with :func:`read_yaml` and reuses
:func:`near_field` and :func:`union_members`; it keeps its own messages (an override names the option, not the file).

Core code: no pytest, imports nothing of the project.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

M = TypeVar("M")


class DataFileError(ValueError):
    """A data file is missing, unreadable or does not match its model; the message is one line naming the file,
    the line and the field."""


class Strict(BaseModel):
    """Base of the data files' models: an unknown key is a typo until proven otherwise, a loaded table is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key]})", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def yaml_error_line(err: yaml.YAMLError) -> str:
    """A YAML error on one line: ``line L, column C: problem`` (PyYAML's own text spans several lines)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(problem).split())


def parse_yaml_value(text: str) -> Any:
    """One YAML value (an override's right-hand side); a key given twice is refused as in a file."""
    return yaml.load(text, Loader=_StrictLoader)


def _text(path: Path, what: str, error: type[ValueError]) -> str:
    """The file's text, or ``error`` of one line: missing, unreadable, or not UTF-8 (with the line)."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise error(f"invalid {what} {path}: {err.strerror or err}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise error(f"invalid {what} {path}: line {line}: not UTF-8 text (byte 0x{raw[err.start]:02x})") from None


def read_yaml(path: Path, what: str = "data file", error: type[ValueError] = DataFileError) -> Any:
    """A YAML file's data, or ``error`` of one line ``invalid <what> <path>: line L, column C: problem``: not
    UTF-8, a YAML error, a tag the safe loader refuses, or a key given twice."""
    text = _text(path, what, error)
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        raise error(f"invalid {what} {path}: {yaml_error_line(err)}") from None


def read_json(path: Path, what: str = "data file", error: type[ValueError] = DataFileError) -> Any:
    """A JSON file's data, or ``error`` of one line naming the file and the line of the syntax error."""
    text = _text(path, what, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"invalid {what} {path}: line {err.lineno}, column {err.colno}: {err.msg}") from None


# --- where a field is: the node tree's marks ---------------------------------------------------------------------

def _child(node: yaml.Node, part: str | int) -> tuple[yaml.Node, yaml.Node] | None:
    """(key node, value node) of ``part`` under a mapping node, (item, item) under a sequence node, else None."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return key, value
    elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return node.value[part], node.value[part]
    return None


def line_at(root: yaml.Node | None, loc: tuple[str | int, ...], key: bool = False) -> int | None:
    """The 1-based line of the deepest node ``loc`` reaches in the composed tree (a missing field: the mapping
    that lacks it; ``key``: the key's own line, for an unknown key). Location parts that name no node (pydantic's
    union members, ``function-after[...]``) are stepped over."""
    if root is None:
        return None
    node, line = root, root.start_mark.line + 1
    for part in loc:
        found = _child(node, part)
        if found is None:
            continue
        key_node, node = found
        line = (key_node if key else node).start_mark.line + 1
    return line


def compose(text: str) -> yaml.Node | None:
    """The node tree of YAML (or JSON) text, for its marks; None where PyYAML cannot compose it."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None


# --- which fields a model allows: the near name of a typo ---------------------------------------------------------

def union_members(tp: Any) -> list[Any]:
    """The types a value of annotation ``tp`` may hold (``X | None`` -> [X])."""
    if get_origin(tp) in (Union, UnionType):
        return [a for a in get_args(tp) if a is not type(None)]
    return [tp]


def _step(tp: Any, part: str | int) -> Any:
    """The annotation one location part further down: a model's field, a dict's value, a list's or tuple's item."""
    for t in union_members(tp):
        if isinstance(t, type) and issubclass(t, BaseModel):
            if part in t.model_fields:
                return t.model_fields[part].annotation
            by_alias = {f.alias: f.annotation for f in t.model_fields.values() if f.alias}
            if part in by_alias:
                return by_alias[part]
        elif get_origin(t) in (dict, Mapping):
            return get_args(t)[1]
        elif get_origin(t) in (list, tuple) and get_args(t):
            return get_args(t)[0]
    return None


def field_names_at(model: Any, loc: tuple[str | int, ...]) -> list[str]:
    """The field names ``model`` allows at ``loc`` (a section such as ``("gates",)``); [] where none."""
    tp: Any = model
    for part in loc:
        tp = _step(tp, part)
        if tp is None:
            return []
    return [f.alias or name for t in union_members(tp) if isinstance(t, type) and issubclass(t, BaseModel)
            for name, f in t.model_fields.items() if name != "path"]


def near_field(model: Any, loc: tuple[str | int, ...]) -> str:
    """For an unknown key: the allowed field it is most likely a typo of (``ttft_p99_knee`` -> ttft_p99_knee_s)."""
    close = difflib.get_close_matches(str(loc[-1]), field_names_at(model, loc[:-1]), n=1, cutoff=0.6)
    return f"unknown field; did you mean '{close[0]}'?" if close else "unknown field"


def validation_line(path: Path, model: Any, err: ValidationError, root: yaml.Node | None,
                    what: str = "data file") -> str:
    """One line for a file that breaks its model: the file, then each bad field with its line and reason."""
    parts = []
    for e in err.errors():
        loc = tuple(e["loc"])
        unknown = e["type"] == "extra_forbidden"
        reason = near_field(model, loc) if unknown else e["msg"]
        line = line_at(root, loc, key=unknown)
        where = f"line {line}: " if line is not None else ""
        parts.append(f"{where}field '{'.'.join(str(x) for x in loc) or '<top level>'}': {reason}")
    return f"invalid {what} {path}: " + "; ".join(parts)


def validate(path: Path, text: str, data: Any, model: type[M], what: str = "data file",
             context: dict[str, Any] | None = None, error: type[ValueError] = DataFileError) -> M:
    """``data`` (read from ``path``, whose text is ``text``) as ``model``; ``error`` of one line naming the file,
    each bad field and its line."""
    try:
        return TypeAdapter(model).validate_python(data, context=context)
    except ValidationError as err:
        raise error(validation_line(path, model, err, compose(text), what)) from None


def load_yaml(path: Path, model: type[M], what: str = "data file", context: dict[str, Any] | None = None) -> M:
    """A YAML file validated as ``model`` (a pydantic model or any annotation pydantic validates, e.g.
    ``dict[str, Family]``); :class:`DataFileError` (file, line, field) when it is not."""
    path = Path(path)
    data = read_yaml(path, what)
    return validate(path, path.read_text(encoding="utf-8"), data, model, what, context)


def load_json(path: Path, model: type[M], what: str = "data file", context: dict[str, Any] | None = None) -> M:
    """A JSON file validated as ``model``; :class:`DataFileError` (file, line, field) when it is not."""
    path = Path(path)
    data = read_json(path, what)
    return validate(path, path.read_text(encoding="utf-8"), data, model, what, context)


def load_jsonl(path: Path, model: type[M], what: str = "data file") -> list[M]:
    """A JSON Lines file (one JSON value a line, blank lines skipped), each line validated as ``model``;
    :class:`DataFileError` naming the file, the line and the field when one is not."""
    path = Path(path)
    rows: list[M] = []
    for number, line in enumerate(_text(path, what, DataFileError).splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataFileError(f"invalid {what} {path}: line {number}, column {err.colno}: {err.msg}") from None
        # The line padded to its place in the file: the composed node's marks then carry the file's line.
        rows.append(validate(path, "\n" * (number - 1) + line, data, model, what))
    return rows
