"""What a Dynamo version does with Mistral Large 4's output: the table in ``pytest_ml4/data/dynamo/versions.yaml``.

Works without pytest::

    from pytest_ml4.stacks.dynamo_versions import behaviour, image_version
    b = behaviour("1.6.1")                      # DynamoBehaviour(mistral_v11_tool_calls_parsed=False, ...)
    image_version("nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1")   # "1.6.1"

Per-version differences live in the table, not in ``if`` chains: a suite asks ``behaviour(v).<field>``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictBool, StrictStr, field_validator

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file

VERSIONS_FILE = data_file("dynamo", "versions.yaml")
#: Where a team's repository keeps its own rows (beside its ``targets/``); they take precedence.
TEAM_VERSIONS = Path("dynamo") / "versions.yaml"


@dataclass(frozen=True)
class DynamoBehaviour:
    version: str
    public: bool
    mistral_v11_tool_calls_parsed: bool
    mistral_legacy_tool_calls_parsed: bool
    mistral_parser_v2: bool
    reasoning_split_needs_effort: bool
    source: str
    #: ``verified`` (observed: ``source`` names the transcripts) or ``estimate`` (inferred: ``source`` says from what)
    status: str = "estimate"
    guided_json_refused_keywords: tuple[str, ...] = ()
    reasoning_efforts: tuple[str, ...] = ()
    covers: tuple[str, ...] = ()
    #: How a deployment on public Dynamo 1.6.1 is made to behave as this version (real dynamo.vllm workers under
    #: ``--sim-engine vllm``): what the scripted model emits; empty for a version that runs as itself.
    emulation: dict[str, object] = field(default_factory=dict)
    #: The frontend honours the worker pin headers (``x-dynamo-worker-instance-id``, with
    #: ``x-dynamo-prefill-instance-id`` when disaggregated); optional in a row, absent = true (the answers'
    #: ``nvext.worker_id`` still says whether a pin was honoured).
    pins_workers: bool = True

    @property
    def verified(self) -> bool:
        return self.status == "verified"

    def describe(self) -> str:
        """The row in use, as summary.json and the Allure environment name it."""
        return f"{self.version} ({self.status}: {self.source})"


#: ``verified`` (observed: ``source`` names the transcripts) or ``estimate`` (inferred: ``source`` says from what).
Status = Literal["verified", "estimate"]
#: Schema members whose keys are names (of properties, definitions), not keywords.
NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
#: The tool parser whose behaviour the rows describe (``mistral_*`` fields).
ROW_PARSER = "mistral"
#: Mistral Large 4's own output (a version without an emulation row runs the model as it is).
OWN_OUTPUT: dict[str, object] = {"tool_form": "v11", "think_before_tool_call": True}


class Emulation(Strict):
    """How a deployment on public 1.6.1 is made to behave as the row's release: the tool-call form the model emits
    and whether it thinks before a tool call (1.6.1's reasoning parser swallows a call after ``[/THINK]``)."""

    tool_form: Literal["legacy", "v11"] | None = None
    think_before_tool_call: StrictBool | None = None


class DynamoRow(Strict):
    """One row of ``versions.yaml`` (its header comment says what each field means)."""

    status: Status
    public: StrictBool
    mistral_v11_tool_calls_parsed: StrictBool
    mistral_legacy_tool_calls_parsed: StrictBool
    mistral_parser_v2: StrictBool
    reasoning_split_needs_effort: StrictBool
    #: Which transcript verified the row, or what the estimate is inferred from.
    source: str
    guided_json_refused_keywords: list[StrictStr]
    reasoning_efforts: list[StrictStr]
    covers: list[str] = Field(default_factory=list)
    emulation: Emulation | None = None
    pins_workers: StrictBool = True

    @field_validator("source")
    @classmethod
    def _said(cls, value: str) -> str:
        said = " ".join(value.split())
        if not said:
            raise ValueError("must say which transcript verified the row or what the estimate is inferred from")
        return said

    def behaviour(self, version: str) -> DynamoBehaviour:
        fields = self.model_dump(exclude={"emulation", "covers", "guided_json_refused_keywords", "reasoning_efforts"})
        return DynamoBehaviour(version=version, **fields, covers=tuple(self.covers),
                               guided_json_refused_keywords=tuple(self.guided_json_refused_keywords),
                               reasoning_efforts=tuple(self.reasoning_efforts),
                               emulation=self.emulation.model_dump(exclude_unset=True) if self.emulation else {})


class DynamoTable(Strict):
    versions: dict[str, DynamoRow]


def model_output(version: str | None) -> dict[str, object]:
    """What the scripted model on a real 1.6.1 deployment emits for a target declaring ``version``: the row's
    ``emulation`` over Mistral Large 4's own output (unknown version or no emulation: the model's own)."""
    row = behaviour(version) if version else None
    return {**OWN_OUTPUT, **(row.emulation if row is not None else {})}


@lru_cache(maxsize=4)
def load_table(path: Path = VERSIONS_FILE) -> dict[str, DynamoBehaviour]:
    """The rows of a versions table (the package's or a team's); a bad one fails with file, line and field."""
    table = load_yaml(path, DynamoTable, "Dynamo versions table")
    return {version: row.behaviour(version) for version, row in table.versions.items()}


def team_file(root: Path | None) -> Path | None:
    """A team's own rows: ``dynamo/versions.yaml`` in its repository (the folder holding its ``targets/``)."""
    if root is None:
        return None
    path = Path(root) / TEAM_VERSIONS
    return path if path.is_file() and path.resolve() != VERSIONS_FILE.resolve() else None


def table(root: Path | None = None, path: Path = VERSIONS_FILE) -> dict[str, DynamoBehaviour]:
    """The package's rows with the team's (``root``/dynamo/versions.yaml) on top: a team row of the same release
    replaces the package's."""
    team = team_file(root)
    return {**load_table(path), **(load_table(team) if team is not None else {})}


def target_row(target: Any) -> DynamoBehaviour | None:
    """The row of the Dynamo release ``target`` declares (``serving.dynamo_version``), looked up in the package's
    and the team's tables (``target.root``); a release in neither gets an assumed ``estimate`` row
    (:func:`row_for`). None for a target not served by Dynamo or declaring no release."""
    from pytest_ml4.stacks import stack_for  # the registry imports this module

    return stack_for(target).release_row(target)  # type: ignore[no-any-return]


def behaviour(version: str, path: Path = VERSIONS_FILE, root: Path | None = None) -> DynamoBehaviour | None:
    """The row for ``version`` (exact key first, then a row whose ``covers`` pattern matches), the team's rows under
    ``root`` first; None if unknown."""
    rows = table(root, path)
    if version in rows:
        return rows[version]
    return next((row for row in rows.values() if any(fnmatch.fnmatchcase(version, c) for c in row.covers)), None)


def known_versions(path: Path = VERSIONS_FILE, root: Path | None = None) -> list[str]:
    return sorted(table(root, path))


def release_key(version: str) -> tuple[int, ...]:
    """The numeric release of a version or image tag (``1.7.0-mistral-large-4-dev.1`` -> (1, 7, 0))."""
    match = re.match(r"v?(\d+(?:\.\d+)*)", version)
    return tuple(int(x) for x in match.group(1).split(".")) if match else ()


def assumed_base(version: str, root: Path | None = None) -> tuple[DynamoBehaviour, str]:
    """The known row an unknown release is assumed to behave as, and why that one: the nearest lower release (a
    later release keeps what its predecessor parses until a transcript shows otherwise), else the lowest known."""
    rows = sorted(table(root).values(), key=lambda r: (release_key(r.version), r.version))
    key = release_key(version)
    lower = [r for r in rows if release_key(r.version) <= key]
    if lower:
        return lower[-1], "the nearest lower known release"
    return rows[0], "the lowest known release: none is lower"


def row_for(version: str, root: Path | None = None) -> DynamoBehaviour:
    """The row for ``version``; for a release in no table, the :func:`assumed_base` row's behaviour as an
    ``estimate`` that names what it is assumed from (summary.json and the Allure environment show it)."""
    known = behaviour(version, root=root)
    if known is not None:
        return known
    base, why = assumed_base(version, root)
    where = f"{TEAM_VERSIONS} of your repository" if root is not None else "a versions table"
    return replace(base, version=version, status="estimate", covers=(), emulation=dict(base.emulation),
                   source=f"assumed: {version} is in no versions table, taken to behave as {base.version} ({why}, "
                          f"{base.status}); add a row for it to {where} once observed")


def image_version(image: str | None) -> str | None:
    """The tag of a container image reference (``repo/name:TAG[@digest]``), or None when it has no tag."""
    if not image:
        return None
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def tool_call_drop_cause(version: str, parser: str | None = ROW_PARSER, root: Path | None = None) -> str | None:
    """Why no tool call comes back from a Dynamo ``version`` whose workers run the tool parser ``parser``
    (``--dyn-tool-call-parser``; the target's ``engine.tool_call_parser``), as far as the deployment's own
    configuration explains it; None where it does not (the row says the form is parsed, or the version is unknown:
    the check's generic hint then applies).

    The cause follows from what the deployment runs: a parser other than ``mistral`` does not read Mistral Large
    4's ``[TOOL_CALLS]`` output whatever the release; with ``mistral`` the version's row says whether the v11
    form is parsed."""
    if not parser:
        return ("the workers register no tool-call parser (engine.tool_call_parser unset: no "
                "--dyn-tool-call-parser), so Dynamo returns Mistral Large 4's [TOOL_CALLS] output as text")
    if parser != ROW_PARSER:
        return (f"the workers run the `{parser}` tool-call parser (engine.tool_call_parser / --dyn-tool-call-parser "
                f"{parser}), which does not read Mistral Large 4's [TOOL_CALLS] output; run "
                f"--dyn-tool-call-parser {ROW_PARSER}")
    row = behaviour(version, root=root)
    if row is None or row.mistral_v11_tool_calls_parsed:
        return None
    parsed = [v for v, r in table(root).items() if r.mistral_v11_tool_calls_parsed]
    return (f"Dynamo {version}'s `mistral` tool parser silently drops Mistral Large 4's "
            f"[TOOL_CALLS]name[ARGS]{{...}} form (no tool_calls; content null or the raw markup, finish_reason stop; "
            f"pytest_ml4/data/dynamo/versions.yaml mistral_v11_tool_calls_parsed: false, {row.status}); serve it with a "
            f"Dynamo that parses that form ({', '.join(parsed) or 'none known'})")


def _functions(tools: list[dict[str, object]]) -> list[tuple[str, dict[str, Any]]]:
    """``(name, function object)`` of each tool (``{"type": "function", "function": {...}}`` or the bare function)."""
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        out.append((str(fn.get("name", "?")), fn))  # type: ignore[union-attr]
    return out  # type: ignore[return-value]


def guided_json_refusal(version: str, tools: list[dict[str, object]],
                        root: Path | None = None) -> tuple[str, str] | None:
    """``(tool name, keyword)`` of the first tool whose parameter schema uses a keyword the version's guided-JSON
    grammar refuses (``guided_json_refused_keywords``), or None."""
    row = behaviour(version, root=root)
    if row is None or not row.guided_json_refused_keywords:
        return None
    for name, fn in _functions(tools):
        keyword = first_schema_keyword(fn.get("parameters"), row.guided_json_refused_keywords)
        if keyword is not None:
            return name, keyword
    return None


def refused_by_some_release(path: Path = VERSIONS_FILE) -> tuple[str, ...]:
    """Every schema keyword some row's guided-JSON grammar refuses: a tool using none of them lies within every
    known release's limits, so what a guided ``tool_choice`` does can be judged on it anywhere."""
    return tuple(sorted({k for row in load_table(path).values() for k in row.guided_json_refused_keywords}))


def within_every_release(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools whose parameter schemas use no keyword any release's grammar refuses."""
    refused = refused_by_some_release()
    return [t for t, (_, fn) in zip(tools, _functions(tools)) if first_schema_keyword(fn.get("parameters"), refused)
            is None]


def emulated_grammar_reason(declared: str, running: str | None, engine: str = "") -> str | None:
    """Why a run cannot judge whether the ``declared`` release accepts a schema under guided decoding: its workers
    are another release (``running``, real ``dynamo.vllm`` emulating the declared one) whose guided-JSON limits
    differ from the declared row's; None when the run's engine is the declared release's (or has its limits)."""
    if running is None or running == declared:
        return None
    want, have = behaviour(declared), behaviour(running)
    if want is None or have is None or want.guided_json_refused_keywords == have.guided_json_refused_keywords:
        return None
    return (f"the run's workers are dynamo.vllm {running}{engine} emulating Dynamo {declared}: their guided-JSON "
            f"grammar refuses {list(have.guided_json_refused_keywords) or 'no keyword'}, Dynamo {declared}'s row "
            f"({want.status}) {list(want.guided_json_refused_keywords) or 'no keyword'} (pytest_ml4/data/dynamo/versions.yaml "
            f"guided_json_refused_keywords), so whether {declared} accepts the tools' schemas cannot be seen on this "
            f"run; judge it against a {declared} deployment")


def guided_refusal_cause(version: str, tool_choice: object, tools: list[dict[str, object]],
                         logged: Callable[[], tuple[str, ...]] = tuple, root: Path | None = None) -> str | None:
    """The cause to name when a ``tool_choice`` required/named request failed on a release whose guided-JSON
    grammar refuses a keyword of the tools' schemas, or None (not a guided choice, no such keyword). ``logged``
    returns the keywords the engine log's ``Grammar error: Unimplemented keys`` line names: the log is the better
    witness (it also names a keyword the row does not know); without it the row names the keyword."""
    if not (tool_choice == "required" or isinstance(tool_choice, dict)):
        return None
    if isinstance(tool_choice, dict):
        # A named choice puts only that tool's parameters into the grammar (real-dynamo-vllm.md).
        chosen = (tool_choice.get("function") or {}).get("name")
        tools = [t for t in tools if (t.get("function") or {}).get("name") == chosen]  # type: ignore[union-attr]
    refusal = guided_json_refusal(version, tools, root)
    keys = logged()
    if keys:
        tool = next((name for name, fn in _functions(tools) if first_schema_keyword(fn.get("parameters"), keys)),
                    refusal[0] if refusal else "?")
        keyword = keys[0]
    elif refusal is not None:
        tool, keyword = refusal
    else:
        return None
    seen = (f"engine log: 'Grammar error: Unimplemented keys: {list(keys)}'" if keys else
            f"pytest_ml4/data/dynamo/versions.yaml guided_json_refused_keywords of {version}; the engine log showed no "
            f"grammar error")
    return (f"cause: Dynamo {version} passes the raw tool schemas into the guided-JSON grammar of tool_choice "
            f"{tool_choice!r}, and its grammar backend refuses the keyword `{keyword}` (tool "
            f"{tool}; {seen}): the deployment fails every client that sends such a schema with a guided tool choice "
            f"(HTTP 400 Bad Request, or in a stream the in-band 'Invalid request' with no usage chunk); drop the "
            f"keyword from the schema or serve a release whose grammar implements it")


def first_schema_keyword(schema: object, keywords: tuple[str, ...]) -> str | None:
    """The first of ``keywords`` used anywhere in a JSON schema (as a key of a schema object), or None. The keys
    of ``properties``/``$defs`` maps are names, not keywords: only their values are searched."""
    if isinstance(schema, list):
        return next((k for k in (first_schema_keyword(i, keywords) for i in schema) if k is not None), None)
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        if key in keywords:
            return str(key)
        children = list(value.values()) if key in NAME_MAPS and isinstance(value, dict) else [value]
        found = first_schema_keyword(children, keywords)
        if found is not None:
            return found
    return None
