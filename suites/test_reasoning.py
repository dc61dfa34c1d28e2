"""Reasoning through the Mistral reasoning parser (issue 3; reference vllm.md §2, §3, §3.1).

Every check runs non-streamed (openai SDK) and streamed (stream probe, grammar checked); streamed answers must
assemble to exactly the non-streamed one. Reasoning may arrive as ``reasoning`` (vLLM >= 0.16) or the legacy
``reasoning_content`` (<= 0.15); both are accepted, neither counted twice. Data: ``fixtures/prompts/reasoning.yaml``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from pytest_ml4.checks.chat import ChatSession, attach, send_raw, user
from pytest_ml4.checks.expected import assert_served, check_answer, expected_for
from pytest_ml4.checks.protocol import assert_no_control_tokens, assert_rejected
from pytest_ml4.checks.reasoning import (
    assert_reasoning_separated,
    assert_reasoning_tokens_agree,
    reasoning_share,
    reasoning_tokens,
    share_baseline_drift,
)
from pytest_ml4.client import Endpoint
from pytest_ml4.dynamo_versions import DynamoBehaviour, behaviour
from pytest_ml4.targets import FIXTURES_DIR, Target
from pytest_ml4.vllm_versions import for_version

pytestmark = pytest.mark.reasoning

REASONING_FILE = FIXTURES_DIR / "prompts" / "reasoning.yaml"
DATA = yaml.safe_load(REASONING_FILE.read_text())
STREAM = pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
#: Token rounding when comparing a measured share with the gate band (shares are ratios of small integers).
SHARE_TOLERANCE = 0.02


def dynamo_row(target: Target) -> DynamoBehaviour | None:
    """The ``fixtures/dynamo/versions.yaml`` row of the target's Dynamo release (None: not Dynamo)."""
    return behaviour(target.serving.dynamo_version) if target.is_dynamo and target.serving.dynamo_version else None


def defaults_for(target: Target) -> dict[str, Any]:
    """The request defaults; on a Dynamo release that splits reasoning only for requests naming an effort
    (``reasoning_split_needs_effort``), every question names ``effort_when_required``, as its clients must."""
    row = dynamo_row(target)
    if row is not None and row.reasoning_split_needs_effort:
        return {**DATA["defaults"], "reasoning_effort": DATA["effort_when_required"]}
    return dict(DATA["defaults"])


def accepted_efforts(target: Target) -> tuple[str, ...]:
    """The efforts the endpoint serves: through Dynamo the frontend's (its row; no vLLM-side check applies),
    else the engine's vLLM version's (``fixtures/vllm/versions.yaml``)."""
    row = dynamo_row(target)
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
    """Each effort the endpoint accepts answers (the target's vLLM version, fixtures/vllm/versions.yaml; through
    Dynamo the frontend's, fixtures/dynamo/versions.yaml); the others are refused with vLLM's 400 naming the
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
    row = dynamo_row(ml4_target)
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
    """Each stack answers these in its own words (``fixtures/prompts/reasoning.yaml`` errors.expect): vLLM refuses
    both; the Dynamo chat processor refuses the unknown effort and serves ``chat_template_kwargs`` (served: a
    stream that fails after its 200 is not)."""
    extra = DATA["errors"]["cases"][case]
    body = {"model": ml4_endpoint.model, "messages": user(DATA["question"]["prompt"]), "max_tokens": 64, **extra}
    expected = expected_for(DATA["errors"]["expect"], ml4_target.serving.stack, case, REASONING_FILE)
    what = f"{extra} ({'streamed' if stream else 'non-streamed'})"
    answer = send_raw(http_client, body, stream)
    check_answer(answer, expected, what)
    if expected.accepted:   # the stack serves it: a stream failing after its 200 is not that
        assert_served(answer, what)


@STREAM
def test_reasoning_share_of_output_is_measured(chat: ChatSession, ml4_target: Target, ml4_run_dir: Path,
                                               record_property: Any, stream: bool) -> None:
    """The reasoning share of fixed-length answers, measured, reported and gated against a stored baseline.

    Seed 000's "reasoning tokens are 50-68 % of the output" (``gates.reasoning_share``) describes the seed's own
    workload, not a release threshold, so it is reported beside the figure, not gated. What a release must not do
    is move the share of the *same* prompts at the *same* fixed length (a template, parser or effort default
    changed): each prompt's share must stay within the baseline's tolerance of
    ``fixtures/baselines/reasoning-share-<target>.json``. Without a baseline only the sanity band
    ``share.default_band`` applies (the reasoning must be a real part of the output)."""
    spec = DATA["share"]
    n = int(spec["output_tokens"])
    rows = []
    for prompt in spec["prompts"]:
        answer = chat.ask(chat.body(user(prompt), max_tokens=n, min_tokens=n), stream)
        assert_no_control_tokens(answer.message, answer.where)
        share = reasoning_share(answer.usage)
        assert share is not None, (f"{answer.where}: cannot measure the reasoning share: usage lacks "
                                   f"reasoning_tokens or completion_tokens: {answer.usage}")
        rows.append({"prompt": prompt, "completion_tokens": answer.usage["completion_tokens"],
                     "reasoning_tokens": reasoning_tokens(answer.usage), "share": round(share, 4)})
    mean = sum(r["share"] for r in rows) / len(rows)
    baseline_file = FIXTURES_DIR / "baselines" / f"reasoning-share-{ml4_target.name}.json"
    baseline = json.loads(baseline_file.read_text()) if baseline_file.is_file() else None
    report = {"target": ml4_target.name, "stream": stream, "mean_share": round(mean, 4),
              "seed_workload_band": ml4_target.gates.reasoning_share,
              "baseline": str(baseline_file) if baseline else None, "rows": rows}
    out = ml4_run_dir / f"reasoning_share_{'stream' if stream else 'nonstream'}.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"reasoning share ({'streamed' if stream else 'non-streamed'}): mean {mean:.1%} over {len(rows)} "
          f"fixed-length answers of {n} tokens; " + ", ".join(f"{r['share']:.1%}" for r in rows)
          + (f"; baseline {baseline_file.name}" if baseline else "; no baseline"))
    record_property("reasoning_share", round(mean, 4))
    attach(out)
    lo, hi = spec["default_band"]
    assert lo - SHARE_TOLERANCE <= mean <= hi + SHARE_TOLERANCE, (
        f"reasoning share {mean:.1%} outside the sanity band {lo:.0%}-{hi:.0%}: {rows}")
    if baseline is not None:
        drift = share_baseline_drift(rows, baseline, n, str(baseline_file.relative_to(FIXTURES_DIR.parent)))
        assert not drift, "reasoning share moved from the baseline:\n" + "\n".join(drift)