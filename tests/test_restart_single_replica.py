"""A Dynamo role with ONE replica cannot restart without client errors: the no-client-error check derives that
from the topology (pytest_ml4.control.scenario.SingleReplicaOutage) and then requires Dynamo's documented answers
(pytest_ml4/data/dynamo/single-replica-outage.yaml) and recovery. No processes (recorded bodies)."""

from __future__ import annotations

import pytest

from pytest_ml4.checks.restart import assert_client_errors_as_allowed
from pytest_ml4.control.base import RestartResult
from pytest_ml4.control.scenario import RequestOutcome, RestartRun, SingleReplicaOutage
from pytest_ml4.target.model import load_target

UNLISTED = RequestOutcome(2, 0.6, 0.1, 404, None, "''")
FIRST = RequestOutcome(1, 0.1, 0.4, 500, None,
                       '\'{"message":"Failed to generate completions","type":"Internal Server Error","code":500}\'')


def _run(failed: list[RequestOutcome], *, recovered: bool = True) -> RestartRun:
    ok = [RequestOutcome(0, 0.0, 0.1, 200, None, None)]
    if recovered:
        ok.append(RequestOutcome(9, 5.0, 0.5, 200, None, None))
    run = RestartRun("sim", None, "not needed", 0.0, requests=ok + failed)
    run.restart = RestartResult("sim", "t", 0.0, 0.0, 4.0)
    return run


@pytest.mark.parametrize("target, roles", [("vr200-disagg", ("prefill", "decode")), ("vr200-agg", ("worker",)),
                                           ("gb300-agg", None), ("gb300-disagg", None), ("rtxpro6000-tp8", None)])
def test_single_replica_roles_come_from_the_topology(target: str, roles: tuple[str, ...] | None) -> None:
    outage = SingleReplicaOutage.for_target(load_target(target))
    assert (outage.roles if outage else None) == roles


def test_documented_answers_and_recovery_pass_and_say_why() -> None:
    outage = SingleReplicaOutage.for_target(load_target("vr200-disagg"))
    assert assert_client_errors_as_allowed(_run([FIRST, UNLISTED]), allowed=False, outage=outage) == [FIRST, UNLISTED]


def test_an_undocumented_answer_fails_naming_the_single_replica() -> None:
    outage = SingleReplicaOutage.for_target(load_target("vr200-disagg"))
    odd = RequestOutcome(3, 1.0, 0.1, 502, None, "'Bad Gateway'")
    with pytest.raises(AssertionError, match=r"'prefill' and 'decode' roles each have a single replica.*"
                                             r"1 failure\(s\) are not among them.*HTTP 502"):
        assert_client_errors_as_allowed(_run([UNLISTED, odd]), allowed=False, outage=outage)


def test_no_recovery_fails() -> None:
    outage = SingleReplicaOutage.for_target(load_target("vr200-disagg"))
    with pytest.raises(AssertionError, match="did not answer again after the restart"):
        assert_client_errors_as_allowed(_run([UNLISTED], recovered=False), allowed=False, outage=outage)


def test_without_a_single_replica_role_any_error_still_fails() -> None:
    assert SingleReplicaOutage.for_target(load_target("gb300-agg")) is None
    with pytest.raises(AssertionError, match="allows no client-visible error"):
        assert_client_errors_as_allowed(_run([UNLISTED]), allowed=False, outage=None)
