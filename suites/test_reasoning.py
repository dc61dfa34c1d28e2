"""Reasoning through the Mistral reasoning parser (reference vllm.md §2, §3, §3.1).

Every check runs non-streamed (openai SDK) and streamed (stream probe, grammar checked); streamed answers must
assemble to exactly the non-streamed one. Reasoning may arrive as ``reasoning`` (vLLM >= 0.16) or the legacy
``reasoning_content`` (<= 0.15); both are accepted, neither counted twice. Data: ``pytest_ml4/data/prompts/reasoning.yaml``.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from pytest_ml4.checks.chat import BadRequest, ChatSession, user
from pytest_ml4.checks.codes import fail, fails_with
from pytest_ml4.checks.protocol import assert_no_control_tokens
from pytest_ml4.checks.reasoning import (
    ShareBaselineChoice,
    accepted_efforts,
    assert_effort_honoured,
    assert_effort_refused,
    assert_higher_effort_thinks_longer,
    assert_invalid_request_answered,
    assert_reasoned_answer,
    assert_reasoning_separated,
    assert_reasoning_tokens_agree,
    assert_right_answer,
    assert_share_in_seed_band,
    assert_share_within_baseline,
    defaults_for,
    effort_contrast,
    measure_share,
    report_share,
    save_share_if_asked,
    share_conditions,
)
from pytest_ml4.checks.suite_data import REASONING_FILE, reasoning_data
from pytest_ml4.client.deployment import Deployment
from pytest_ml4.stacks.dynamo_versions import target_row
from pytest_ml4.target.baselines import BaselineRefused, deployment_provenance

pytestmark = pytest.mark.reasoning

DATA = reasoning_data()
STREAM = pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])


@pytest.fixture
def chat(request: pytest.FixtureRequest, ml4: Deployment) -> ChatSession:
    return ChatSession.on_deployment(ml4, defaults_for(ml4.target, DATA.defaults, DATA.effort_when_required),
                                     request.node.name)


@pytest.fixture
def chat_without_effort(request: pytest.FixtureRequest, ml4: Deployment) -> ChatSession:
    """A client that sends the request defaults as they are: no ``reasoning_effort``, whatever the stack."""
    return ChatSession.on_deployment(ml4, dict(DATA.defaults), request.node.name)


@STREAM
def test_reasoning_is_separated_from_content(chat: ChatSession, stream: bool) -> None:
    q = DATA.question
    answer = chat.ask(chat.body(user(q.prompt)), stream)
    assert_reasoned_answer(answer, q.expect_substring)


@STREAM
def test_reasoning_token_count_agrees_with_usage(chat: ChatSession, ml4: Deployment, stream: bool) -> None:
    answer = chat.ask(chat.body(user(DATA.question.prompt)), stream)
    reasoning = assert_reasoning_separated(answer.message, answer.where)
    assert_reasoning_tokens_agree(reasoning, answer.usage, ml4.token_counter, answer.where)


@STREAM
@pytest.mark.parametrize("effort", DATA.efforts)
def test_each_reasoning_effort_is_accepted(chat: ChatSession, ml4: Deployment, effort: str, stream: bool) -> None:
    """Each effort the endpoint accepts answers (the target's vLLM version, pytest_ml4/data/vllm/versions.yaml; through
    Dynamo the frontend's, pytest_ml4/data/dynamo/versions.yaml); the others are refused with vLLM's 400 naming the
    supported values."""
    q = DATA.question
    if effort not in accepted_efforts(ml4.target):
        assert_effort_refused(ml4, q.prompt, effort=effort, stream=stream)
        return
    answer = chat.ask(chat.body(user(q.prompt), reasoning_effort=effort), stream)
    assert_effort_honoured(answer, effort, q.expect_substring, ml4.token_counter)


@STREAM
def test_higher_effort_thinks_longer(chat: ChatSession, ml4: Deployment, stream: bool) -> None:
    """An effort the endpoint accepts also reaches the model: the same question thinks longer at a high effort
    than at a low one."""
    efforts = effort_contrast(ml4.target)
    if efforts is None:
        pytest.skip(f"the endpoint does not serve both efforts compared ({accepted_efforts(ml4.target)})")
    low, high = (chat.ask(chat.body(user(DATA.question.prompt), reasoning_effort=e), stream) for e in efforts)
    assert_higher_effort_thinks_longer(low, high, efforts, ml4.token_counter)


@STREAM
def test_no_think_markup_for_clients_that_omit_the_effort(ml4: Deployment, chat_without_effort: ChatSession,
                                                          stream: bool) -> None:
    """A client that sends no ``reasoning_effort`` sees no ``[THINK]`` markup in content, where the target's
    Dynamo row that makes the other checks send an effort is an estimate (``status: estimate``): an unverified
    ``reasoning_split_needs_effort: true`` must not hide a leak from the clients that omit it."""
    row = target_row(ml4.target)
    if row is None or not row.reasoning_split_needs_effort:
        pytest.skip("the other reasoning checks already send no reasoning_effort on this target")
    if row.verified:
        pytest.skip(f"Dynamo {row.version}'s row is verified ({row.source[:120]}...): it leaves [THINK] in content "
                    f"without an effort, and its clients must send one (the other checks do)")
    q = DATA.question
    answer = chat_without_effort.ask(chat_without_effort.body(user(q.prompt)), stream)
    where = f"{answer.where}, no reasoning_effort (Dynamo {row.version}, row status estimate)"
    assert_no_control_tokens(answer.message, where)
    assert_right_answer(answer, q.expect_substring, where)


@STREAM
@pytest.mark.parametrize("case", sorted(DATA.errors.cases))
def test_invalid_reasoning_requests_are_rejected(ml4: Deployment, case: str, stream: bool) -> None:
    """Each stack answers these in its own words (``pytest_ml4/data/prompts/reasoning.yaml`` errors.expect): vLLM refuses
    both; the Dynamo chat processor refuses the unknown effort and serves ``chat_template_kwargs`` (served: a
    stream that fails after its 200 is not)."""
    extra = DATA.errors.cases[case]
    body = {"model": ml4.model, "messages": user(DATA.question.prompt), "max_tokens": 64, **extra}
    assert_invalid_request_answered(ml4, BadRequest(case, body, stream, label=str(extra)), DATA.answers())


@STREAM
@fails_with("baseline.refused", "the stored baseline cannot judge this run (other conditions, made elsewhere)")
def test_reasoning_share_of_output_is_measured(chat: ChatSession, ml4: Deployment,
                                               ml4_share_baseline: ShareBaselineChoice, record_property: Any,
                                               stream: bool) -> None:
    """The reasoning share of natural answers stays where this deployment's baseline recorded it.

    At a length that does not cut the reasoning (``share.max_tokens``, no ``min_tokens``: a real client never
    forces the model to keep writing) each answer must reason, keep the reasoning apart and answer after it. What a
    release must not do is move the share of the *same* prompts under the *same* conditions (a template, parser or
    effort default changed): each prompt's share must stay within the tolerance of the baseline recorded on this
    deployment (``pytest_ml4/data/baselines/reasoning-share-<target>.json``, ``--reasoning-share-save``). A baseline of
    other conditions is refused; without one for this deployment (a live run and the simulator's file) the share is
    not judged. Seed 000's 50-68 % is a figure of its own workload: see ``test_reasoning_share_at_seed_conditions``."""
    spec = DATA.share
    n = spec.max_tokens
    conditions = share_conditions(chat, spec.prompts, n, None)
    rows = measure_share(chat, spec.prompts, stream, REASONING_FILE.name, max_tokens=n)
    base = ml4_share_baseline.baseline
    report_share(rows, conditions, ml4.run_dir / f"reasoning_share_{'stream' if stream else 'nonstream'}.json",
                 {"target": ml4.target.name, "stream": stream, "baseline": str(base.path) if base else None},
                 record_property)
    if not stream:
        save_share_if_asked(ml4_share_baseline, rows, conditions, deployment_provenance(
            ml4.target, ml4.model, sys.argv, ml4.endpoint.simulated, ml4.endpoint.base_url), spec.tolerance)
    try:
        assert_share_within_baseline(rows, conditions, ml4_share_baseline)
    except BaselineRefused as err:   # a baseline that cannot judge this run: one line, no traceback
        fail("baseline.refused", str(err))


@STREAM
@pytest.mark.applies_if("gates.reasoning_share", why="the seed figure this check compares with")
def test_reasoning_share_at_seed_conditions(chat: ChatSession, ml4: Deployment, record_property: Any,
                                            stream: bool) -> None:
    """Under seed 000's own conditions the reasoning share is the seed's figure.

    Seed 000 measured "reasoning tokens are 50-68 % of the output" with aiperf at ``min_tokens = max_tokens =
    4096``; this check asks the same (``seed_share``) and compares with the target's ``gates.reasoning_share``.
    A nightly cost: four answers of 4096 tokens, about 3 min of a c1 deployment (deselect it from the post-deploy
    gate with ``-k "not seed_conditions"``). Without a seed figure for the target it does not apply."""
    spec = DATA.seed_share
    n = spec.output_tokens
    conditions = share_conditions(chat, spec.prompts, n, n)
    rows = measure_share(chat, spec.prompts, stream, REASONING_FILE.name, max_tokens=n, min_tokens=n)
    mean = report_share(rows, conditions, ml4.run_dir / f"reasoning_share_seed_{'stream' if stream else 'nonstream'}"
                        ".json", {"target": ml4.target.name, "seed_band": ml4.target.gates.reasoning_share},
                        record_property)
    assert_share_in_seed_band(mean, ml4.target.gates.reasoning_share, n, rows, ml4.target.name)
