"""The suites' data files as typed models, read once: a bad file fails with one line naming file, field and line.

``smoke/smoke.yaml``, ``prompts/tools.yaml``, ``prompts/reasoning.yaml`` and ``prompts/replicas.yaml`` (under
``pytest_ml4/data/``) feed the smoke, tools, reasoning and replicas suites; each loads into its model here, so a suite reads ``SMOKE.question.prompt``
rather than ``DATA["question"]["prompt"]`` and a renamed or mistyped field stops collection with its place in
the file. The per-stack error rows keep their own format and reader (:mod:`pytest_ml4.checks.expected`): here
they are a :class:`StackAnswers`, the table with the file it came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, PositiveInt

from pytest_ml4.checks.expected import Expected, expected_for
from pytest_ml4.datafile import DataFileError, Strict, load_yaml
from pytest_ml4.locations import data_file

SMOKE_FILE = data_file("smoke", "smoke.yaml")
TOOLS_FILE = data_file("prompts", "tools.yaml")
REASONING_FILE = data_file("prompts", "reasoning.yaml")
REPLICAS_FILE = data_file("prompts", "replicas.yaml")


#: A suite data file that does not parse or does not fit its model (one line: file, line, field).
SuiteDataError = DataFileError
_Data = Strict


@dataclass(frozen=True)
class StackAnswers:
    """What each serving stack answers to each bad request (rows in :mod:`pytest_ml4.checks.expected`'s format)."""

    rows: Mapping[str, Any]
    source: Path

    def expected(self, stack: str, case: str) -> Expected:
        return expected_for(self.rows, stack, case, self.source)


# --- smoke.yaml


class KnownQuestion(_Data):
    prompt: str
    expect_substring: str
    max_tokens: PositiveInt = 1024


class Burst(_Data):
    requests: PositiveInt
    prompt: str
    expect_substring: str


class SmokeData(_Data):
    question: KnownQuestion
    burst: Burst
    errors: dict[str, dict[str, Any]]

    def answers(self) -> StackAnswers:
        return StackAnswers(self.errors, SMOKE_FILE)


# --- tools.yaml


class ToolCase(_Data):
    """One auto tool-choice question: the tool it must call and top-level argument values that come back verbatim."""

    prompt: str
    expect_tool: str
    expect_args: dict[str, Any] | None = None


class ToolChoiceCase(_Data):
    prompt: str
    expect_tool: str
    unmatched_prompt: str


class ParallelCase(_Data):
    prompt: str
    tools: list[str]
    expect_tool: str
    expect_calls: PositiveInt
    expect_values: list[str]


class RoundTripCase(_Data):
    prompt: str
    tools: list[str]
    results: dict[str, str]
    expect_in_answer: list[str]


class ErrorCases(_Data):
    """Bad requests (``cases``: the body fields each adds) and each stack's answer to them (``expect``)."""

    cases: dict[str, dict[str, Any]]
    expect: dict[str, dict[str, Any]]


class ToolsData(_Data):
    defaults: dict[str, Any]
    toolset: list[str]
    cases: dict[str, ToolCase]
    tool_choice: ToolChoiceCase
    parallel: ParallelCase
    round_trip: RoundTripCase
    errors: ErrorCases
    conventions: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def answers(self) -> StackAnswers:
        return StackAnswers(self.errors.expect, TOOLS_FILE)


# --- reasoning.yaml


class ShareSpec(_Data):
    prompts: list[str]
    max_tokens: PositiveInt
    tolerance: float = Field(gt=0, lt=1)


class SeedShareSpec(_Data):
    prompts: list[str]
    output_tokens: PositiveInt


class ReasoningData(_Data):
    defaults: dict[str, Any]
    question: KnownQuestion
    effort_when_required: str
    efforts: list[str]
    errors: ErrorCases
    share: ShareSpec
    seed_share: SeedShareSpec

    def answers(self) -> StackAnswers:
        return StackAnswers(self.errors.expect, REASONING_FILE)


# --- replicas.yaml


class ReplicasData(_Data):
    """Which of the tools and reasoning suites' questions each worker is asked (``tool_choices`` of tools.yaml's
    ``tool_choice``, its ``parallel`` case, reasoning.yaml's question at ``reasoning_effort``), the fixed length,
    and how many unpinned rounds may pass before a worker no answer came from is reported."""

    tool_choices: list[Literal["none", "auto", "required", "named"]]
    parallel: bool
    reasoning_effort: str
    fixed_length_tokens: PositiveInt
    fixed_length_prompt: str
    unpinned_rounds_per_worker: PositiveInt


# --- loading

M = TypeVar("M", bound=BaseModel)


def load_suite_data(path: Path, model: type[M]) -> M:
    """``path`` as ``model`` through the one data-file loader: a bad file is one line naming file, line and field."""
    return load_yaml(path, model)


@cache
def smoke_data() -> SmokeData:
    return load_suite_data(SMOKE_FILE, SmokeData)


@cache
def tools_data() -> ToolsData:
    return load_suite_data(TOOLS_FILE, ToolsData)


@cache
def reasoning_data() -> ReasoningData:
    return load_suite_data(REASONING_FILE, ReasoningData)


@cache
def replicas_data() -> ReplicasData:
    return load_suite_data(REPLICAS_FILE, ReplicasData)
