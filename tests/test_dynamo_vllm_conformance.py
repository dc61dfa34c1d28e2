"""The simulated-engine Dynamo deployment against the real one: one request set
(``fixtures/dynamo/conformance.yaml``) sent to the real 1.6.1 frontend in front of one simulated worker, then in
front of one real ``dynamo.vllm`` worker; every shape the suites read must agree (status codes, body keys, null vs
absent, value types, each stream chunk kind, finish reasons, error message/type/code, the worker's ``vllm:*``
metric families and the log signatures its log matches), except the differences the fixture lists with a reason.

Before each deployment is torn down its worker is SIGKILLed under a stream (migration off): on the real worker that
proves in CI what a worker crash shows (1.6.1's in-band error event, the orphaned EngineCore/Worker found and ended).

CI cost: one real worker (vr200-agg, ~3.7 GiB) booting once, 1-6 min on 2 loaded cores, plus a simulated worker
for seconds; the two deployments run one after the other, never together.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from checkout import FIXTURES_DIR
from pytest_ml4_sim.deploy.conformance import (
    Observation,
    differences,
    load_conformance,
    log_signatures,
    metric_families,
)
from pytest_ml4_sim.deploy.dynamo import DynamoDeployment, DynamoSim
from pytest_ml4_sim.deploy.real_vllm import tiny_overrides

from pytest_ml4.checks.restart import assert_stream_survives_worker_crash
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.control.crash import CrashRun, run_crash
from pytest_ml4.control.scenario import load_requests
from pytest_ml4.runtime.installed import (
    DYNAMO_VLLM_ENGINE_VERSION,
    ToolMissing,
    dynamo_python,
    dynamo_vllm_python,
)
from pytest_ml4.target.model import deep_merge, load_target

try:
    dynamo_python()
    dynamo_vllm_python()
except ToolMissing as err:  # both install steps are part of scripts/install.sh; CI always has them
    pytest.skip(str(err), allow_module_level=True)

from pytest_ml4_sim.deploy.real_dynamo import RealDynamoDeployment

DATA = load_conformance(FIXTURES_DIR / "dynamo" / "conformance.yaml")
#: Dynamo 1.6.1 declared and no emulation: both workers write Mistral Large 4's own output.
TARGET = load_target("vr200-agg", overrides=deep_merge(tiny_overrides(), {
    "engine": {"version": DYNAMO_VLLM_ENGINE_VERSION}, "serving": {"dynamo_version": "1.6.1"}}))
MODEL = TARGET.serving.served_model_name
CRASH = load_requests().crash


def _fill(obj: Any, context: int) -> Any:
    if isinstance(obj, str):
        return obj.replace("{model}", MODEL).replace("{overlong}", "word " * (context + 200))
    if isinstance(obj, dict):
        return {k: _fill(v, context) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, context) for v in obj]
    return obj


def _send(dep: DynamoDeployment, request: dict[str, Any]) -> Observation:
    context = int(TARGET.engine.max_model_len)
    url = dep.frontend.url + request.get("path", "/v1/chat/completions")
    if "raw" in request:
        content = _fill(request["raw"], context)
    else:
        content = json.dumps(_fill(request["body"], context)) if "body" in request else None
    r = httpx.request(request.get("method", "POST"), url, content=content, timeout=300,
                      headers={"Content-Type": "application/json"})
    return Observation.of(r.status_code, r.text)


def _observe(dep: DynamoDeployment) -> dict[str, Any]:
    out: dict[str, Any] = {name: _send(dep, req).compared() for name, req in DATA.requests.items()}
    worker = dep.workers[0]
    # One path per family / signature, so a difference names it.
    families = metric_families(httpx.get(worker.metrics_url, timeout=10).text)
    out["metrics"] = {"families": dict.fromkeys(sorted(families), "present")}
    signatures = log_signatures(worker.log_file.read_text(errors="replace"))
    out["logs"] = {"signatures": dict.fromkeys(sorted(signatures), "present")}
    return out


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Both deployments' observations, the simulated one first (they never run together); before it is torn down,
    the real worker is SIGKILLed under a stream (migration off: one worker, no peer) for the crash checks below."""
    seen: dict[str, dict[str, Any]] = {}
    for kind, make in (("sim", lambda d: DynamoSim(TARGET, log_file=d / "engine.log", bridge=False, agg_workers=1,
                                                   migration_limit=0)),
                       ("real", lambda d: RealDynamoDeployment(TARGET, log_file=d / "engine.log", bridge=False,
                                                               migration_limit=0))):
        dep = make(tmp_path_factory.mktemp(kind))
        try:
            dep.start(timeout=900)
            seen[kind] = _observe(dep)
            endpoint = Endpoint(base_url=dep.base_url, model=MODEL)
            seen[kind]["crash"] = run_crash(endpoint, dep, CRASH, dep.frontend.migration_limit, recover=False)
        finally:
            dep.stop()
    return seen


