"""Dynamo routing verdicts: session affinity, prefix reuse and the prefill -> decode handoff, judged on the turns
:mod:`pytest_ml4.control.dynamo` sent (each answer's ``nvext`` names the workers that served it).

Each ``assert_*`` raises AssertionError with what the release manager reads, or NotJudged where the answers carry
no worker ids (the evidence is missing, not the deployment's routing wrong). Nothing here needs pytest.
"""

from __future__ import annotations

import math
from typing import Any

from pytest_ml4.checks.codes import fail, fails_with
from pytest_ml4.checks.verdict import NotJudged
from pytest_ml4.control.dynamo import SESSION_HEADER, AffinityRun, Turn
from pytest_ml4.control.k8s_restart import NVEXT_ABSENT_CAUSES

#: kv_hit_rate is reported rounded (0.92 for 12/13 blocks in 70_kv_routing.txt).
HIT_RATE_TOLERANCE = 0.02


class AffinityInconclusive(AssertionError):
    """The deployment did not let the check tell affinity from KV routing (it fails: a check must be able to)."""


def _failed(turns: list[Turn]) -> str | None:
    errors = [t for t in turns if t.error]
    if errors:
        return (f"{len(errors)} request(s) failed ({errors[0].label or 'first'}: HTTP {errors[0].status}):\n"
                + "\n".join(t.line() for t in turns))
    return None


def assert_worker_ids_known(turns: list[Turn], check: str) -> None:
    """Answers that came back without ``nvext.worker_id`` leave ``check`` without its evidence: not judged (never
    a pass, never a failure of the deployment's routing), naming the likely cause."""
    blind = [t for t in turns if not t.error and not t.worker_id]
    if blind:
        raise NotJudged(f"{check}: {len(blind)} of {len(turns)} answers carry no nvext.worker_id although the "
                        f"request asked for it (nvext.extra_fields worker_id), so the workers that served them are "
                        f"unknown; likely cause: {NVEXT_ABSENT_CAUSES}\n" + "\n".join(t.line() for t in turns))


@fails_with("dynamo.turn_failed", "a turn of a routing probe's conversation failed")
@fails_with("dynamo.affinity_off", "one session was served by different workers: session affinity is off")
@fails_with("dynamo.affinity_partial", "a session kept one phase's worker but not its binding of the other phase")
def assert_session_affinity(run: AffinityRun) -> Any:
    """Session turn 2 stayed on turn 1's worker although KV routing (proven by the control) would have sent its
    prefix to the other worker of the routed phase, and on turn 1's worker of every other bound phase; returns
    the session's worker of the routed phase."""
    listing = "\n".join(t.line() for t in run.turns)
    problem = _failed(run.turns)
    if problem:
        fail("dynamo.turn_failed", problem)
    assert_worker_ids_known(run.turns, "session affinity")
    if len(run.turns) < 4:
        fail("dynamo.turn_failed", f"the session's first turn failed:\n{listing}")
    first, prime, control, second = run.turns
    field, name = run.phase.id_field, run.phase.name
    if prime.worker(field) != run.other_worker:
        raise AffinityInconclusive(f"the priming request pinned to {name} worker {run.other_worker} ran on "
                                   f"{prime.worker(field)}: {run.phase.pin_header} not honoured, affinity cannot be "
                                   f"told from routing\n{listing}")
    if control.worker(field) != run.other_worker:
        raise AffinityInconclusive(f"the KV router sent a session-less request whose prefix only {name} worker "
                                   f"{run.other_worker} holds to {control.worker(field)}: routing does not follow "
                                   f"cached prefixes (router mode not kv, or the workers publish no KV events), so "
                                   f"affinity cannot be told from load balancing\n{listing}")
    if second.worker(field) != first.worker(field):
        fail("dynamo.affinity_off", f"one {SESSION_HEADER} was served by {name} workers {first.worker(field)} and "
                                    f"{second.worker(field)}: the second turn followed its cached prefix to the other "
                                    f"worker, session affinity is off (router session-affinity TTL unset, or the vLLM "
                                    f"chat processor dropped the header)\n{listing}")
    moved = [f"{f} {first.worker(f)} -> {second.worker(f)}" for f in run.phase.also_bound
             if second.worker(f) != first.worker(f)]
    if moved:
        fail("dynamo.affinity_partial",
             f"one {SESSION_HEADER} kept its {name} worker but not its binding of the other "
                             f"phase(s): {'; '.join(moved)} (Dynamo binds each phase of a disaggregated session, "
                             f"dynamo.md §5)\n{listing}")
    return first.worker(field)


