"""The health verdicts (``pytest_ml4.checks.health``) on recorded-shape /health bodies, without a server: Dynamo's
worker counting per topology and the engine root a proxied target's engine health is read at."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from pytest_ml4.checks.health import assert_dynamo_workers_registered
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.target.model import load_target


def _health(*instances: tuple[str, int], endpoint: str = "generate") -> httpx.Response:
    body: dict[str, Any] = {"status": "healthy", "instances": [
        {"component": c, "endpoint": endpoint, "instance_id": i} for c, i in instances]}
    return httpx.Response(200, content=json.dumps(body).encode(),
                          request=httpx.Request("GET", "http://fe:8000/health"))


def test_agg_passes_with_every_worker_and_names_the_missing_one() -> None:
    agg = load_target("gb300-agg")
    want = agg.topology.workers
    assert_dynamo_workers_registered(_health(*[("backend", i) for i in range(want)]), "/health", agg)
    with pytest.raises(AssertionError, match=rf"/health lists {want - 1} worker instance\(s\) .*the target has "
                                             rf"{want} workers: not every worker registered"):
        assert_dynamo_workers_registered(_health(*[("backend", i) for i in range(want - 1)]), "/health", agg)


def test_disagg_counts_each_role_on_its_own() -> None:
    disagg = load_target("gb300-disagg")
    prefill, decode = disagg.topology.prefill_workers, disagg.topology.decode_workers
    full = [("prefill", i) for i in range(prefill)] + [("backend", 100 + i) for i in range(decode)]
    assert_dynamo_workers_registered(_health(*full), "/health", disagg)
    # A spare decode worker does not make up for a missing prefill one.
    spare = full[1:] + [("backend", 999)]
    with pytest.raises(AssertionError, match=rf"/health lists {prefill - 1} prefill worker instance\(s\) .*the "
                                             rf"target has {prefill}: not every worker registered"):
        assert_dynamo_workers_registered(_health(*spare), "/health", disagg)


def test_a_reduced_embedded_deployment_is_held_to_what_it_started() -> None:
    """Real dynamo.vllm workers here run one per role (one core each): /health must list the workers that
    deployment started, and a role it started but that did not register still fails, naming the reduction."""
    disagg = load_target("gb300-disagg")
    assert disagg.topology.prefill_workers > 1 and disagg.topology.decode_workers > 1
    started = {"prefill": 1, "decode": 1}
    assert_dynamo_workers_registered(_health(("prefill", 1), ("backend", 2)), "/health", disagg, started)
    with pytest.raises(AssertionError, match=r"/health lists 1 prefill worker instance\(s\) .*the target has"):
        assert_dynamo_workers_registered(_health(("prefill", 1), ("backend", 2)), "/health", disagg)
    with pytest.raises(AssertionError, match=r"/health lists 0 decode worker instance\(s\) \[\], the embedded "
                                             r"deployment \(reduced from the target's topology\) started 1"):
        assert_dynamo_workers_registered(_health(("prefill", 1)), "/health", disagg, started)


def test_a_healthy_frontend_without_workers_is_not_ready() -> None:
    with pytest.raises(AssertionError, match="serves no worker: /health lists no 'generate' instance"):
        assert_dynamo_workers_registered(_health(("backend", 1), endpoint="clear_kv_blocks"), "/health",
                                         load_target("gb300-agg"))


def test_the_engine_root_is_the_server_the_metrics_url_names() -> None:
    assert Endpoint("http://proxy:4000/v1", metrics_url="http://engine:8000/metrics").engine_root_url == \
        "http://engine:8000"
    # No metrics URL of its own: the endpoint's root, which the proxied health check refuses to judge by.
    plain = Endpoint("http://proxy:4000/v1")
    assert plain.engine_root_url == plain.root_url
