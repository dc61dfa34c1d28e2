"""Restart measured from what the engines did and judged against the proxy's retry window
(LiteLLM's backoff): recovery never counts an answer of the old engine, the simulator's outage is the target's
modelled figure, and the no-client-error message sets the outage beside what LiteLLM's retries bridge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.checks.restart import (
    assert_client_errors_as_allowed,
    assert_recovery_within_limit,
)
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.control import SimController
from pytest_ml4.control.scenario import (
    RequestOutcome,
    RestartRun,
    SingleReplicaOutage,
    StaleInstances,
    Timeline,
    build_timeline,
    run_restart_scenario,
)
from pytest_ml4.stacks.litellm import ProxySettings, RetryWindow
from pytest_ml4.target.model import load_target

#: The modelled outage and the stop delay of the scenario below: the old engine serves 0.3 s after the trigger
#: (systemd's stop delay), then the port stays closed 4 s (once reported: "recovery 0.70 s" for "about 4 s of outage").
OUTAGE_S = 4.0
STOP_DELAY_S = 0.3
TARGET = load_target("rtxpro6000-tp8", overrides={"sim": {"restart_outage_s": OUTAGE_S}})


@pytest.fixture(scope="module")
def delayed_run(rtx_api_key: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RestartRun, Path]]:
    log = tmp_path_factory.mktemp("sim") / "engine.log"
    with SimServer(TARGET, faults=[f"delayed_stop={STOP_DELAY_S}"], log_file=log) as sim:
        ep = Endpoint(base_url=sim.base_url, api_key=rtx_api_key, model="ml4")
        ctl = SimController(sim, "ml4", api_key=rtx_api_key, timeout_s=120)
        yield run_restart_scenario(ctl, ep, with_streams=False, recovery_limit_s=120), log


def test_recovery_counts_the_new_engine_only(delayed_run: tuple[RestartRun, Path]) -> None:
    run, _ = delayed_run
    tl = run.timeline
    # Judged from what a real vLLM server offers (its process start time on /metrics), not the simulator's header.
    assert tl is not None and tl.evidence.startswith("per request: the engine's process_start_time_seconds"), \
        run.report()
    # The old engine answered after the trigger (it kept serving through the stop delay) ...
    assert tl.last_old_s is not None, run.report()
    assert any(r.ok and r.engine == tl.old_engine for r in run.requests), run.report()
    # ... but recovery is the new engine's first answer: after the stop delay and the whole modelled outage.
    assert tl.new_engine not in (None, tl.old_engine), run.report()
    assert run.recovery_s is not None and run.recovery_s >= STOP_DELAY_S + OUTAGE_S, run.report()
    assert tl.first_new_s is not None and tl.first_new_s > tl.last_old_s, run.report()


def test_timeline_report_names_both_engines(delayed_run: tuple[RestartRun, Path]) -> None:
    run, _ = delayed_run
    text = run.timeline_report()
    assert run.timeline is not None
    assert f"old engine {run.timeline.old_engine}: last answer +" in text
    assert f"new engine {run.timeline.new_engine}: first answer +" in text
    assert "outage (old engine's last answer to new engine's first)" in text


def test_the_new_engine_boots_after_the_old_one_exits(delayed_run: tuple[RestartRun, Path]) -> None:
    # The standby process logs nothing until it is released: the log reads like a real restart.
    run, log = delayed_run
    assert run.timeline is not None and run.timeline.old_engine and run.timeline.new_engine
    assert run.restart is not None
    old_pid, new_pid = run.restart.details["old_pid"], run.restart.details["new_pid"]
    text = log.read_text()
    assert text.index(f"Finished server process [{old_pid}]") < text.index(f"Started server process [{new_pid}]")


def test_recovery_over_the_limit_fails_with_the_timeline(delayed_run: tuple[RestartRun, Path]) -> None:
    run, _ = delayed_run
    with pytest.raises(AssertionError, match=r"recovery took .* new engine's first answer.*limit of 1 s") as err:
        assert_recovery_within_limit(run, limit_s=1.0)
    assert "old engine" in str(err.value)


# ----------------------------------------------------------------------------------------------- retry window
def _window(num_retries: int) -> RetryWindow:
    target = load_target("rtxpro6000-tp8")
    return RetryWindow.from_settings(ProxySettings.from_target(target, "http://engine/v1", num_retries=num_retries))


def test_retry_window_agrees_with_the_recorded_litellm_behaviour() -> None:
    # tooling.md §3.5, LiteLLM 1.108.7, num_retries 2, dead backend: attempt gaps 0.62 s and 1.46 s, error after 4.2 s
    # (the router sleeps once more after the last retry before raising).
    w = _window(2)
    for k, gap in ((1, 0.62), (2, 1.46)):
        assert w.sleep_before(k, 0.0) <= gap <= w.sleep_before(k, 1.0)
    assert w.bridged_s + w.sleep_before(3, 0.0) <= 4.2 <= w.bridged_max_s + w.sleep_before(3, 1.0)
    assert _window(0).bridged_s == 0.0


def _run_with(outage: tuple[float, float], failed: list[RequestOutcome]) -> RestartRun:
    last_old, first_new = outage
    ok = [RequestOutcome(0, 0.0, last_old, 200, 0, None, engine="old"),
          RequestOutcome(9, first_new - 0.1, 0.1, 200, 2, None, engine="new")]
    run = RestartRun("sim", None, "not needed", 0.0, requests=ok + failed)
    run.timeline = build_timeline("old", run.requests)
    return run


def test_a_peer_not_yet_replaced_is_not_a_recovery() -> None:
    """A rolling restart of two Dynamo workers: the warm-up met worker "a", "b" serves until its own turn; only the
    replacement "c" (a new instance id) is a new engine. Counting "b" would report recovery at +0.3 s."""
    answers = [RequestOutcome(0, 0.0, 0.3, 200, None, None, engine="b"),
               RequestOutcome(1, 3.0, 0.2, 200, None, None, engine="b"),
               RequestOutcome(2, 8.0, 0.2, 200, None, None, engine="c")]
    tl = build_timeline("a", answers, frozenset({"a", "b"}))
    assert (tl.new_engine, tl.first_new_s, tl.last_old_s, tl.old_peers) == ("c", 8.2, 3.2, ("b",))
    assert "old engine a (and its peers b): last answer +3.20 s" in tl.lines()
    assert build_timeline("a", answers).first_new_s == 0.3   # without the peers, "b" would look new


def test_client_error_message_says_the_outage_exceeded_the_retry_window() -> None:
    run = _run_with((0.5, 6.5), [RequestOutcome(3, 1.0, 4.0, 500, None, "litellm.InternalServerError: ...")])
    assert run.timeline == Timeline("old", "new", 0.5, 6.5, "per request: the answers")
    with pytest.raises(AssertionError) as err:
        assert_client_errors_as_allowed(run, allowed=False, retry_window=_window(3))
    msg = str(err.value)
    assert "measured outage 6.00 s" in msg and "exceeded the proxy's retry window of 3.5 s by 2.5 s" in msg
    assert "num_retries=3" in msg


def test_client_error_message_says_when_the_outage_was_within_the_window() -> None:
    run = _run_with((0.5, 2.5), [RequestOutcome(3, 1.0, 0.1, 500, None, "litellm.InternalServerError: ...")])
    with pytest.raises(AssertionError, match=r"measured outage 2.00 s .* was within the proxy's retry window of 3.5 s"):
        assert_client_errors_as_allowed(run, allowed=False, retry_window=_window(3))


# Recorded real 1.6.1 bodies (real-dynamo-vllm-1.6.1-transcripts/kv/after-kill-requests.txt), quoted as the
# scenario quotes a body.
NOT_READY = ("'{\"message\":\"Model `mistral-large-4` is not ready to serve requests yet. The deployment may still "
             "be starting up or is not fully provisioned. Please retry shortly.\",\"type\":\"Service Unavailable\","
             "\"code\":503}'")
TEMPORARILY = '\'{"message":"Service temporarily unavailable","type":"Service Unavailable","code":503}\''


def test_dynamo_stale_instance_window_is_named() -> None:
    run = _run_with((0.5, 1.5), [RequestOutcome(3, 0.6, 0.01, 503, None, NOT_READY),
                                 RequestOutcome(4, 0.9, 0.01, 503, None, TEMPORARILY)])
    stale = StaleInstances.for_dynamo("1.6.1")
    with pytest.raises(AssertionError) as err:
        assert_client_errors_as_allowed(run, allowed=False, stale=stale)
    msg = str(err.value)
    assert ("2 of the failures are Dynamo 1.6.1's stale-instance answers (HTTP 503 'Service temporarily "
            "unavailable', HTTP 503 'is not ready to serve requests yet')") in msg
    assert "for 5-10 s while the gone worker stays listed; then HTTP 404 (any body)" in msg and "deregisters" in msg
    # A failure of another kind is not blamed on the stale window.
    other = _run_with((0.5, 1.5), [RequestOutcome(3, 0.6, 0.01, 500, None, "engine error")])
    with pytest.raises(AssertionError) as err2:
        assert_client_errors_as_allowed(other, allowed=False, stale=stale)
    assert "stale-instance" not in str(err2.value)


def test_no_instances_available_is_not_a_real_1_6_1_answer() -> None:
    """1.6.1 never answers "No instances available" (real-dynamo-vllm.md "Worker loss"): a body carrying it is
    not explained as the stale window, and neither table documents it."""
    made_up = RequestOutcome(3, 0.6, 0.01, 503, None, '\'{"error": "No instances available for mistral-large-4"}\'')
    assert StaleInstances.for_dynamo("1.6.1").explain([made_up]) is None
    outage = SingleReplicaOutage.for_target(load_target("vr200-disagg"))
    assert outage is not None and not outage.documented(made_up)


def test_error_after_restart_breaks_only_the_engine_of_that_restart(rtx_api_key: str, tmp_path: Path) -> None:
    """Fault ``error_after_restart=2``: the first engine and the first restart's engine answer, the second
    restart's engine answers 500 (the kill matrix's killer of ``test_smoke_chat_after_restart``)."""
    import httpx

    fast = load_target("rtxpro6000-tp8", overrides={"sim": {"restart_outage_s": 0.1, "ttft_s": 0.005,
                                                            "itl_ms": 0.2}})
    body = {"model": "ml4", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    statuses = []
    with SimServer(fast, faults=["error_after_restart=2"], log_file=tmp_path / "engine.log") as sim:
        for restart in range(3):
            if restart:
                sim.restart()
            reply = httpx.post(f"{sim.base_url}/chat/completions", json=body, timeout=60,
                               headers={"Authorization": f"Bearer {rtx_api_key}"})
            statuses.append(reply.status_code)
    assert statuses == [200, 200, 500]


@pytest.mark.parametrize(("before", "after", "answered"), [
    ("a", "a", "a"),        # the same engine on both sides
    (None, "b", "b"),       # nothing ran at send time: only a new engine can have answered
    ("a", None, "a"),       # it answered, then stopped
    ("a", "b", None),       # the engine changed during the request: unknown
    (None, None, None),
])
def test_the_incarnation_that_answered(before: str | None, after: str | None, answered: str | None) -> None:
    from pytest_ml4.control.scenario import incarnation_answered

    assert incarnation_answered(before, after) == answered
