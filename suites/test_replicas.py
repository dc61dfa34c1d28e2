"""Every replica answers right: on a Dynamo deployment each worker answers the functional probes, judged per worker.

The functional suites ride whatever worker the router picks; a deployment with one misconfigured worker of N (a
rolling update half done, a pod with stale arguments) passes every check the router keeps on the good ones. Here
the tools, reasoning and fixed-length suites' own questions (``pytest_ml4/data/prompts/replicas.yaml``) go to each
worker the frontend's ``/health`` lists (pinned where the release honours the pin headers, else read from
``nvext.worker_id``), streamed and not, and one check per probe fails naming the worker that answered it wrong.
The probes are sent once for the module (about 14 requests per worker). See :mod:`pytest_ml4.evidence.replicas`.
"""

from __future__ import annotations

import pytest

from pytest_ml4.checks.replicas import assert_every_worker_answers_right, judge_with
from pytest_ml4.checks.suite_data import replicas_data, tools_data
from pytest_ml4.checks.tools import ToolChat
from pytest_ml4.client.deployment import Deployment
from pytest_ml4.evidence.replicas import (
    Reach,
    probe_specs,
    reach_every_worker,
    read_health,
    sender,
)
from pytest_ml4.stacks.dynamo_versions import target_row

pytestmark = [pytest.mark.tools, pytest.mark.reasoning, pytest.mark.dynamo,
              pytest.mark.replicas("largest", 2, why="one worker of a role answers whatever the router does")]

PROBES = [p.name for p in probe_specs("")]
ROUNDS = replicas_data().unpinned_rounds_per_worker


@pytest.fixture(scope="module")
def reach(ml4: Deployment) -> Reach:
    health, why = read_health(ml4.endpoint)
    probes = probe_specs(ml4.model)
    if health is None:
        return Reach({}, [], False, probes, unavailable=why)
    row = target_row(ml4.target)
    pins = row.pins_workers if row is not None else True
    return reach_every_worker(health, ml4.target.topology.kind, probes, sender(ml4.endpoint, ml4.openai), pins,
                              ROUNDS)


@pytest.mark.parametrize("probe", PROBES)
def test_every_worker_answers_right(reach: Reach, probe: str, ml4: Deployment) -> None:
    chat = ToolChat(ml4.openai, ml4.http, ml4.model, {}).on(ml4.target, tools_data().conventions,
                                                            ml4.worker_engine, None)
    for line in assert_every_worker_answers_right(reach, probe, judge_with(chat, ml4.token_counter)):
        print(line)
