"""Health verdicts: the endpoint answers its health path, Dynamo lists every worker, and behind a proxy the
engine itself is healthy.

A LiteLLM proxy's liveness answers 200 while the engine behind it is dead (EngineDeadError makes vLLM's /health
answer 503), so a proxied target is judged by the engine's own health, reached at the engine's server (the target's
metrics URL names it). Real Dynamo's /health says "healthy" with zero workers: ready means the workers are listed
too, each disaggregation role on its own (a missing prefill worker is not made up for by a spare decode one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from pytest_ml4.checks.codes import fails_with, require
from pytest_ml4.client.endpoint import Endpoint, decode_json, refuse_html
from pytest_ml4.control.dynamo import role_instance_ids, worker_instance_ids
from pytest_ml4.target.model import Target

HEALTH_TIMEOUT_S = 10


@fails_with("health.http_status", "the endpoint's health path does not answer 200")
def assert_endpoint_healthy(endpoint: Endpoint, path: str) -> httpx.Response:
    """``GET <root><path>`` answers 200 with something other than an HTML page; returns the answer."""
    resp = httpx.get(endpoint.root_url + path, headers=endpoint.auth_headers(), timeout=HEALTH_TIMEOUT_S)
    require(resp.status_code == 200, "health.http_status",
            lambda: f"GET {path} answered HTTP {resp.status_code}: {resp.text[:200]!r}")
    refuse_html(resp, f"GET {path}")  # a login portal's 200 is not a healthy deployment
    return resp


def expected_workers(target: Target, reduced_to: Mapping[str, int] | None = None) -> tuple[dict[str, int], str]:
    """How many worker instances per role /health must list, and who says so: the target's topology, or what an
    embedded deployment that could not hold the whole topology here started instead (its report and
    ``summary.json`` name the reduction, so the check holds the deployment to what it really is)."""
    if target.topology_kind == "disagg":
        declared = {"prefill": target.topology.prefill_workers, "decode": target.topology.decode_workers}
    else:
        declared = {"worker": target.topology.workers}
    if reduced_to is None:
        return declared, "the target has"
    return ({role: int(reduced_to.get(role, n)) for role, n in declared.items()},
            "the embedded deployment (reduced from the target's topology) started")


def _short_roles(health: Any, want: Mapping[str, int], who: str) -> list[str]:
    """The disaggregation roles with fewer listed worker instances than wanted, one phrase each."""
    listed = role_instance_ids(health)
    return [f"{len(listed[role])} {role} worker instance(s) {sorted(listed[role], key=str)}, {who} {n}"
            for role, n in want.items() if len(listed[role]) < n]


@fails_with("health.frontend_unhealthy", "the Dynamo frontend's /health does not say healthy")
@fails_with("health.no_worker", "the Dynamo frontend lists no worker instance")
@fails_with("health.workers_missing", "fewer worker instances (of a role) registered than the deployment has")
def assert_dynamo_workers_registered(resp: httpx.Response, path: str, target: Target,
                                     reduced_to: Mapping[str, int] | None = None) -> None:
    """The Dynamo frontend's /health is healthy and lists at least the expected workers (per role when disagg;
    :func:`expected_workers`)."""
    body = decode_json(resp, f"GET {path}")
    require(body.get("status") in ("healthy", "ready"), "health.frontend_unhealthy",
            lambda: f"Dynamo frontend not healthy: {body}")
    workers = worker_instance_ids(body)
    require(workers, "health.no_worker", lambda: f"the Dynamo frontend is up but serves no worker: /health lists no "
                                                 f"'generate' instance ({body})")
    want, who = expected_workers(target, reduced_to)
    if target.topology_kind == "disagg":
        short = _short_roles(body, want, who)
        require(not short, "health.workers_missing",
                lambda: f"/health lists {'; '.join(short)}: not every worker registered")
        return
    require(len(workers) >= want["worker"], "health.workers_missing",
            lambda: f"/health lists {len(workers)} worker instance(s) {sorted(workers)}, {who} {want['worker']} "
                    f"workers: not every worker registered")


@fails_with("health.engine_unreachable", "the engine behind the proxy cannot be reached to ask its own health")
@fails_with("health.engine_unhealthy", "the engine behind the proxy answers its health path with other than 200")
def assert_engine_behind_proxy_healthy(endpoint: Endpoint, target: Target, engine_path: str) -> None:
    """The engine behind the proxy answers its own health path with 200 (the proxy's liveness proves nothing)."""
    proxy = target.serving.proxy.kind if target.serving.proxy else "(none)"
    engine_root = endpoint.engine_root_url
    require(engine_root != endpoint.root_url, "health.engine_unreachable", lambda: (
        f"cannot reach the engine behind the {proxy} proxy to check its health: set "
        f"{target.endpoint.metrics_url_env} to the engine's /metrics URL"))
    resp = httpx.get(engine_root + engine_path, headers=endpoint.auth_headers(), timeout=HEALTH_TIMEOUT_S)
    require(resp.status_code == 200, "health.engine_unhealthy",
            lambda: f"engine GET {engine_path} behind the proxy answered HTTP {resp.status_code} (the proxy's "
                    f"liveness said 200): engine not healthy")
    refuse_html(resp, f"engine GET {engine_path}")
