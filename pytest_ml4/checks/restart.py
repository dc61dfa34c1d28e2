"""Restart verdicts: what must hold while and after the target's engine (or its workers) restarts.

Each ``assert_*`` judges a :class:`~pytest_ml4.control.scenario.RestartRun` (what the scenario saw: streams in
flight, requests sent during the restart, which engine answered each) or a
:class:`~pytest_ml4.control.crash.CrashRun` (a stream whose worker was SIGKILLed) and raises AssertionError with
what the release manager reads, or NotJudged where the evidence is missing. Running them is
:mod:`pytest_ml4.control.scenario` and :mod:`pytest_ml4.control.crash`; nothing here needs pytest.
"""

from __future__ import annotations

from pytest_ml4.checks.codes import fail, fails_with
from pytest_ml4.checks.verdict import NotJudged
from pytest_ml4.control.base import RestartResult
from pytest_ml4.control.crash import ERROR_KEYS, CrashRun, stream_ending
from pytest_ml4.control.scenario import (
    RequestOutcome,
    RestartRun,
    SingleReplicaOutage,
    StaleInstances,
)
from pytest_ml4.stacks.litellm import RetryWindow

BAD_VERDICTS = ("silently_truncated",)


@fails_with("restart.phase_timeout", "the restart scenario ran past the bound of one of its phases")
@fails_with("restart.not_completed", "the restart did not complete")
def assert_restart_finished(run: RestartRun) -> RestartResult:
    """The scenario's own check: the restart completed within its bound. A scenario past its bound fails here
    naming its phase (once: the checks depending on it call :func:`assert_scenario_judgeable`); one not run is
    not judged."""
    if run.not_run:
        raise NotJudged(run.not_run)
    if run.timed_out is not None:
        fail("restart.phase_timeout", run.report())   # its first line is the phase that ran past its bound
    if run.restart is None:
        fail("restart.not_completed", f"the restart did not complete: {run.restart_error}\n{run.report()}")
    return run.restart


def assert_scenario_judgeable(run: RestartRun, scenario: str) -> RestartResult:
    """For the checks that depend on a scenario: not judged when it ran past its bound or was not run (its own
    check says why, once), else as :func:`assert_restart_finished`."""
    if run.not_run:
        raise NotJudged(run.not_run)
    if run.timed_out is not None:
        raise NotJudged(f"the {scenario} failed {run.timed_out.phase} (past its {run.timed_out.bound_s:.0f} s "
                        f"bound; last seen: {run.timed_out.last_seen})")
    return assert_restart_finished(run)


@fails_with("restart.scenario_invalid", "the streams the scenario judges were not running when the restart began")
@fails_with("restart.streams_cut_silently",
            "in-flight streams ended without a finish_reason, [DONE] or an error the client can see")
def assert_in_flight_streams_ended_detectably(run: RestartRun) -> dict[str, int]:
    """Every in-flight stream ended detectably (completed or a detected error); returns verdict counts."""
    counts: dict[str, int] = {}
    for s in run.streams:
        counts[s.verdict] = counts.get(s.verdict, 0) + 1
    not_in_flight = [s for s in run.streams if not s.in_flight_at_restart]
    if not_in_flight:
        fail("restart.scenario_invalid",
             "the scenario is invalid: these streams were not running when the restart began:\n"
                             + "\n".join(s.line() for s in not_in_flight))
    bad = [s for s in run.streams if s.verdict in BAD_VERDICTS]
    if bad:
        fail("restart.streams_cut_silently",
             "in-flight streams ended without a finish_reason, [DONE] or an error the client could "
                             "detect:\n" + "\n".join(s.line() for s in bad))
    return counts


@fails_with("restart.nothing_sent", "no request was sent during the restart: the scenario measured nothing")
@fails_with("restart.client_errors",
            "requests sent during the restart failed where the target allows no client-visible error")
