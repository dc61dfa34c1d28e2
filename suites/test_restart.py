"""Restart resilience: what clients see while the engine restarts, and that it comes back whole.

Two restarts per session (module fixtures, in order):

1. with long streams in flight: each stream must complete or end with an error the client can detect
   (tooling.md §3.6), and the suite reports which;
2. with short requests sent throughout: where the target allows no client-visible error
   (``gates.restart_client_errors_allowed: false``, seed 000 open item 2) every one must succeed — through a LiteLLM
   proxy thanks to its retries, counted from ``x-litellm-attempted-retries``, the measured outage set beside the
   proxy's retry window; recovery (trigger to the first answer of the *new* engine, per request evidence of which
   engine answered) must stay under ``gates.recovery_time_s_max``.

Afterwards: a fresh boot in the engine log, the KV pool and the no-OOM verdicts of ``pytest_ml4.checks.kv`` again,
and a smoke chat. Dynamo targets add session affinity, prefix reuse, and for disagg the prefill -> decode handoff
and the model leaving and returning to ``/v1/models`` while the prefill pods are gone (dynamo.md §3, §5).
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_ml4.checks.codes import fail, fails_with, require
from pytest_ml4.checks.kv import (
    kv_pool_verdict,
    max_concurrency_verdict,
    no_failures_verdict,
)
from pytest_ml4.checks.restart import (
    assert_client_errors_as_allowed,
    assert_in_flight_streams_ended_detectably,
    assert_recovery_within_limit,
    assert_restart_finished,
    assert_scenario_judgeable,
)
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.client.endpoint import Endpoint, make_httpx
from pytest_ml4.control.base import RestartError
from pytest_ml4.control.budget import RestartBudget, pods_replaced_in_turn
from pytest_ml4.control.scenario import (
    RestartRequests,
    RestartRun,
    SingleReplicaOutage,
    StaleInstances,
    load_requests,
    probe_body,
    retries_seen,
    send_probe,
)
from pytest_ml4.logs import LogView, ServerStart
from pytest_ml4.report.attach import attach_text
from pytest_ml4.stacks import stack_for
from pytest_ml4.stacks.litellm import ProxySettings, RetryWindow
from pytest_ml4.target.model import Target

pytestmark = [pytest.mark.restart, pytest.mark.exclusive]  # other tests must not see the engine go away


@pytest.fixture(scope="module")
def restart_spec() -> RestartRequests:
    return load_requests()


def _views(reader: Any, target: Target) -> list[tuple[LogView, Target]]:
    """One log view per engine (per worker pod for Kubernetes), with the engine config it runs."""
    if hasattr(reader, "pods"):
        from pytest_ml4.logs.signatures import last_boot_start

        out = []
        for pod in reader.pods():
            records = reader.read_pod(pod, current_only=True)
            role = pod.metadata.labels.get("nvidia.com/dynamo-component-type", "")
            runs = target.model_copy(update={"engine": target.prefill_engine}) \
                if role == "prefill" and target.prefill_engine else target
            out.append((LogView(records[last_boot_start(records):], f"pod {pod.metadata.name}"), runs))
        return out
    return [(LogView(reader.since_last_boot(), reader.describe()), target)]


@pytest.fixture(scope="module")
def kv_before(ml4_restart_logs: Any, ml4_target: Target) -> dict[str, bool]:
    """The KV verdicts of the running engines before any restart (a restart must not make them worse)."""
    verdicts = {}
    for view, runs in _views(ml4_restart_logs, ml4_target):
        verdicts["kv_pool"] = verdicts.get("kv_pool", True) and kv_pool_verdict(view, runs).ok
        verdicts["kv_max_concurrency"] = (verdicts.get("kv_max_concurrency", True)
                                          and max_concurrency_verdict(view, runs).ok)
    return verdicts


@pytest.fixture(scope="module")
def restart_budget(ml4_restart_controller: Any, ml4_target: Target, ml4_proxy: Any,
                   restart_spec: RestartRequests) -> RestartBudget:
    """Each restart scenario's bounds, derived from the target (README "Deadlines")."""
    window = _retry_window(ml4_target, ml4_proxy)
    return RestartBudget.for_target(ml4_target, pods=pods_replaced_in_turn(ml4_restart_controller),
                                    retry_window_s=window.bridged_s if window else 0.0,
                                    probe_max_tokens=restart_spec.probe.max_tokens)


