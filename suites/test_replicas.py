"""Every replica answers right: on a Dynamo deployment each worker answers the functional probes, judged per worker.

The functional suites ride whatever worker the router picks; a deployment with one misconfigured worker of N (a
rolling update half done, a pod with stale arguments) passes every check the router keeps on the good ones. Here
the tools, reasoning and fixed-length suites' own questions (``pytest_ml4/data/prompts/replicas.yaml``) go to each
worker the frontend's ``/health`` lists (pinned where the release honours the pin headers, else read from
``nvext.worker_id``), streamed and not, and one check per probe fails naming the worker that answered it wrong.
The probes are sent once for the module (about 14 requests per worker). See :mod:`pytest_ml4.evidence.replicas`.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import yaml

from pytest_ml4.checks.replicas import assert_every_worker_answers_right, judge_with
from pytest_ml4.checks.tools import ToolChat
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.evidence.replicas import (
    TOOLS_FILE,
    Reach,
    probe_specs,
    reach_every_worker,
    read_health,
    replica_probes,
    sender,
)
from pytest_ml4.evidence.worker_engine import WorkerEngine
from pytest_ml4.stacks.dynamo_versions import target_row
from pytest_ml4.target.model import Target

pytestmark = [pytest.mark.tools, pytest.mark.reasoning, pytest.mark.dynamo,
              pytest.mark.replicas("largest", 2, why="one worker of a role answers whatever the router does")]

PROBES = [p.name for p in probe_specs("")]
ROUNDS = replica_probes().unpinned_rounds_per_worker


@pytest.fixture(scope="module")
def reach(ml4_target: Target, ml4_endpoint: Endpoint, openai_client: Any) -> Reach:
    health, why = read_health(ml4_endpoint)
    probes = probe_specs(ml4_endpoint.model)
    if health is None:
        return Reach({}, [], False, probes, unavailable=why)
    row = target_row(ml4_target)
    pins = row.pins_workers if row is not None else True
    return reach_every_worker(health, ml4_target.topology.kind, probes, sender(ml4_endpoint, openai_client), pins,
                              ROUNDS)


@pytest.mark.parametrize("probe", PROBES)
def test_every_worker_answers_right(reach: Reach, probe: str, ml4_target: Target, ml4_endpoint: Endpoint,
                                    openai_client: Any, http_client: httpx.Client, ml4_token_counter: Any,
                                    ml4_worker_engine: WorkerEngine | None) -> None:
    conventions = yaml.safe_load(TOOLS_FILE.read_text()).get("conventions")
    chat = ToolChat(openai_client, http_client, ml4_endpoint.model, {}).on(ml4_target, conventions,
                                                                           ml4_worker_engine, None)
    for line in assert_every_worker_answers_right(reach, probe, judge_with(chat, ml4_token_counter)):
        print(line)
