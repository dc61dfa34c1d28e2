"""Smoke suite: is the deployment up, does it answer correctly, and does it speak vLLM's protocol?

Health and model list, a non-streaming and a streaming chat with a known answer, stream grammar, usage
consistency (re-tokenised with Tekken), the error answers of the target's serving stack, and a parallel burst.
Data (the question, the per-stack error shapes): ``pytest_ml4/data/smoke/smoke.yaml``; evidence and verdicts:
``pytest_ml4/checks/smoke.py``.
"""

from __future__ import annotations

import pytest

from pytest_ml4.checks import smoke
from pytest_ml4.checks.expected import answer_to_refuse, assert_answer_expected
from pytest_ml4.checks.health import (
    assert_dynamo_workers_registered,
    assert_endpoint_healthy,
    assert_engine_behind_proxy_healthy,
)
from pytest_ml4.checks.suite_data import smoke_data
from pytest_ml4.client.deployment import Deployment
from pytest_ml4.stacks import stack_for, stack_named

pytestmark = pytest.mark.smoke

DATA = smoke_data()
ERRORS = DATA.answers()


def test_health(ml4: Deployment) -> None:
    """The endpoint's health; on Dynamo every worker listed (every worker the embedded deployment started, where it
    reduced the target's topology); behind a proxy, the engine's own ``/health`` (a proxy's liveness answers 200
    while the engine behind it is dead)."""
    ml4_target, ml4_endpoint, ml4_worker_engine = ml4.target, ml4.endpoint, ml4.worker_engine
    stack = stack_for(ml4_target)
    path = stack.health_path
    resp = assert_endpoint_healthy(ml4_endpoint, path)
    if stack.routes_workers:
        reduced = ml4_worker_engine.reduced_to() if ml4_worker_engine else None
        assert_dynamo_workers_registered(resp, path, ml4_target, reduced)
    if ml4_target.has_proxy:
        assert_engine_behind_proxy_healthy(ml4_endpoint, ml4_target, stack_named(stack.engine).health_path)


def test_models_lists_served_name(ml4: Deployment) -> None:
    models = smoke.list_models(ml4.http)
    smoke.assert_served_name_listed(models, ml4.target.serving.served_model_name)


def test_models_max_model_len(ml4: Deployment) -> None:
    length = smoke.advertised_max_model_len(ml4)
    smoke.assert_max_model_len(length, ml4.target.engine.max_model_len)


def test_chat_answers_known_question(ml4: Deployment) -> None:
    resp = smoke.ask_known_question(ml4, DATA.question)
    smoke.assert_known_answer(resp, DATA.question)


def test_stream_answers_known_question_with_clean_grammar(ml4: Deployment) -> None:
    result = smoke.stream_chat(ml4, DATA.question.prompt, DATA.question.max_tokens)
    smoke.assert_streamed_known_answer(result, DATA.question)


def test_stream_usage_agrees_with_streamed_text(ml4: Deployment) -> None:
    result = smoke.stream_chat(ml4, smoke.USAGE_PROMPT, smoke.USAGE_MAX_TOKENS)
    smoke.assert_stream_usage_agrees(result, ml4.token_counter)


def test_unknown_model_is_refused(ml4: Deployment) -> None:
    resp = ml4.http.post("/chat/completions",
                         json={**smoke.chat_body(ml4.target, "hi", max_tokens=8), "model": "no-such-model"})
    assert_answer_expected(resp, ERRORS.expected(stack_for(ml4.target).name, "unknown_model"), "unknown model")


def test_over_long_prompt_is_refused(ml4: Deployment) -> None:
    # "hello " is one Tekken token; 10% over max_model_len guarantees the prompt alone exceeds the context.
    prompt = "hello " * int(ml4.target.engine.max_model_len * 1.1)
    body = smoke.chat_body(ml4.target, prompt, max_tokens=8)
    resp = answer_to_refuse(lambda: ml4.http.post("/chat/completions", json=body, timeout=120), "over-long prompt")
    assert_answer_expected(resp, ERRORS.expected(stack_for(ml4.target).name, "prompt_too_long"), "over-long prompt")


@pytest.mark.applies_if("endpoint.requires_api_key", why="the deployment asks for no key")
def test_wrong_api_key_is_refused(ml4: Deployment) -> None:
    resp = smoke.send_with_wrong_key(ml4)
    assert_answer_expected(resp, ERRORS.expected(stack_for(ml4.target).name, "bad_api_key"), "wrong API key")


def test_parallel_burst_all_succeed(ml4: Deployment) -> None:
    answers = smoke.send_burst(ml4, DATA.burst, DATA.question.max_tokens)
    smoke.assert_burst_answered(answers, DATA.burst)
