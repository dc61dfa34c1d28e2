"""The Dynamo workers publish their simulated prefix cache as KV events the REAL 1.6.1 KV router consumes.

Without those events the router knows no overlap: ``kv_hit_rate`` 0 and no prefix-following routing, so the
restart suite's prefix-reuse and affinity checks fail (pytest_ml4.control.dynamo). Here, on one 2-worker
gb300-agg deployment with the target's hard session affinity: a continuation reports the router's hit rate, and
the affinity check holds; on a second deployment with ``serving.session_affinity`` off the same check FAILS
(the session's second turn follows its cached prefix to the other worker), so the check can fail.
Two deployments for the module (CI cost ~50 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.dynamo import DynamoSim

from pytest_ml4.checks.dynamo import assert_prefix_reused, assert_session_affinity
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.control.dynamo import run_affinity_probe, run_conversation
from pytest_ml4.control.scenario import load_requests
from pytest_ml4.runtime.installed import ToolMissing, dynamo_python
from pytest_ml4.target.model import Target, load_target

try:
    dynamo_python()
except ToolMissing as err:  # the install step is part of scripts/install.sh; CI always has it
    pytest.skip(str(err), allow_module_level=True)

SPEC = load_requests()


def _deploy(target: Target, folder: Path) -> Iterator[Endpoint]:
    dsim = DynamoSim(target, log_file=folder / "engine.log").start()
    try:
        yield Endpoint(dsim.base_url, model=target.serving.served_model_name, simulated=True)
    finally:
        dsim.stop()


@pytest.fixture(scope="module")
def pinned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    target = load_target("gb300-agg")
    assert target.serving.session_affinity and target.serving.dynamo_router == "kv"  # what this module relies on
    yield from _deploy(target, tmp_path_factory.mktemp("pinned"))


@pytest.fixture(scope="module")
def unpinned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    target = load_target("gb300-agg", overrides={"serving": {"session_affinity": False}})
    yield from _deploy(target, tmp_path_factory.mktemp("unpinned"))


def test_continuation_reuses_the_prefix_by_the_routers_figures(pinned: Endpoint) -> None:
    turns = run_conversation(pinned, SPEC.conversation)
    cached = assert_prefix_reused(turns, load_target("gb300-agg").engine.block_size)
    assert cached > 0
    # The router's own overlap (from the KV events), not only the engine's usage figure.
    assert turns[1].kv_hit_rate is not None and turns[1].kv_hit_rate > 0, turns[1].line()


def test_session_stays_on_its_worker_against_kv_routing(pinned: Endpoint) -> None:
    probe = run_affinity_probe(pinned, SPEC.affinity)
    assert probe.not_applicable is None, probe.not_applicable
    assert assert_session_affinity(probe) == probe.session_worker


def test_affinity_check_fails_when_affinity_is_off(unpinned: Endpoint) -> None:
    probe = run_affinity_probe(unpinned, SPEC.affinity)
    with pytest.raises(AssertionError, match="session affinity is off"):
        assert_session_affinity(probe)
