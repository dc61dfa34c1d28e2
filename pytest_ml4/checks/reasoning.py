"""Reasoning checks (reference ``vllm.md`` §2, §3): the thinking is in ``reasoning`` (or the legacy
``reasoning_content``), never in ``content``; ``usage.completion_tokens_details.reasoning_tokens`` agrees with
the reasoning text re-tokenised by the same Tekken tokenizer the simulator uses; the reasoning share of the
output is measured (seed 000 saw 50-68 %).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
def share_baseline_drift(rows: list[Mapping[str, Any]], baseline: Mapping[str, Any], output_tokens: int,
                         source: str) -> list[str]:
    """Each measured prompt's reasoning share against the baseline's (``fixtures/baselines/reasoning-share-*.json``).

    Returns one problem line per prompt whose share moved more than the baseline's ``tolerance`` (absolute), whose
    baseline is missing, or all prompts when the baseline was measured at another output length (a share is only
    comparable at the same fixed length)."""
    if int(baseline.get("output_tokens", -1)) != output_tokens:
        return [f"{source}: measured at output_tokens {baseline.get('output_tokens')}, this run uses {output_tokens}"]
    tol = float(baseline["tolerance"])
    shares = baseline["shares"]
    problems = []
    for row in rows:
        base = shares.get(row["prompt"])
        if base is None:
            problems.append(f"{source}: no baseline share for prompt {row['prompt']!r}")
        elif abs(row["share"] - float(base)) > tol:
            problems.append(f"prompt {row['prompt']!r}: reasoning share {row['share']:.1%}, baseline {float(base):.1%} "
                            f"(tolerance {tol:.0%}, {source})")
    return problems
