"""Reasoning checks (reference ``vllm.md`` §2, §3): the thinking is in ``reasoning`` (or the legacy
``reasoning_content``), never in ``content``; ``usage.completion_tokens_details.reasoning_tokens`` agrees with
the reasoning text re-tokenised by the same Tekken tokenizer the simulator uses; each effort the stack accepts is
honoured and the others refused; the reasoning share of the output is measured and judged against the
deployment's baseline or seed 000's figure (50-68 %).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import field_validator

from pytest_ml4.checks.chat import (
    Answer,
    BadRequest,
    ChatSession,
    attach,
    send_raw,
    user,
)
from pytest_ml4.checks.codes import fail, fails_with, require
from pytest_ml4.checks.expected import assert_answer_expected, assert_served
from pytest_ml4.checks.protocol import assert_no_control_tokens, assert_rejected
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.client.endpoint import quote_body
from pytest_ml4.evidence.recount import LOCAL_SLACK_FRACTION, TokenCounter
from pytest_ml4.stacks import stack_for
from pytest_ml4.stacks.dynamo_versions import target_row
from pytest_ml4.stacks.vllm_versions import for_version
from pytest_ml4.target.baselines import (
    BaselineFile,
    BaselineRefused,
    Provenance,
    conditions_differ,
    describe_conditions,
    read_baseline,
    refusal_line,
    write_baseline,
)
from pytest_ml4.target.model import Target

if TYPE_CHECKING:
    from pytest_ml4.checks.suite_data import StackAnswers
    from pytest_ml4.client.deployment import Deployment

#: Tokens by which the reasoning count may differ from a re-tokenisation: a real parser counts the text
#: between the markers as the engine emitted it, which can split differently at the edges (a leading space,
#: stripped trailing whitespace), and speculative decoding may merge a boundary token.
REASONING_TOKEN_SLACK = 3
#: Relative slack for long reasoning: the deployed checkpoint's tekken.json may split some words differently
#: from mistral-common's bundled vocabulary used for the re-count; a missing count (0) is caught regardless.
REASONING_TOKEN_SLACK_FRACTION = LOCAL_SLACK_FRACTION

#: Reasoning efforts vLLM 0.33 accepts with a Mistral tokenizer (``ReasoningEffort``, vllm.md §3.1).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def count_tokens(text: str, tokenizer_version: int) -> int:
    """Tekken token count of ``text`` with the tokenizer the simulator serves (mistral-common's v13/v15 Tekken)."""
    from pytest_ml4.evidence.tokenizer import get_tokenizer

    return get_tokenizer(tokenizer_version).count(text) if text else 0


def reasoning_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens``, or None when the field is absent."""
    details = (usage or {}).get("completion_tokens_details") or {}
    value = details.get("reasoning_tokens")
    return int(value) if isinstance(value, (int, float)) else None


@fails_with("reasoning.markup_in_content",
            "the reasoning markup ([THINK]) leaked into content: the reasoning parser is off")
@fails_with("reasoning.not_separated", "no reasoning field although the model reasons by default")
@fails_with("reasoning.repeated_in_content", "the reasoning text is repeated in content")
def assert_reasoning_separated(message: Mapping[str, Any], where: str) -> str:
    """There is reasoning, it sits in the reasoning field, and content carries the answer only. Returns it."""
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    content = message.get("content") or ""
    for marker in ("[THINK]", "[/THINK]"):
        if marker in content:
            fail("reasoning.markup_in_content", f"{where}: reasoning parser off: {marker!r} leaked into content: "
                                                f"{quote_body(content)}")
    require(reasoning, "reasoning.not_separated",
            lambda: f"{where}: no reasoning field although the model reasons by default (reasoning parser not "
                    f"configured?); content: {quote_body(content)}")
    # A long reasoning repeated verbatim in content means the parser copied instead of splitting; short ones
    # ("4.") may legitimately recur in an answer.
    if len(reasoning.strip()) >= 40:
        require(reasoning.strip() not in content, "reasoning.repeated_in_content",
                lambda: f"{where}: the reasoning text is repeated in content: {quote_body(content)}")
    return reasoning


@fails_with("reasoning.usage_no_field", "usage has no completion_tokens_details.reasoning_tokens")
@fails_with("reasoning.usage_missing", "usage reports 0 reasoning tokens for an answer that reasoned")
@fails_with("reasoning.usage_disagrees", "usage's reasoning_tokens disagree with the reasoning text re-tokenised")
@fails_with("reasoning.usage_over_completion", "reasoning_tokens exceed completion_tokens")
def assert_reasoning_tokens_agree(reasoning: str, usage: Mapping[str, Any] | None,
                                  counter: int | TokenCounter, where: str) -> int:
    """``reasoning_tokens`` in usage matches the reasoning text's token count within a few tokens. ``counter``:
    the deployment's re-counter (:func:`pytest_ml4.evidence.recount.counter_for`), or a Tekken version to count locally."""
    reported = reasoning_tokens(usage)
    require(reported is not None, "reasoning.usage_no_field",
            lambda: f"{where}: usage has no completion_tokens_details.reasoning_tokens "
                    f"(reasoning parser not configured on the server?): {usage}")
    if isinstance(counter, int):
        counter = TokenCounter(None, counter)
    seen = counter.count(reasoning)
    slack = counter.slack(seen, REASONING_TOKEN_SLACK)
    if seen and reported == 0:
        fail("reasoning.usage_missing",
             f"{where}: reasoning tokens missing from usage: reasoning_tokens is 0 but the "
                             f"reasoning re-tokenises to {seen} tokens")
    require(abs(reported - seen) <= slack, "reasoning.usage_disagrees",
            lambda: f"{where}: usage reports {reported} reasoning tokens but the reasoning "
                    f"re-tokenises to {seen} (allowed difference {slack}; "
                    f"{counter.describe()})")
    completion = (usage or {}).get("completion_tokens")
    if isinstance(completion, int):
        require(reported <= completion, "reasoning.usage_over_completion",
                lambda: f"{where}: reasoning_tokens {reported} > completion_tokens {completion}")
    return reported


def defaults_for(target: Target, defaults: Mapping[str, Any], effort_when_required: str) -> dict[str, Any]:
    """The request defaults; on a Dynamo release that splits reasoning only for requests naming an effort
    (``reasoning_split_needs_effort``), every question names ``effort_when_required``, as its clients must."""
    row = target_row(target)
    if row is not None and row.reasoning_split_needs_effort:
        return {**defaults, "reasoning_effort": effort_when_required}
    return dict(defaults)


def accepted_efforts(target: Target) -> tuple[str, ...]:
    """The efforts the endpoint serves: through Dynamo the frontend's (its row; no vLLM-side check applies),
    else the engine's vLLM version's (``pytest_ml4/data/vllm/versions.yaml``)."""
    row = target_row(target)
    return row.reasoning_efforts if row is not None else tuple(for_version(target.engine.version).reasoning_efforts)


@fails_with("reasoning.wrong_answer", "a reasoned answer does not hold the known answer")
def assert_right_answer(answer: Answer, expect_substring: str, where: str | None = None,
                        at: str = "in content") -> None:
    """The answer (content, not reasoning) holds the known answer to the question."""
    require(expect_substring in answer.content, "reasoning.wrong_answer",
            lambda: f"{where or answer.where}: wrong answer {at}: "
                    f"{answer.content!r}")


@fails_with("reasoning.finish_reason", "a reasoned answer did not finish with stop")
def assert_reasoned_answer(answer: Answer, expect_substring: str) -> None:
    """No control token, the reasoning apart from the content, the right answer, ``stop``."""
    assert_no_control_tokens(answer.message, answer.where)
    assert_reasoning_separated(answer.message, answer.where)
    assert_right_answer(answer, expect_substring)
    require(answer.finish_reason == "stop", "reasoning.finish_reason",
            lambda: f"{answer.where}: finish_reason {answer.finish_reason!r}")


def assert_effort_refused(ml4: Deployment, prompt: str, *, effort: str, stream: bool) -> None:
    """An effort the endpoint does not accept gets vLLM's 400 naming it."""
    body = {"model": ml4.model, "messages": user(prompt), "max_tokens": 64, "reasoning_effort": effort}
    assert_rejected(send_raw(ml4.http, body, stream), 400, f"reasoning_effort={effort} is not supported",
                    f"reasoning_effort={effort!r} on vLLM {ml4.target.engine.version}")


@fails_with("reasoning.effort_none_reasoned", "reasoning_effort none still produced reasoning")
@fails_with("reasoning.effort_none_usage", "reasoning_effort none, yet usage reports reasoning tokens")
def assert_effort_honoured(answer: Answer, effort: str, expect_substring: str,
                           counter: int | TokenCounter) -> None:
    """The right answer at ``effort``; ``none`` reasons not at all (no text, no reasoning tokens), the others
    keep their reasoning apart and count it in usage."""
    assert_no_control_tokens(answer.message, answer.where)
    assert_right_answer(answer, expect_substring, at=f"at effort {effort}")
    if effort == "none":
        require(not answer.reasoning, "reasoning.effort_none_reasoned",
                lambda: f"{answer.where}: reasoning_effort none still produced reasoning: {answer.reasoning!r}")
        require(not reasoning_tokens(answer.usage), "reasoning.effort_none_usage",
                lambda: f"{answer.where}: reasoning_effort none but usage reports "
                        f"{reasoning_tokens(answer.usage)} reasoning tokens")
    else:
        reasoning = assert_reasoning_separated(answer.message, f"{answer.where}, effort {effort}")
        assert_reasoning_tokens_agree(reasoning, answer.usage, counter, f"{answer.where}, effort {effort}")


#: The efforts compared: OpenAI's low and high, which every effort-capable server and OpenAI-schema gateway carries.
#: Mistral's own ``max`` and ``xhigh`` are judged by test_each_reasoning_effort_is_accepted: a gateway that drops
#: them fails there, not here.
EFFORT_CONTRAST = ("low", "high")


def effort_contrast(target: Target) -> tuple[str, str] | None:
    """The lower and the higher effort compared (``EFFORT_CONTRAST``), or None when the endpoint does not serve
    both."""
    served = accepted_efforts(target)
    return EFFORT_CONTRAST if all(e in served for e in EFFORT_CONTRAST) else None


@fails_with("reasoning.effort_has_no_effect",
            "the same question at a higher reasoning_effort did not think longer than at a lower one")
def assert_higher_effort_thinks_longer(lower: Answer, higher: Answer, efforts: tuple[str, str],
                                       counter: TokenCounter) -> None:
    """``reasoning_effort`` reaches the model: the higher effort's reasoning is longer, in tokens, than the lower's.
    Accepted is not honoured: vLLM hands the effort to Mistral tokenizers from v15 only (vllm.md §3.1), and a
    proxy or client that drops the field leaves every effort at the model's default. No reasoning field at either
    effort leaves nothing to compare (test_reasoning_is_separated_from_content judges the split)."""
    if not lower.reasoning and not higher.reasoning:
        not_judged(f"{higher.where}: no reasoning field at reasoning_effort {efforts[0]!r} nor {efforts[1]!r}: "
                   "no thinking to compare")
    low, high = counter.count(lower.reasoning), counter.count(higher.reasoning)
    require(high > low, "reasoning.effort_has_no_effect",
            lambda: f"{higher.where}: reasoning_effort {efforts[1]!r} thought {high} tokens, {efforts[0]!r} {low}: "
                    f"the effort does not reach the model ({counter.describe()})")


def assert_invalid_request_answered(ml4: Deployment, request: BadRequest, answers: StackAnswers) -> None:
    """The stack answers as its row of ``answers`` says; where it accepts the request, it serves it (a stream
    failing after its 200 is not served)."""
    expected = answers.expected(stack_for(ml4.target).name, request.case)
    answer = send_raw(ml4.http, request.body, request.stream)
    assert_answer_expected(answer, expected, request.what)
    if expected.accepted:
        assert_served(answer, request.what)


def reasoning_share(usage: Mapping[str, Any] | None) -> float | None:
    """reasoning_tokens / completion_tokens, or None when either is missing or zero."""
    r = reasoning_tokens(usage)
    total = (usage or {}).get("completion_tokens")
    if r is None or not isinstance(total, int) or total <= 0:
        return None
    return r / total


# ------------------------------------------------------------------------ reasoning share vs a stored baseline
#: What a reasoning share depends on besides the deployment: a share is compared only with one measured under the
#: same values (pytest_ml4/data/prompts/reasoning.yaml ``share``; the request defaults).
SHARE_CONDITION_KEYS = ("prompts", "max_tokens", "min_tokens", "reasoning_effort", "temperature")


def cut_inside_reasoning(finish_reason: str | None, content: str | None) -> bool:
    """An answer that hit ``max_tokens`` before ``[/THINK]``: the parser gives all of it as reasoning and no
    content. Its share measures the cap, not the deployment."""
    return finish_reason == "length" and not (content or "").strip()


@fails_with("reasoning.share_unmeasurable",
            "the reasoning share cannot be measured: usage lacks reasoning_tokens or completion_tokens")
def share_row(prompt: str, usage: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """One measured prompt: tokens and share; AssertionError naming what usage lacks."""
    share = reasoning_share(usage)
    require(share is not None, "reasoning.share_unmeasurable",
            lambda: f"{where}: cannot measure the reasoning share: usage lacks reasoning_tokens or "
                    f"completion_tokens (reasoning parser not configured?): {usage}")
    return {"prompt": prompt, "completion_tokens": (usage or {})["completion_tokens"],
            "reasoning_tokens": reasoning_tokens(usage), "share": round(share, 4)}


def share_conditions(chat: ChatSession, prompts: Sequence[str], max_tokens: int,
                     min_tokens: int | None) -> dict[str, Any]:
    """What a share depends on besides the deployment (``SHARE_CONDITION_KEYS``), as this run asks it."""
    return {"prompts": list(prompts), "max_tokens": max_tokens, "min_tokens": min_tokens,
            "reasoning_effort": chat.defaults.get("reasoning_effort"), "temperature": chat.defaults.get("temperature")}


@fails_with("reasoning.share_no_answer", "a share prompt got no answer after its reasoning")
def measure_share(chat: ChatSession, prompts: Sequence[str], stream: bool, source: str,
                  **limits: int) -> list[dict[str, Any]]:
    """One row per prompt. A natural answer must reason, keep it apart and answer after it; one cut inside its
    reasoning at ``max_tokens`` (forced length or not) is not judged as a share: it measures the cap. ``source``
    names the prompts' file."""
    rows = []
    for prompt in prompts:
        answer = chat.ask(chat.body(user(prompt), **limits), stream)
        assert_no_control_tokens(answer.message, answer.where)
        if cut_inside_reasoning(answer.finish_reason, answer.content):
            not_judged(f"{answer.where}: truncated: the answer hit max_tokens {limits['max_tokens']} inside its "
                       f"reasoning (finish_reason length before [/THINK], {reasoning_tokens(answer.usage)} "
                       f"reasoning tokens), so its share measures the cap, not the deployment ({source})")
        assert_reasoning_separated(answer.message, answer.where)
        if "min_tokens" not in limits and not (answer.content.strip() and answer.finish_reason == "stop"):
            fail("reasoning.share_no_answer", f"{answer.where}: no answer after the reasoning: finish_reason "
                                              f"{answer.finish_reason!r}, content {answer.content!r}")
        rows.append(share_row(prompt, answer.usage, answer.where))
    return rows


def report_share(rows: list[dict[str, Any]], conditions: dict[str, Any], out: Path, extra: dict[str, Any],
                 record_property: Callable[[str, Any], None]) -> float:
    """Write, print, attach and record the shares with the conditions they were measured under; returns the mean."""
    mean = sum(r["share"] for r in rows) / len(rows)
    out.write_text(json.dumps({"mean_share": round(mean, 4), "conditions": conditions, **extra, "rows": rows},
                              indent=1))
    print(f"reasoning share: mean {mean:.1%} over {len(rows)} answers (" + describe_conditions(
        conditions, ("max_tokens", "min_tokens", "reasoning_effort")) + "): "
        + ", ".join(f"{r['share']:.1%}" for r in rows))
    record_property("reasoning_share", {"value": round(mean, 4), "conditions": conditions})
    attach(out)
    return mean


class ShareBaselineFile(BaselineFile):
    """A reasoning-share baseline file: ``figures`` maps each prompt to its share, ``tolerances.share`` is the
    absolute tolerance."""

    figures: dict[str, float]

    @field_validator("tolerances")
    @classmethod
    def _share_tolerance(cls, value: dict[str, float]) -> dict[str, float]:
        if "share" not in value:
            raise ValueError("needs 'share', the absolute tolerance of a prompt's share")
        return value


@dataclass(frozen=True)
class ShareBaseline:
    """``pytest_ml4/data/baselines/reasoning-share-<target>.json``: per-prompt shares, the conditions they were measured
    under and where they came from (:mod:`pytest_ml4.target.baselines`)."""

    path: Path
    provenance: Provenance
    conditions: Mapping[str, Any]
    tolerance: float
    shares: Mapping[str, float]

    @classmethod
    def load(cls, path: Path) -> ShareBaseline:
        """The one baseline format, kind ``reasoning-share``: ``figures`` maps each prompt to its share,
        ``tolerances.share`` is the absolute tolerance."""
        stored = read_baseline(path, "reasoning-share", ShareBaselineFile)
        return cls(path, stored.provenance.view(), stored.conditions, stored.tolerances["share"], stored.figures)


def save_share_baseline(path: Path, rows: list[Mapping[str, Any]], conditions: Mapping[str, Any],
                        provenance: Mapping[str, Any], tolerance: float) -> Path:
    """Write the measured shares as a baseline (``--reasoning-share-save``); the target is the deployment the
    provenance names."""
    return write_baseline(path, "reasoning-share", str(provenance.get("deployment", "")), provenance, conditions, {"share": tolerance},
                          {r["prompt"]: r["share"] for r in rows})


def share_baseline_drift(rows: list[Mapping[str, Any]], baseline: ShareBaseline, conditions: Mapping[str, Any],
                         source: str) -> list[str]:
    """Each measured prompt's reasoning share against the baseline's.

    Raises :class:`BaselineRefused` (one line) when the baseline was measured under other conditions (a share is
    comparable only for the same prompts, length and effort); otherwise one problem line per prompt whose share
    moved more than the baseline's ``tolerance`` (absolute) or that the baseline lacks."""
    differ = conditions_differ(baseline.conditions, conditions, SHARE_CONDITION_KEYS)
    if differ:
        raise BaselineRefused(refusal_line("reasoning share", source, differ))
    problems = []
    for row in rows:
        base = baseline.shares.get(row["prompt"])
        if base is None:
            problems.append(f"{source}: no baseline share for prompt {row['prompt']!r}")
        elif abs(row["share"] - base) > baseline.tolerance:
            problems.append(f"prompt {row['prompt']!r}: reasoning share {row['share']:.1%}, baseline {base:.1%} "
                            f"(tolerance {baseline.tolerance:.0%}, {source})")
    return problems


@dataclass(frozen=True)
class ShareBaselineChoice:
    """The baseline that judges this run's reasoning share, or why none does (``refused``: one line); what the
    run asked for (``save``: where to write this run's shares; ``explicit``: the baseline was named) and the
    command that records one (the plugin's ``ml4_share_baseline``)."""

    baseline: ShareBaseline | None
    not_judged: str = ""
    refused: str = ""
    save: Path | None = None
    explicit: bool = False
    record: str = ""
    #: ``--ml4-record-baselines``: this run writes the baseline (``save``) and compares with none.
    recording: bool = False


def save_share_if_asked(choice: ShareBaselineChoice, rows: list[Mapping[str, Any]], conditions: Mapping[str, Any],
                        provenance: Mapping[str, Any], tolerance: float) -> None:
    """Write the shares as the baseline the run was asked to save (``choice.save``), with their provenance."""
    if choice.save is not None:
        save_share_baseline(choice.save, rows, conditions, provenance, tolerance)


@fails_with("reasoning.share_drift", "the reasoning share moved from the stored baseline")
def assert_share_within_baseline(rows: list[Mapping[str, Any]], conditions: Mapping[str, Any],
                                 choice: ShareBaselineChoice) -> None:
    """Each prompt's share stays within the tolerance of the deployment's baseline (passes as recorded while
    ``--ml4-record-baselines`` writes it). Not judged without one or with one of other conditions that was not named; :class:`BaselineRefused` for a baseline that cannot judge
    this run (refused when chosen, or named and of other conditions)."""
    if choice.refused:
        raise BaselineRefused(choice.refused)
    if choice.recording:   # passes as recorded: the shares just measured are the baseline the next run judges by
        print(f"reasoning share: recording this deployment's baseline {choice.save} (the non-streamed answers); "
              f"the next run judges against it")
        return
    base = choice.baseline
    if base is None:
        shares = ", ".join(f"{r['share']:.1%}" for r in rows)
        not_judged(f"reasoning share {shares}: {choice.not_judged}")
    try:
        drift = share_baseline_drift(rows, base, conditions, str(base.path))
    except BaselineRefused as err:   # measured under other conditions
        if choice.explicit:
            raise
        not_judged(f"{err}; record one under these conditions with: {choice.record}")
    require(not drift, "reasoning.share_drift",
            lambda: "reasoning share moved from the baseline:\n" + "\n".join(drift))


#: Token rounding when comparing a measured share with the gate band (shares are ratios of small integers).
SHARE_TOLERANCE = 0.02


@fails_with("reasoning.share_outside_seed_band",
            "the reasoning share at the seed's conditions lies outside the seed's band")
def assert_share_in_seed_band(mean: float, band: Sequence[float] | None, n: int, rows: list[Mapping[str, Any]],
                              target_name: str) -> None:
    """At seed 000's forced length the mean share is within the target's seed figure (``gates.reasoning_share``);
    not judged where the target states none."""
    if not band:
        not_judged(f"reasoning share {mean:.1%} at {n} forced tokens: {target_name} states no seed figure "
                   "(gates.reasoning_share) to compare it with")
    lo, hi = band
    require(lo - SHARE_TOLERANCE <= mean <= hi + SHARE_TOLERANCE, "reasoning.share_outside_seed_band",
            lambda: f"reasoning share {mean:.1%} at min_tokens = max_tokens = {n} outside seed 000's {lo:.0%}-{hi:.0%} "
                    f"(gates.reasoning_share): {rows}")