STREAMS_SCENARIO = "restart with streams in flight"
REQUESTS_SCENARIO = "restart with new requests"


def _scenario(label: str, controller: Any, endpoint: Endpoint, target: Target, spec: RestartRequests,
              budget: RestartBudget, progress: Any, **kind: bool) -> RestartRun:
    from pytest_ml4.control.scenario import run_restart_scenario

    progress(f"[ml4 restart] {label}: bound {budget.describe()}")
    run = run_restart_scenario(controller, endpoint, spec=spec, recovery_limit_s=target.gates.recovery_time_s_max,
                               budget=budget, progress=lambda line: progress(f"[ml4 restart] {label} {line}"),
                               **kind)
    print(run.report())
    return run


@pytest.fixture(scope="module")
def streams_run(ml4_restart_controller: Any, ml4_restart_endpoint: Endpoint, ml4_target: Target,
                restart_spec: RestartRequests, kv_before: dict[str, bool], restart_budget: RestartBudget,
                ml4_restart_progress: Any) -> RestartRun:
    return _scenario(STREAMS_SCENARIO, ml4_restart_controller, ml4_restart_endpoint, ml4_target, restart_spec,
                     restart_budget, ml4_restart_progress, with_requests=False)


@pytest.fixture(scope="module")
def requests_run(streams_run: RestartRun, ml4_restart_controller: Any, ml4_restart_endpoint: Endpoint,
                 ml4_target: Target, restart_spec: RestartRequests, restart_budget: RestartBudget,
                 ml4_restart_progress: Any) -> RestartRun:
    if streams_run.timed_out is not None or streams_run.not_run:
        # The deployment did not come back from the first restart: a second one would wait out its bound again.
        why = streams_run.not_run or (f"the {STREAMS_SCENARIO} before it failed {streams_run.timed_out.phase} "
                                      f"(last seen: {streams_run.timed_out.last_seen})")
        return RestartRun.skipped(getattr(ml4_restart_controller, "kind", "?"), why)
    return _scenario(REQUESTS_SCENARIO, ml4_restart_controller, ml4_restart_endpoint, ml4_target, restart_spec,
                     restart_budget, ml4_restart_progress, with_streams=False)


def test_in_flight_streams_end_detectably(streams_run: RestartRun, record_property: Any) -> None:
    """Streams running when the restart begins complete or end with an error the client can see."""
    attach_text(streams_run.report(), "restart with streams in flight")
    result = assert_restart_finished(streams_run)
    counts = assert_in_flight_streams_ended_detectably(streams_run)
    record_property("restart_in_flight_streams", counts)
    print(f"in-flight streams during the restart: {counts} ({result.summary()})")
    for s in streams_run.streams:
        print("  " + s.line())


def _retry_window(target: Target, proxy: Any) -> RetryWindow | None:
    """What the proxy's retries bridge: the target's proxy config with the retries of the proxy started here."""
    if target.serving.proxy is None or target.serving.bypassed_proxy is not None:
        return None
    return RetryWindow.from_settings(ProxySettings.from_target(target, backend_base_url="http://engine/v1",
                                                               num_retries=getattr(proxy, "num_retries", None)))


