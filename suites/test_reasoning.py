"""Reasoning through the Mistral reasoning parser (reference vllm.md §2, §3, §3.1).

Every check runs non-streamed (openai SDK) and streamed (stream probe, grammar checked); streamed answers must
assemble to exactly the non-streamed one. Reasoning may arrive as ``reasoning`` (vLLM >= 0.16) or the legacy
``reasoning_content`` (<= 0.15); both are accepted, neither counted twice. Data: ``pytest_ml4/data/prompts/reasoning.yaml``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from pytest_ml4.baselines import (
    BaselineRefused,
    deployment_provenance,
    describe_conditions,
)
from pytest_ml4.checks.chat import ChatSession, attach, send_raw, user
from pytest_ml4.checks.expected import (
    assert_answer_expected,
    assert_served,
    expected_for,
)
from pytest_ml4.checks.protocol import assert_no_control_tokens, assert_rejected
from pytest_ml4.checks.reasoning import (
    assert_reasoning_separated,
    assert_reasoning_tokens_agree,
    cut_inside_reasoning,
    reasoning_tokens,
    save_share_baseline,
    share_baseline_drift,
    share_row,
)
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.client import Endpoint
from pytest_ml4.dynamo_versions import target_row
from pytest_ml4.locations import data_file
from pytest_ml4.targets import Target
from pytest_ml4.vllm_versions import for_version

pytestmark = pytest.mark.reasoning

REASONING_FILE = data_file("prompts", "reasoning.yaml")
DATA = yaml.safe_load(REASONING_FILE.read_text())
STREAM = pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
#: Token rounding when comparing a measured share with the gate band (shares are ratios of small integers).
SHARE_TOLERANCE = 0.02


def defaults_for(target: Target) -> dict[str, Any]:
    """The request defaults; on a Dynamo release that splits reasoning only for requests naming an effort
    (``reasoning_split_needs_effort``), every question names ``effort_when_required``, as its clients must."""
    row = target_row(target)
    if row is not None and row.reasoning_split_needs_effort:
        return {**DATA["defaults"], "reasoning_effort": DATA["effort_when_required"]}
    return dict(DATA["defaults"])


def accepted_efforts(target: Target) -> tuple[str, ...]:
    """The efforts the endpoint serves: through Dynamo the frontend's (its row; no vLLM-side check applies),
    else the engine's vLLM version's (``pytest_ml4/data/vllm/versions.yaml``)."""
    row = target_row(target)
    return row.reasoning_efforts if row is not None else tuple(for_version(target.engine.version).reasoning_efforts)


@pytest.fixture
def chat(request: pytest.FixtureRequest, ml4_target: Target, ml4_endpoint: Endpoint, openai_client: Any,
         http_client: httpx.Client, ml4_run_dir: Path) -> ChatSession:
    return ChatSession(openai_client, http_client, ml4_endpoint.model, defaults_for(ml4_target),
                       ml4_run_dir / "transcripts", request.node.name)


@STREAM
def test_reasoning_is_separated_from_content(chat: ChatSession, stream: bool) -> None:
    q = DATA["question"]
    answer = chat.ask(chat.body(user(q["prompt"])), stream)
    assert_no_control_tokens(answer.message, answer.where)
    assert_reasoning_separated(answer.message, answer.where)
    assert q["expect_substring"] in answer.content, f"{answer.where}: wrong answer in content: {answer.content!r}"
    assert answer.finish_reason == "stop", f"{answer.where}: finish_reason {answer.finish_reason!r}"


@STREAM
def test_reasoning_token_count_agrees_with_usage(chat: ChatSession, ml4_token_counter: Any, stream: bool) -> None:
    answer = chat.ask(chat.body(user(DATA["question"]["prompt"])), stream)
    reasoning = assert_reasoning_separated(answer.message, answer.where)
    assert_reasoning_tokens_agree(reasoning, answer.usage, ml4_token_counter, answer.where)


@STREAM
@pytest.mark.parametrize("effort", DATA["efforts"])
def test_each_reasoning_effort_is_accepted(chat: ChatSession, ml4_target: Target, ml4_endpoint: Endpoint,
                                           http_client: httpx.Client, ml4_token_counter: Any, effort: str,
                                           stream: bool) -> None:
    """Each effort the endpoint accepts answers (the target's vLLM version, pytest_ml4/data/vllm/versions.yaml; through
    Dynamo the frontend's, pytest_ml4/data/dynamo/versions.yaml); the others are refused with vLLM's 400 naming the
    supported values."""
    q = DATA["question"]
    accepted = accepted_efforts(ml4_target)
    if effort not in accepted:
        body = {"model": ml4_endpoint.model, "messages": user(q["prompt"]), "max_tokens": 64,
                "reasoning_effort": effort}
        assert_rejected(send_raw(http_client, body, stream), 400,
                        f"reasoning_effort={effort} is not supported",
                        f"reasoning_effort={effort!r} on vLLM {ml4_target.engine.version}")
        return
    answer = chat.ask(chat.body(user(q["prompt"]), reasoning_effort=effort), stream)
    assert_no_control_tokens(answer.message, answer.where)
    assert q["expect_substring"] in answer.content, f"{answer.where}: wrong answer at effort {effort}: {answer.content!r}"
    if effort == "none":
        assert not answer.reasoning, f"{answer.where}: reasoning_effort none still produced reasoning: {answer.reasoning!r}"
        assert not reasoning_tokens(answer.usage), (f"{answer.where}: reasoning_effort none but usage reports "
                                                    f"{reasoning_tokens(answer.usage)} reasoning tokens")
    else:
        reasoning = assert_reasoning_separated(answer.message, f"{answer.where}, effort {effort}")
        assert_reasoning_tokens_agree(reasoning, answer.usage, ml4_token_counter,
                                      f"{answer.where}, effort {effort}")


@STREAM
def test_no_think_markup_for_clients_that_omit_the_effort(ml4_target: Target, ml4_endpoint: Endpoint,
                                                          openai_client: Any, http_client: httpx.Client,
                                                          ml4_run_dir: Path, request: pytest.FixtureRequest,
                                                          stream: bool) -> None:
    """A client that sends no ``reasoning_effort`` sees no ``[THINK]`` markup in content, where the target's
    Dynamo row that makes the other checks send an effort is an estimate (``status: estimate``): an unverified
    ``reasoning_split_needs_effort: true`` must not hide a leak from the clients that omit it."""
    row = target_row(ml4_target)
    if row is None or not row.reasoning_split_needs_effort:
        pytest.skip("the other reasoning checks already send no reasoning_effort on this target")
    if row.verified:
        pytest.skip(f"Dynamo {row.version}'s row is verified ({row.source[:120]}...): it leaves [THINK] in content "
                    f"without an effort, and its clients must send one (the other checks do)")
    chat = ChatSession(openai_client, http_client, ml4_endpoint.model, dict(DATA["defaults"]),
                       ml4_run_dir / "transcripts", request.node.name)
    q = DATA["question"]
    answer = chat.ask(chat.body(user(q["prompt"])), stream)
    where = f"{answer.where}, no reasoning_effort (Dynamo {row.version}, row status estimate)"
    assert_no_control_tokens(answer.message, where)
    assert q["expect_substring"] in answer.content, f"{where}: wrong answer in content: {answer.content!r}"


@STREAM
@pytest.mark.parametrize("case", sorted(DATA["errors"]["cases"]))
def test_invalid_reasoning_requests_are_rejected(ml4_target: Target, ml4_endpoint: Endpoint,
                                                 http_client: httpx.Client, case: str, stream: bool) -> None:
    """Each stack answers these in its own words (``pytest_ml4/data/prompts/reasoning.yaml`` errors.expect): vLLM refuses
    both; the Dynamo chat processor refuses the unknown effort and serves ``chat_template_kwargs`` (served: a
    stream that fails after its 200 is not)."""
    extra = DATA["errors"]["cases"][case]
    body = {"model": ml4_endpoint.model, "messages": user(DATA["question"]["prompt"]), "max_tokens": 64, **extra}
    expected = expected_for(DATA["errors"]["expect"], ml4_target.serving.stack, case, REASONING_FILE)
    what = f"{extra} ({'streamed' if stream else 'non-streamed'})"
    answer = send_raw(http_client, body, stream)
    assert_answer_expected(answer, expected, what)
    if expected.accepted:   # the stack serves it: a stream failing after its 200 is not that
        assert_served(answer, what)


def share_conditions(chat: ChatSession, max_tokens: int, min_tokens: int | None) -> dict[str, Any]:
    """What a share depends on besides the deployment (``SHARE_CONDITION_KEYS``), as this run asks it."""
    return {"prompts": list(DATA["share"]["prompts"]), "max_tokens": max_tokens, "min_tokens": min_tokens,
            "reasoning_effort": chat.defaults.get("reasoning_effort"), "temperature": chat.defaults.get("temperature")}


def measure_share(chat: ChatSession, prompts: list[str], stream: bool, **limits: int) -> list[dict[str, Any]]:
    """One row per prompt. A natural answer must reason, keep it apart and answer after it; one cut inside its
    reasoning at ``max_tokens`` (forced length or not) is not judged as a share: it measures the cap."""
    rows = []
    for prompt in prompts:
        answer = chat.ask(chat.body(user(prompt), **limits), stream)
        assert_no_control_tokens(answer.message, answer.where)
        if cut_inside_reasoning(answer.finish_reason, answer.content):
            not_judged(f"{answer.where}: truncated: the answer hit max_tokens {limits['max_tokens']} inside its "
                       f"reasoning (finish_reason length before [/THINK], {reasoning_tokens(answer.usage)} "
                       f"reasoning tokens), so its share measures the cap, not the deployment ({REASONING_FILE.name})")
        assert_reasoning_separated(answer.message, answer.where)
        if "min_tokens" not in limits:
            assert answer.content.strip() and answer.finish_reason == "stop", (
                f"{answer.where}: no answer after the reasoning: finish_reason {answer.finish_reason!r}, content "
                f"{answer.content!r}")
        rows.append(share_row(prompt, answer.usage, answer.where))
    return rows


def report_share(rows: list[dict[str, Any]], conditions: dict[str, Any], out: Path, extra: dict[str, Any],
                 record_property: Any) -> float:
    """Write, print, attach and record the shares with the conditions they were measured under."""
    mean = sum(r["share"] for r in rows) / len(rows)
    out.write_text(json.dumps({"mean_share": round(mean, 4), "conditions": conditions, **extra, "rows": rows},
                              indent=1))
    print(f"reasoning share: mean {mean:.1%} over {len(rows)} answers (" + describe_conditions(
        conditions, ("max_tokens", "min_tokens", "reasoning_effort")) + "): "
        + ", ".join(f"{r['share']:.1%}" for r in rows))
    record_property("reasoning_share", {"value": round(mean, 4), "conditions": conditions})
    attach(out)
    return mean


@STREAM
def test_reasoning_share_of_output_is_measured(chat: ChatSession, ml4_target: Target, ml4_run_dir: Path,
                                               ml4_share_baseline: Any, ml4_endpoint: Endpoint,
                                               record_property: Any, stream: bool) -> None:
    """The reasoning share of natural answers stays where this deployment's baseline recorded it.

    At a length that does not cut the reasoning (``share.max_tokens``, no ``min_tokens``: a real client never
    forces the model to keep writing) each answer must reason, keep the reasoning apart and answer after it. What a
    release must not do is move the share of the *same* prompts under the *same* conditions (a template, parser or
    effort default changed): each prompt's share must stay within the tolerance of the baseline recorded on this
    deployment (``pytest_ml4/data/baselines/reasoning-share-<target>.json``, ``--reasoning-share-save``). A baseline of
    other conditions is refused; without one for this deployment (a live run and the simulator's file) the share is
    not judged. Seed 000's 50-68 % is a figure of its own workload: see ``test_reasoning_share_at_seed_conditions``."""
    spec = DATA["share"]
    n = int(spec["max_tokens"])
    conditions = share_conditions(chat, n, None)
    rows = measure_share(chat, list(spec["prompts"]), stream, max_tokens=n)
    choice = ml4_share_baseline
    base = choice.baseline
    report_share(rows, conditions, ml4_run_dir / f"reasoning_share_{'stream' if stream else 'nonstream'}.json",
                 {"target": ml4_target.name, "stream": stream, "baseline": str(base.path) if base else None},
                 record_property)
    if choice.save is not None and not stream:
        save_share_baseline(choice.save, rows, conditions, deployment_provenance(
            ml4_target, ml4_endpoint.model, sys.argv, ml4_endpoint.simulated),
            float(spec["tolerance"]))
    if choice.refused:
        pytest.fail(choice.refused, pytrace=False)
    if base is None:
        shares = ", ".join(f"{r['share']:.1%}" for r in rows)
        not_judged(f"reasoning share {shares}: {choice.not_judged}")
    try:
        drift = share_baseline_drift(rows, base, conditions, str(base.path))
    except BaselineRefused as err:   # measured under other conditions
        if choice.explicit:
            pytest.fail(str(err), pytrace=False)
        not_judged(f"{err}; record one under these conditions with: {choice.record}")
    assert not drift, "reasoning share moved from the baseline:\n" + "\n".join(drift)


@STREAM
def test_reasoning_share_at_seed_conditions(chat: ChatSession, ml4_target: Target, ml4_run_dir: Path,
                                            record_property: Any, stream: bool) -> None:
    """Under seed 000's own conditions the reasoning share is the seed's figure.

    Seed 000 measured "reasoning tokens are 50-68 % of the output" with aiperf at ``min_tokens = max_tokens =
    4096``; this check asks the same (``seed_share``) and compares with the target's ``gates.reasoning_share``.
    A nightly cost: four answers of 4096 tokens, about 3 min of a c1 deployment (deselect it from the post-deploy
    gate with ``-k "not seed_conditions"``). Without a seed figure for the target it is not judged."""
    spec = DATA["seed_share"]
    n = int(spec["output_tokens"])
    conditions = {**share_conditions(chat, n, n), "prompts": list(spec["prompts"])}
    rows = measure_share(chat, list(spec["prompts"]), stream, max_tokens=n, min_tokens=n)
    mean = report_share(rows, conditions, ml4_run_dir / f"reasoning_share_seed_{'stream' if stream else 'nonstream'}"
                        ".json", {"target": ml4_target.name, "seed_band": ml4_target.gates.reasoning_share},
                        record_property)
    band = ml4_target.gates.reasoning_share
    if not band:
        not_judged(f"reasoning share {mean:.1%} at {n} forced tokens: {ml4_target.name} states no seed figure "
                   "(gates.reasoning_share) to compare it with")
    lo, hi = band
    assert lo - SHARE_TOLERANCE <= mean <= hi + SHARE_TOLERANCE, (
        f"reasoning share {mean:.1%} at min_tokens = max_tokens = {n} outside seed 000's {lo:.0%}-{hi:.0%} "
        f"(gates.reasoning_share): {rows}")