@fails_with("restart.wrong_answers", "requests answered 200 during the restart with a wrong answer")
def assert_client_errors_as_allowed(run: RestartRun, allowed: bool, *, retry_window: RetryWindow | None = None,
                        stale: StaleInstances | None = None,
                        outage: SingleReplicaOutage | None = None) -> list[RequestOutcome]:
    """New requests during the restart: with ``allowed`` False every one must succeed; returns the failures.

    A failure message quotes what the client got, e.g. the LiteLLM proxy's
    ``litellm.InternalServerError ... Cannot connect to host`` body when retries are off, and sets the measured
    outage beside what the proxy's retries bridge (``retry_window``) saying which exceeded which; with ``stale``
    (Dynamo targets) it names the frontend's stale-instance window when the failures carry its answer. With
    ``outage`` (a role of one replica) the failures must be Dynamo's documented answers and the service recover.
    """
    if not run.requests:
        fail("restart.nothing_sent", "no request was sent during the restart: the scenario measured nothing")
    failed = [r for r in run.requests if not r.ok]
    if outage is not None and not allowed:
        _assert_single_replica_outage(outage, run, failed)
    elif failed and not allowed:
        first = failed[0]
        took = f"{run.restart.ready_s:.1f} s" if run.restart else f"too long ({run.restart_error})"
        why = [line for line in (_outage_beside_retry_window(run, retry_window), stale.explain(failed) if stale else None)
               if line]
        fail("restart.client_errors",
             f"{len(failed)} of {len(run.requests)} requests sent during the restart failed, but the target allows "
            f"no client-visible error during a restart (gates.restart_client_errors_allowed: false); the restart "
            f"took {took}.\n" + "".join(f"{line}\n" for line in why) + f"first failure: HTTP {first.status}: "
            f"{first.error}\n" + "\n".join(r.line() for r in run.requests))
    wrong = [r for r in run.requests if r.ok and not r.answer_ok]
    if wrong:
        fail("restart.wrong_answers", "requests answered 200 during the restart with a wrong answer:\n"
                                      + "\n".join(r.line() for r in wrong))
    return failed


def _outage_beside_retry_window(run: RestartRun, window: RetryWindow | None) -> str | None:
    """The measured outage beside the proxy's retry window, saying which exceeded which."""
    tl = run.timeline
    outage = tl.outage_s if tl is not None else None
    seen = (f"measured outage {outage:.2f} s (old engine's last answer {tl.last_old_s or 0:+.2f} s, new engine's "
            f"first {tl.first_new_s:+.2f} s after the trigger)" if tl is not None and outage is not None
            else "no answer of a new engine was seen, so the outage is unknown")
    if window is None:
        return seen
    if outage is None:
        return f"{seen}; {window.describe()}"
    if outage > window.bridged_s:
        return (f"{seen} exceeded the proxy's retry window of {window.bridged_s:.1f} s by {outage - window.bridged_s:.1f}"
                f" s: {window.describe()}; more num_retries (or a shorter outage) would bridge it")
    return (f"{seen} was within the proxy's retry window of {window.bridged_s:.1f} s ({window.describe()}): the "
            f"failures are not explained by the outage's length; see what the proxy answered")


@fails_with("restart.recovery_slow", "no new engine answered within the target's recovery limit")
def assert_recovery_within_limit(run: RestartRun, limit_s: float) -> float:
    """Trigger to the first answer of a new engine (an answer of the old one never counts) within the limit;
    not judged where the answers could not name their engine although the controller asked them to."""
    if run.evidence_missing:
        raise NotJudged(f"restart identity: {run.evidence_missing}\n{run.timeline_report()}")
    if run.recovery_s is None:
        fail("restart.recovery_slow", f"no new engine answered within {limit_s:.0f} s of the restart\n{run.report()}")
    if run.recovery_s > limit_s:
        fail("restart.recovery_slow",
             f"recovery took {run.recovery_s:.1f} s (trigger to the new engine's first answer), over "
                             f"the target's limit of {limit_s:.0f} s (gates.recovery_time_s_max)\n"
                             + run.timeline_report())
    return run.recovery_s


@fails_with("restart.single_replica_outage",
            "a single replica's restart outage gave undocumented answers or never ended")