@fails_with("restart.no_retry", "no request during the restart needed the proxy's retry: the check crossed no outage")
def test_new_requests_during_restart(requests_run: RestartRun, ml4_target: Target, ml4_restart_endpoint: Endpoint,
                                     ml4_proxy: Any, record_property: Any) -> None:
    """New requests during the restart succeed where the target allows no client error (a proxy retries them)."""
    attach_text(requests_run.report(), "restart with new requests")
    assert_restart_finished(requests_run)
    allowed = ml4_target.gates.restart_client_errors_allowed
    bypassed = ml4_target.serving.bypassed_proxy
    if bypassed is not None and not allowed:
        not_judged(f"--ml4-no-proxy: the target's no-client-error gate counts on its {bypassed.kind} proxy retrying "
                   f"across the restart, and this run goes around the proxy")
    release = stack_for(ml4_target).release(ml4_target)
    stale = StaleInstances.for_dynamo(release) if release else None
    failed = assert_client_errors_as_allowed(requests_run, allowed, retry_window=_retry_window(ml4_target, ml4_proxy),
                                             stale=stale, outage=SingleReplicaOutage.for_target(ml4_target))
    retries = retries_seen(requests_run)
    record_property("restart_requests", len(requests_run.requests))
    record_property("restart_requests_failed", len(failed))
    record_property("litellm_attempted_retries", retries)
    print(f"{len(requests_run.requests)} requests during the restart, {len(failed)} failed, "
          f"x-litellm-attempted-retries total {retries}")
    if ml4_restart_endpoint.proxy and not allowed:
        # Every request succeeded: prove they really crossed the outage (else the check measured nothing).
        require(retries > 0, "restart.no_retry",
                lambda: "no request needed a retry: none was sent while the engine was down, so the "
                        "no-client-error check proved nothing\n" + requests_run.report())


def test_recovery_time(requests_run: RestartRun, ml4_target: Target, record_property: Any) -> None:
    """Trigger to the first answer of a new engine (never one of the old engine) within the target's limit."""
    attach_text(requests_run.timeline_report(), "restart timeline: old engine's last answer, new engine's first")
    assert_scenario_judgeable(requests_run, REQUESTS_SCENARIO)
    took = assert_recovery_within_limit(requests_run, ml4_target.gates.recovery_time_s_max)
    record_property("restart_recovery_s", round(took, 2))
    if requests_run.timeline and requests_run.timeline.outage_s is not None:
        record_property("restart_outage_s", round(requests_run.timeline.outage_s, 2))
    print(f"recovery {took:.2f} s (limit {ml4_target.gates.recovery_time_s_max:.0f} s)")


@fails_with("restart.no_fresh_boot", "the engine log shows no boot after the restart")
def test_fresh_boot_in_logs(requests_run: RestartRun, ml4_restart_logs: Any, ml4_target: Target) -> None:
    """Every engine's log shows a boot that started after the restart began."""
    assert_scenario_judgeable(requests_run, REQUESTS_SCENARIO)
    for view, _ in _views(ml4_restart_logs, ml4_target):
        start = view.first(ServerStart)
        if start is None:
            fail("restart.no_fresh_boot",
                 f"no server-start line since the last boot of {view.source}:\n{view.tail(15)}")
        # vLLM stamps have one-second resolution: allow that much before the trigger.
        if not (start.time is not None and start.time >= requests_run.triggered_wall - 1.0):
            fail("restart.no_fresh_boot",
                 f"the last boot in {view.source} predates the restart (boot at {start.time}, restart at "
            f"{requests_run.triggered_wall:.0f}): {start.quote}")


@fails_with("restart.kv_after_restart",
            "after the restart the KV pool falls short or the log shows an OOM or engine death")
def test_kv_pool_and_no_oom_after_restart(requests_run: RestartRun, ml4_restart_logs: Any, ml4_target: Target,
                                          kv_before: dict[str, bool]) -> None:
    """The KV verdicts of ``pytest_ml4.checks.kv`` after the restart: no failure line, no verdict worse than before."""
    assert_scenario_judgeable(requests_run, REQUESTS_SCENARIO)
    problems = []
    for view, runs in _views(ml4_restart_logs, ml4_target):
        for verdict in (no_failures_verdict(view), kv_pool_verdict(view, runs), max_concurrency_verdict(view, runs)):
            print(f"[{view.source}] {verdict.name}: {'ok' if verdict.ok else 'FAIL'}: {verdict.message}")
            if not verdict.ok and kv_before.get(verdict.name, True):
                problems.append(f"[{view.source}] {verdict.name}: {verdict.message}")
    require(not problems, "restart.kv_after_restart", lambda: "after the restart:\n" + "\n".join(problems))


