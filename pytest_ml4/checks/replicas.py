"""Every replica answers right: each worker's answers to one functional probe, judged by the verdicts the
single-request suites use (tools, reasoning, fixed length), reported per worker (:mod:`pytest_ml4.evidence.replicas` sends
them).

A worker is the one the answer's ``nvext.worker_id`` names, never the one a pin asked for. One worker answering
wrong fails the probe naming it (its role and instance id, disaggregated the prefill + decode pair that served the
answer) and what it answered wrong; a wrong answer that names no worker fails too (it is wrong whoever served it).
Otherwise the probe is not judged when the answers carry no evidence, or when a worker ``/health`` lists never
answered it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pytest_ml4.checks.codes import fail, fails_with
from pytest_ml4.checks.osl import assert_usage_exactly_n
from pytest_ml4.checks.reasoning import assert_effort_honoured
from pytest_ml4.checks.tools import ToolChat, assert_parallel_calls
from pytest_ml4.checks.verdict import not_judged
from pytest_ml4.evidence.replicas import Reach, Reply, WorkerRef

#: Why a deployment's answers may carry no worker ids (the not-judged reason says it).
NO_EVIDENCE = ("the answers carry no nvext.worker_id, although the probes asked for it (a frontend run with "
               "DYN_DISABLE_FRONTEND_NVEXT=1, or an ingress that passes only standard fields and headers): which "
               "worker answered cannot be told")

Judge = Callable[[Reply], "str | None"]


def _tools(reply: Reply, chat: ToolChat, counter: Any) -> None:
    e, a = reply.probe.expect, reply.answer
    chat.assert_obeyed(a, e["tools"], e["tool_choice"], e["expect_tool"])


def _parallel(reply: Reply, chat: ToolChat, counter: Any) -> None:
    e, a = reply.probe.expect, reply.answer
    args = chat.assert_obeyed(a, e["tools"], e["tool_choice"], e["expect_tool"])
    assert_parallel_calls(args, e["expect_calls"], e["expect_values"], a.where)


def _reasoning(reply: Reply, chat: ToolChat, counter: Any) -> None:
    e = reply.probe.expect
    assert_effort_honoured(reply.answer, e["effort"], e["expect_substring"], counter)


def _fixed_length(reply: Reply, chat: ToolChat, counter: Any) -> None:
    assert_usage_exactly_n([reply.answer.result], reply.probe.expect["n"])


#: Probe kind -> the single-request suites' verdicts on its answer.
VERDICTS: dict[str, Callable[[Reply, ToolChat, Any], None]] = {
    "tool_choice": _tools, "parallel": _parallel, "reasoning": _reasoning, "fixed_length": _fixed_length}


def judge_with(chat: ToolChat, counter: Any) -> Judge:
    """The first violation of a reply (its probe kind's verdicts, :data:`VERDICTS`), or None when it is right."""
    def judge(reply: Reply) -> str | None:
        if reply.failure is not None or reply.answer is None:
            return reply.failure or "no answer"
        try:
            VERDICTS[reply.probe.kind](reply, chat, counter)
        except AssertionError as err:
            return str(err).split("\nassert ", 1)[0]
        return None
    return judge


def _names(workers: Any) -> str:
    return " + ".join(map(str, workers))


@fails_with("replica.worker_answers_wrong",
            "a worker of the deployment (named by the answer's nvext.worker_id) answered a functional probe wrong "
            "while others answered it right or were not asked")
@fails_with("replica.wrong_answer_unattributed",
            "a functional probe sent to each worker was answered wrong and the answer names no worker")
def assert_every_worker_answers_right(reach: Reach, probe: str, judge: Judge) -> list[str]:
    """Every worker answered probe ``probe`` right; returns one line per worker (route) judged right."""
    if reach.unavailable:
        not_judged(reach.unavailable)
    replies = [r for r in reach.replies if r.probe.name == probe]
    wrong: dict[tuple[WorkerRef, ...], str] = {}
    right: dict[tuple[WorkerRef, ...], int] = {}
    unattributed: list[str] = []
    silent = 0
    for reply in replies:
        verdict = judge(reply)
        who = reply.answered_by(reach.roles)
        if who is None and verdict is not None:
            unattributed.append(f"{reply.route}: {verdict}")
        elif who is None:
            silent += 1
        elif verdict is not None:
            wrong.setdefault(who, f"{verdict}" + _pin_note(reply, who))
        else:
            right[who] = right.get(who, 0) + 1
    if wrong:
        fail("replica.worker_answers_wrong", _wrong_message(probe, wrong, right))
    if unattributed:
        fail("replica.wrong_answer_unattributed", f"{probe}: a wrong answer whose worker the deployment does not "
                                                  f"name ({NO_EVIDENCE}): " + "; ".join(unattributed[:2]))
    if silent:
        not_judged(f"{probe}: {silent} of {len(replies)} answers: {NO_EVIDENCE}")
    unreached = [w for w in reach.listed() if not any(w in who for who in right)]
    if unreached:
        not_judged(_unreached_message(probe, unreached, right, reach))
    return [f"{_names(who)}: {n} answer(s) right" for who, n in right.items()]


def _pin_note(reply: Reply, who: tuple[WorkerRef, ...]) -> str:
    """Said when the deployment answered from another worker than the route pinned."""
    if reply.route.pinned and set(reply.route.pinned) != set(who):
        return f" (pinned to {reply.route}; the pin was not honoured)"
    return ""


def _wrong_message(probe: str, wrong: Mapping[tuple[WorkerRef, ...], str],
                   right: Mapping[tuple[WorkerRef, ...], int]) -> str:
    bad = "; ".join(f"{_names(who)} answered wrong: {verdict}" for who, verdict in wrong.items())
    good = ", ".join(_names(who) for who in right) or "none"
    return (f"{probe}: {bad} (answered right: {good}): a deployment whose router keeps a client on the workers "
            f"that answer right passes every other check")


def _unreached_message(probe: str, unreached: list[WorkerRef], right: Mapping[tuple[WorkerRef, ...], int],
                       reach: Reach) -> str:
    how = ("pinned with the worker headers, the answers named other workers: the pins were not honoured"
           if reach.pinned else
           f"the release cannot pin (pins_workers: false in the versions table), and {len(reach.replies)} unpinned "
           f"answers were routed elsewhere")
    seen = ", ".join(_names(who) for who in right) or "none"
    return (f"{probe}: {', '.join(map(str, unreached))} listed by /health never answered it ({how}; answered by: "
            f"{seen}): a worker never reached is not judged right")