def _assert_single_replica_outage(outage: SingleReplicaOutage, run: RestartRun, failed: list[RequestOutcome]) -> None:
    """A role of one replica: every failure is one of Dynamo's documented answers and the service recovers."""
    roles = " and ".join(f"'{r}'" for r in outage.roles)
    head = (f"the target's {roles} {'roles each have' if len(outage.roles) > 1 else 'role has'} a single replica, so a rolling restart is an outage by construction "
            f"(Dynamo {outage.version} unlists the model); the check requires Dynamo's documented answers and "
            f"recovery instead of no client error")
    listing = "\n".join(r.line() for r in run.requests)
    odd = [r for r in failed if not outage.documented(r)]
    if odd:
        fail("restart.single_replica_outage", f"{head}, but {len(odd)} failure(s) are not among them (documented: "
                                              f"{[str(a) for a in outage.answers]}); first: HTTP {odd[0].status}: "
                                              f"{odd[0].error}\n{listing}")
    if run.restart is None or not max(run.requests, key=lambda r: r.sent_s).ok:
        fail("restart.single_replica_outage", f"{head}, but the deployment did not answer again after the restart "
                                              f"({run.restart_error or 'last request failed'})\n{listing}")


@fails_with("crash.stream_refused", "the stream to crash was refused before its worker was killed")
def assert_stream_survives_worker_crash(run: CrashRun) -> str:
    """With migration the stream completes on another worker; without, it ends with Dynamo's own error event and
    ``[DONE]``. Returns a one-line verdict for the report; raises ``AssertionError`` quoting the timeline."""
    report = run.report()
    # A refused stream is the deployment's failure, crash or not: it comes before "nothing was crashed".
    if run.stream.status_code != 200:
        fail("crash.stream_refused",
             f"the stream was refused before the crash (HTTP {run.stream.status_code})\n{report}")
    if run.crash is None:
        raise NotJudged(f"the stream ended after {len(run.stream.events)} events, before the "
                        f"{run.events_before_kill} after which its worker was to be killed: nothing was crashed "
                        f"(the crash spec's max_tokens too small for kill_after_events)")
    return _assert_migrated(run, report) if run.migration_limit > 0 else _assert_unmigrated(run, report)


@fails_with("crash.no_migration",
            "a stream whose worker was SIGKILLed did not continue on another worker although migration is on")
@fails_with("crash.tokens_lost", "a migrated stream lost or repeated tokens")
@fails_with("crash.migration_unlogged",
            "a stream completed, but the frontend log names no migration off the killed worker")
def _assert_migrated(run: CrashRun, report: str) -> str:
    want = int(run.stream.request["max_tokens"])
    got = (run.stream.usage or {}).get("completion_tokens")
    if run.stream.error_events or not run.stream.done or run.stream.finish_reason is None:
        fail("crash.no_migration",
             f"a stream whose worker was SIGKILLed did not continue on another worker although "
                             f"the frontend runs --migration-limit {run.migration_limit}: {stream_ending(run.stream)}\n"
                             f"{report}")
    if got is None or got < want - run.events_before_kill:
        fail("crash.tokens_lost",
             f"the migrated stream finished with {got} completion tokens of {want}: tokens were "
                             f"lost in the migration\n{report}")
    if run.migration_log is None:
        fail("crash.migration_unlogged",
             f"the stream completed but the frontend log names no migration off the killed worker "
                             f"{run.crash.instance_id if run.crash else '?'}: it was not the killed worker's "
                             f"stream\n{report}")
    gap = f"{run.longest_gap_after_kill_s:.2f} s" if run.longest_gap_after_kill_s is not None else "?"
    return f"stream migrated after its worker's SIGKILL: {got}/{want} tokens, longest gap after the kill {gap}"


@fails_with("crash.no_error_event",
            "without migration, a stream whose worker was SIGKILLed did not end with an in-band error")
@fails_with("crash.wrong_error_event", "the in-band error after a worker's SIGKILL is not the documented one")
def _assert_unmigrated(run: CrashRun, report: str) -> str:
    if not run.stream.error_events:
        fail("crash.no_error_event",
             f"without migration a stream whose worker was SIGKILLed must end with an in-band "
                             f"error event, it ended: {stream_ending(run.stream)}\n{report}")
    event = run.stream.error_events[0]
    error = event.get("error", event) if isinstance(event, dict) else {}
    wanted = {k: run.expected_error[k] for k in ERROR_KEYS if k in run.expected_error}
    seen = {k: error.get(k) for k in wanted} if isinstance(error, dict) else {}
    if seen != wanted or not run.stream.done:
        fail("crash.wrong_error_event", f"the stream's in-band error after its worker's SIGKILL is {event} (done="
                                        f"{run.stream.done}), real Dynamo 1.6.1 sends {{'error': {wanted}}} then [DONE]\n"
                                        f"{report}")
    return f"stream ended with Dynamo's error event {error} and [DONE] (migration off)"