@fails_with("restart.chat_failed", "a chat after the restart failed")
@fails_with("restart.chat_wrong_answer", "a chat after the restart answered wrongly")
def test_smoke_chat_after_restart(requests_run: RestartRun, ml4_restart_endpoint: Endpoint,
                                  restart_spec: RestartRequests) -> None:
    assert_scenario_judgeable(requests_run, REQUESTS_SCENARIO)
    probe = restart_spec.probe
    with make_httpx(ml4_restart_endpoint) as http:
        reply = send_probe(http, probe_body(ml4_restart_endpoint.model, probe), probe.expect_substring)
    require(reply.status == 200 and reply.error is None, "restart.chat_failed",
            lambda: f"chat after the restart failed: HTTP {reply.status}: "
                    f"{reply.error}")
    require(reply.ok, "restart.chat_wrong_answer",
            lambda: f"chat after the restart answered without {probe.expect_substring!r}")


# ----------------------------------------------------------------------------------------------- Dynamo
@pytest.mark.dynamo
def test_prefix_reused_after_restart(requests_run: RestartRun, ml4_restart_endpoint: Endpoint, ml4_target: Target,
                                     restart_spec: RestartRequests) -> None:
    """A continuation reuses the cached prefix by the router's own figures (pytest_ml4.checks.dynamo)."""
    assert_scenario_judgeable(requests_run, REQUESTS_SCENARIO)
    from pytest_ml4.checks.dynamo import assert_prefix_reused
    from pytest_ml4.control.dynamo import run_conversation

    cached = assert_prefix_reused(run_conversation(ml4_restart_endpoint, restart_spec.conversation),
                                  ml4_target.engine.block_size)
    print(f"continuation reused {cached} cached tokens")


@pytest.mark.dynamo
@pytest.mark.replicas("kv_routed", 2, why="affinity is observable only between two workers the KV router chooses "
                                          "from")
def test_session_affinity(requests_run: RestartRun, ml4_restart_endpoint: Endpoint, ml4_target: Target,
                          restart_spec: RestartRequests) -> None:
    """A session stays on its worker even where KV routing would move it (pytest_ml4.checks.dynamo)."""
    assert_scenario_judgeable(requests_run, REQUESTS_SCENARIO)
    from pytest_ml4.checks.dynamo import assert_session_affinity
    from pytest_ml4.control.dynamo import run_affinity_probe

    probe = run_affinity_probe(ml4_restart_endpoint, restart_spec.affinity, topology=ml4_target.topology.kind)
    if probe.not_applicable:  # the target declares two workers, but /health shows fewer: evidence missing
        not_judged(f"affinity not observable: {probe.not_applicable}")
    worker = assert_session_affinity(probe)
    print(f"session pinned to worker {worker} against its cached prefix on {probe.other_worker}")


@pytest.mark.disagg
@fails_with("dynamo.turn_failed")
def test_disagg_prefill_decode_handoff(requests_run: RestartRun, ml4_restart_endpoint: Endpoint,
                                       restart_spec: RestartRequests) -> None:
    assert_scenario_judgeable(requests_run, REQUESTS_SCENARIO)
    from pytest_ml4.checks.dynamo import assert_prefill_decode_handoff
    from pytest_ml4.control.dynamo import frontend_instances, run_conversation

    turns = run_conversation(ml4_restart_endpoint, restart_spec.conversation)
    failed = [t for t in turns if t.error]
    require(turns and not failed, "dynamo.turn_failed",
            lambda: f"request failed: {failed[0].line() if failed else 'no turn'}")
    for n, (prefill, decode) in enumerate(assert_prefill_decode_handoff(
            turns, frontend_instances(ml4_restart_endpoint.root_url)), 1):
        print(f"turn {n}: prefilled on instance {prefill}, decoded on instance {decode}")