@fails_with("dynamo.turn_failed")
@fails_with("dynamo.no_cached_tokens", "the continuation turn reports no cached prompt tokens")
@fails_with("dynamo.kv_hit_rate", "nvext kv_hit_rate disagrees with the cached tokens the turn reports (KV events off)")
def assert_prefix_reused(turns: list[Turn], block_size: int) -> int:
    """The router's figures show the continuation reusing the previous turn's KV blocks; returns its cached tokens.

    Judged on the first two turns of :func:`run_conversation`: turn 1 (a fresh nonce prefix) must have nothing
    cached, turn 2 at least every full block of turn 1's prompt but one, never more than its own prompt; where
    ``nvext.timing.kv_hit_rate`` is reported it must equal cached blocks / prompt blocks."""
    listing = "\n".join(t.line() for t in turns)
    problem = _failed(turns[:2])
    if problem or len(turns) < 2:
        fail("dynamo.turn_failed", problem or f"the conversation needs two turns:\n{listing}")
    cold, warm = turns[0], turns[1]
    if warm.cached_tokens is None and not warm.worker_id:
        # Neither the usage figure nor the router's nvext came back: nothing shows what was reused.
        assert_worker_ids_known(turns[:2], "prefix reuse")
    if warm.cached_tokens is None:
        fail("dynamo.no_cached_tokens",
             f"the continuation turn reports no usage.prompt_tokens_details.cached_tokens:\n{listing}")
    problems = []
    if cold.cached_tokens:
        problems.append(f"turn 1 starts with a never-seen prefix yet reports {cold.cached_tokens} cached tokens: "
                        f"the figure is not the router's")
    floor = max(block_size, (cold.prompt_tokens // block_size - 1) * block_size)
    if warm.cached_tokens < floor:
        problems.append(f"turn 2 reused {warm.cached_tokens} cached tokens, less than turn 1's {cold.prompt_tokens}-"
                        f"token prompt in full {block_size}-token blocks less one ({floor}): no prefix reuse (with the "
                        f"hybrid KV cache manager on, a prefix hit needs both KV groups; seed 002 GB300 settings)")
    if warm.cached_tokens > warm.prompt_tokens:
        problems.append(f"turn 2 reports {warm.cached_tokens} cached tokens of a {warm.prompt_tokens}-token prompt")
    for turn in (cold, warm):
        if turn.kv_hit_rate is None or turn.cached_tokens is None:
            continue
        expected = (turn.cached_tokens // block_size) / max(1, math.ceil(turn.prompt_tokens / block_size))
        if abs(turn.kv_hit_rate - expected) > HIT_RATE_TOLERANCE:
            problems.append(f"{turn.label}: nvext.timing.kv_hit_rate {turn.kv_hit_rate} disagrees with "
                            f"{turn.cached_tokens} cached of {turn.prompt_tokens} prompt tokens ({expected:.2f})")
    if problems:
        fail("dynamo.kv_hit_rate", "; ".join(problems) + "\n" + listing)
    return warm.cached_tokens


def _handoff_problems(turn: Turn, by_id: dict[Any, dict[str, Any]]) -> list[str]:
    p, d = turn.prefill_worker, turn.decode_worker
    problems = []
    if p is None or d is None or p == d:
        problems.append(f"prefill_worker_id={p} decode_worker_id={d}: no separate prefill (aggregated serving?)")
    if p is not None:
        if p not in by_id:
            problems.append(f"prefill worker {p} is not an instance the frontend lists")
        elif "prefill" not in str(by_id[p].get("component", "")):
            problems.append(f"prefill worker {p} belongs to component {by_id[p].get('component')!r}")
    if d is not None and d not in by_id:
        problems.append(f"decode worker {d} is not an instance the frontend lists")
    return problems


@fails_with("dynamo.no_handoff", "a turn was not prefilled on a prefill worker and decoded on a decode worker")
def assert_prefill_decode_handoff(turns: list[Turn], instances: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    """Every turn was prefilled and decoded on different instances, the prefill one from the prefill component.
    Every turn, not the first only: a continuation turn is the one whose prefix the decode worker already holds,
    which a router allowed to skip the remote prefill (Dynamo's conditional disaggregation) serves locally."""
    assert_worker_ids_known(turns, "prefill -> decode handoff")
    by_id = {i.get("instance_id"): i for i in instances}
    problems = [f"turn {n}: {p}" for n, t in enumerate(turns, 1) for p in _handoff_problems(t, by_id)]
    if problems:
        listed = [(i.get("component"), i.get("instance_id")) for i in instances]
        fail("dynamo.no_handoff",
             "no prefill -> decode handoff: " + "; ".join(problems) + f"\ninstances: {listed}\n"
                             + "\n".join(t.line() for t in turns))
    return [(t.prefill_worker, t.decode_worker) for t in turns]
