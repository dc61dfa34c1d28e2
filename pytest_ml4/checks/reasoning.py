"""Reasoning checks (reference ``vllm.md`` §2, §3): the thinking is in ``reasoning`` (or the legacy
``reasoning_content``), never in ``content``; ``usage.completion_tokens_details.reasoning_tokens`` agrees with
the reasoning text re-tokenised by the same Tekken tokenizer the simulator uses; the reasoning share of the
output is measured (seed 000 saw 50-68 %).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_ml4.baselines import (
    BaselineRefused,
    Provenance,
    conditions_differ,
    read_baseline,
    refusal_line,
    write_baseline,
)
from pytest_ml4.client import quote_body
from pytest_ml4.recount import LOCAL_SLACK_FRACTION, TokenCounter

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
    from pytest_ml4.tokenizer import get_tokenizer

    return get_tokenizer(tokenizer_version).count(text) if text else 0


def reasoning_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens``, or None when the field is absent."""
    details = (usage or {}).get("completion_tokens_details") or {}
    value = details.get("reasoning_tokens")
    return int(value) if isinstance(value, (int, float)) else None


def assert_reasoning_separated(message: Mapping[str, Any], where: str) -> str:
    """There is reasoning, it sits in the reasoning field, and content carries the answer only. Returns it."""
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    content = message.get("content") or ""
    for marker in ("[THINK]", "[/THINK]"):
        assert marker not in content, (f"{where}: reasoning parser off: {marker!r} leaked into content: "
                                       f"{quote_body(content)}")
    assert reasoning, (f"{where}: no reasoning field although the model reasons by default (reasoning parser not "
                       f"configured?); content: {quote_body(content)}")
    # A long reasoning repeated verbatim in content means the parser copied instead of splitting; short ones
    # ("4.") may legitimately recur in an answer.
    if len(reasoning.strip()) >= 40:
        assert reasoning.strip() not in content, f"{where}: the reasoning text is repeated in content: {quote_body(content)}"
    return reasoning


def assert_reasoning_tokens_agree(reasoning: str, usage: Mapping[str, Any] | None,
                                  counter: int | TokenCounter, where: str) -> int:
    """``reasoning_tokens`` in usage matches the reasoning text's token count within a few tokens. ``counter``:
    the deployment's re-counter (:func:`pytest_ml4.recount.counter_for`), or a Tekken version to count locally."""
    reported = reasoning_tokens(usage)
    assert reported is not None, (f"{where}: usage has no completion_tokens_details.reasoning_tokens "
                                  f"(reasoning parser not configured on the server?): {usage}")
    if isinstance(counter, int):
        counter = TokenCounter(None, counter)
    seen = counter.count(reasoning)
    slack = counter.slack(seen, REASONING_TOKEN_SLACK)
    if seen and reported == 0:
        raise AssertionError(f"{where}: reasoning tokens missing from usage: reasoning_tokens is 0 but the "
                             f"reasoning re-tokenises to {seen} tokens")
    assert abs(reported - seen) <= slack, (f"{where}: usage reports {reported} reasoning tokens but the reasoning "
                                           f"re-tokenises to {seen} (allowed difference {slack}; "
                                           f"{counter.describe()})")
    completion = (usage or {}).get("completion_tokens")
    if isinstance(completion, int):
        assert reported <= completion, f"{where}: reasoning_tokens {reported} > completion_tokens {completion}"
    return reported


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


def share_row(prompt: str, usage: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """One measured prompt: tokens and share; AssertionError naming what usage lacks."""
    share = reasoning_share(usage)
    assert share is not None, (f"{where}: cannot measure the reasoning share: usage lacks reasoning_tokens or "
                               f"completion_tokens (reasoning parser not configured?): {usage}")
    return {"prompt": prompt, "completion_tokens": (usage or {})["completion_tokens"],
            "reasoning_tokens": reasoning_tokens(usage), "share": round(share, 4)}


@dataclass(frozen=True)
class ShareBaseline:
    """``pytest_ml4/data/baselines/reasoning-share-<target>.json``: per-prompt shares, the conditions they were measured
    under and where they came from (:mod:`pytest_ml4.baselines`)."""

    path: Path
    provenance: Provenance
    conditions: Mapping[str, Any]
    tolerance: float
    shares: Mapping[str, float]

    @classmethod
    def load(cls, path: Path) -> ShareBaseline:
        """The one baseline format, kind ``reasoning-share``: ``figures`` maps each prompt to its share,
        ``tolerances.share`` is the absolute tolerance."""
        stored = read_baseline(path, "reasoning-share")
        try:
            return cls(path, stored.provenance, stored.conditions, stored.tolerances["share"],
                       {str(k): float(v) for k, v in stored.figures.items()})
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise BaselineRefused(f"reasoning-share baseline {path} is unreadable: {err!r} (needs tolerances.share "
                                  "and figures mapping prompts to shares)") from None


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