@pytest.mark.disagg
@fails_with("restart.model_not_unlisted", "the model stayed in /v1/models while no prefill worker could serve it")
@fails_with("restart.model_not_back", "the model did not come back to /v1/models after the prefill pods were replaced")
def test_model_leaves_and_returns_while_prefill_pods_gone(requests_run: RestartRun, ml4_restart_controller: Any,
                                                          ml4_restart_endpoint: Endpoint,
                                                          restart_budget: RestartBudget) -> None:
    """With every prefill pod deleted the model is hidden (incomplete worker set), then listed again."""
    assert_scenario_judgeable(requests_run, REQUESTS_SCENARIO)
    from pytest_ml4.control.dynamo import watch_model_visibility
    from pytest_ml4.control.k8s_restart import KubernetesController

    if not isinstance(ml4_restart_controller, KubernetesController):
        raise RestartError(f"disaggregated targets restart through Kubernetes, got {ml4_restart_controller!r}")
    # Every prefill pod at once: one worker start time, then the first answer's allowance.
    vis = watch_model_visibility(ml4_restart_controller, ml4_restart_endpoint, "prefill",
                                 timeout_s=restart_budget.worker_start_s + restart_budget.first_answer_s)
    print(f"deleted {vis.deleted}; /v1/models states seen: {vis.seen}")
    require(vis.left_after_s is not None, "restart.model_not_unlisted",
            lambda: f"the model stayed in /v1/models while the prefill pods {vis.deleted} were "
                    f"gone (states seen: {vis.seen})")
    require(vis.returned_after_s is not None, "restart.model_not_back",
            lambda: f"the model did not come back to /v1/models after the prefill pods "
                    f"{vis.deleted} were replaced (states seen: {vis.seen})")
    print(f"model left /v1/models after {vis.left_after_s:.2f} s, returned after {vis.returned_after_s:.2f} s")


@pytest.mark.dynamo
@pytest.mark.embedded_only(why="on a cluster the restart suite deletes pods, whose workers drain on SIGTERM "
                               "instead of crashing")
@pytest.mark.replicas("stream", 2, why="a crashed stream needs another worker to migrate to; the outage is "
                                       "test_new_requests_during_restart's")
def test_worker_crash_under_a_stream(requests_run: RestartRun, ml4_dynamo_deployment: Any,
                                     ml4_restart_endpoint: Endpoint, restart_spec: RestartRequests,
                                     record_property: Any, ml4_target: Target,
                                     restart_budget: RestartBudget) -> None:
    """A worker SIGKILLed under a running stream (a crash: no deregistration, no drain): with the frontend's
    ``--migration-limit`` the stream continues on another worker, without it the client gets Dynamo's in-band
    error event; the processes the killed worker leaves behind are found, ended and named in the timeline.
    Not where the role holding the stream has one replica (vr200-agg's one worker, vr200-disagg's one decode
    worker): there is no other worker to continue on, the crash is the single-replica outage
    test_new_requests_during_restart judges."""
    assert_scenario_judgeable(requests_run, REQUESTS_SCENARIO)
    from pytest_ml4.checks.restart import assert_stream_survives_worker_crash
    from pytest_ml4.control.crash import run_crash

    run = run_crash(ml4_restart_endpoint, ml4_dynamo_deployment, restart_spec.crash,
                    ml4_dynamo_deployment.frontend.migration_limit,
                    recover_s=restart_budget.worker_start_s + restart_budget.first_answer_s)
    attach_text(run.report(), "worker crash timeline: the worker killed, the stream migrated or ended")
    print(run.report())
    if run.crash is not None:
        record_property("crash_killed_worker", f"{run.crash.worker} pid {run.crash.pid}")
        record_property("crash_leftover_processes", run.crash.leftovers)
    print(assert_stream_survives_worker_crash(run))