@pytest.fixture(scope="module")
def observed(deployments: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {kind: {k: v for k, v in seen.items() if k != "crash"} for kind, seen in deployments.items()}


def _diffs(observed: dict[str, dict[str, Any]]) -> dict[str, dict[str, tuple[Any, Any]]]:
    return {case: differences(observed["sim"][case], observed["real"][case]) for case in observed["real"]}


@pytest.mark.parametrize("case", [*sorted(DATA.requests), "metrics", "logs"])
def test_simulated_worker_matches_the_real_one(observed: dict[str, dict[str, Any]], case: str) -> None:
    diffs = differences(observed["sim"][case], observed["real"][case])
    unexplained = DATA.unexplained(case, diffs)
    lines = [f"  {path}: simulated {a!r}, real {b!r}" for path, (a, b) in unexplained.items()]
    assert not unexplained, (f"{case}: the simulated-engine deployment differs from real dynamo.vllm where "
                             f"{DATA.source} allows no difference:\n" + "\n".join(lines))


def test_every_allowed_difference_still_occurs(observed: dict[str, dict[str, Any]]) -> None:
    stale = DATA.stale({case: list(d) for case, d in _diffs(observed).items()})
    assert not stale, ("allowed differences that no longer occur (delete them from "
                       f"{DATA.source}): " + "; ".join(f"{a.case} {a.path}" for a in stale))


def test_the_request_set_exercises_what_the_suites_read(observed: dict[str, dict[str, Any]]) -> None:
    """The comparison is not vacuous: the real side answered the chat requests, streamed with usage, finished on
    length where cut, refused the bad requests, and exposed metrics and KV log lines."""
    real = observed["real"]
    assert real["plain_unary"]["status"] == 200 and real["length_cut"]["values"]["finish_reason"] == "length"
    assert "usage" in real["plain_stream_usage"]["body"]["stream"]
    assert {real[c]["status"] for c in ("unknown_model", "malformed_json", "max_tokens_zero")} >= {400, 404}
    assert "vllm:generation_tokens" in real["metrics"]["families"] or \
        "vllm:generation_tokens_total" in real["metrics"]["families"]
    assert "kv_cache_size" in real["logs"]["signatures"]


def test_real_worker_killed_under_a_stream_gives_dynamos_error_and_leaves_its_engine_processes(
        deployments: dict[str, dict[str, Any]]) -> None:
    """A worker crash on a real worker, in CI: SIGKILL of ``dynamo.vllm`` mid-stream without migration ends the
    stream with 1.6.1's in-band 503 event and ``[DONE]``; its EngineCore and Worker outlive it and are found, ended
    and named. The simulated worker's stream ends the same way (it leaves no process behind)."""
    real: CrashRun = deployments["real"]["crash"]
    assert "Service temporarily unavailable" in assert_stream_survives_worker_crash(real), real.report()
    assert real.crash is not None and any("EngineCore" in p for p in real.crash.leftovers), real.report()
    assert any("VLLM::Worker" in p for p in real.crash.leftovers), real.report()
    sim: CrashRun = deployments["sim"]["crash"]
    assert "Service temporarily unavailable" in assert_stream_survives_worker_crash(sim), sim.report()
