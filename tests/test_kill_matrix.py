"""The kill matrix: every suite check fails under the fault it exists for, and only then.

``fixtures/killmatrix/<target>.yaml`` lists, for every test function in ``suites/``, the kills that must fail it
(simulator faults, recorded bad logs and configs, broken settings) with the verdict code it must fail with (raised
from a function declared to raise it, ``@fails_with``; a message regex beside it where the code cannot tell two kills apart), or
why it has no killer (``measurement``, ``skipped`` on the target, ``pending``). A target's matrix is its file over
the chain of files it names as ``base``, which ends at ``common.yaml``: the entries every target shares, so a check
killed alike everywhere is one entry there. The format is typed in ``tests/killmatrix_file.py`` (a bad field fails
the load with its file, line and field) and described in ``rtxpro6000-tp8.yaml``'s header. The harness is
``tests/killmatrix.py`` (proved by ``tests/test_kill_matrix_harness.py``). Here:

* every target in ``targets/`` has a matrix, and it names every test collected from ``suites/`` for the target;
* one healthy ``--sim`` run per target and timing profile: every listed check passes (``skipped`` ones skip, with
  a reason holding the matrix's text; a not-judged skip never counts). It is the control of every kill without
  ``args``;
* every parametrized instance of a killed check is selected by a kill or explained (``pending_params``,
  ``skipped_params``);
* one run per kill group and profile: each named check fails with its verdict code (a setup error is a harness error,
  never the kill's), and every other check the run reports, in every suite file it ran (collateral), behaves as
  on a healthy run (passes, or skips with its matrix reason) unless the kill lists it with a reason: a check
  pushed into a skip or "not judged" is collateral as much as a failed one;
* kills with ``nightly: <why>`` (too heavy for CI) run in ``scripts/nightly.sh`` only (``.ci/run`` deselects
  ``nightly``); their checks then count as not killed in CI's tally;
* one control run per distinct kill ``args`` and profile (the kill's conditions without its breakage): the
  named checks pass, so a threshold or a shortened sweep alone cannot be what fails them.

Each run is a pytest subprocess writing JUnit XML. ``tests/conftest.py`` prints the tally per target at the end of
the session: ``suite checks killed by a fault: N/M``, ``kill controls passed: K/K``, ``collateral failures: C``,
and fails the session when a target's tally does not hold (``ML4_KILL_MATRIX_GATE``: ``all``, ``off`` or targets).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from killmatrix import (
    ALL_TARGETS,
    TARGETS,
    Check,
    Kill,
    Matrix,
    collateral_problems,
    collected,
    function_key,
    judge_harness,
    judge_healthy,
    judge_named,
    load_matrix,
    nodes_of,
    param_id,
    plan_kill_run,
    run_suites,
)

#: Which timing profiles run (every profile a matrix names, by default, or ``all``): ``ML4_KILL_MATRIX_PROFILES=
#: offline,fast`` leaves out the load, restart and perf runs where CI time is short; the tally then counts only what ran.
_PROFILES_ENV = os.environ.get("ML4_KILL_MATRIX_PROFILES", "all").strip()
PROFILES: tuple[str, ...] | None = (None if _PROFILES_ENV in ("", "all")
                                    else tuple(p.strip() for p in _PROFILES_ENV.split(",") if p.strip()))


def _runs(profile: str) -> bool:
    return PROFILES is None or profile in PROFILES


#: The property each test here records for the session tally (tests/conftest.py reads it).
PROPERTY = "ml4_killmatrix"


def _record(record_property: Any, suffix: str, **fields: Any) -> None:
    record_property(f"{PROPERTY}:{suffix}", json.dumps(fields))


# ------------------------------------------------------------------------------------------------ parametrization
def _kill_runs() -> list[Any]:
    params = []
    for target in TARGETS:
        m = load_matrix(target)
        for group in dict.fromkeys(k.group for k in m.kills.values()):
            kills = [k for k in m.kills.values() if k.group == group]
            profiles = sorted({p for p in m.profiles if m.named(kills, p)})
            nightly = all(k.nightly for k in kills)
            params += [pytest.param(target, group, p, id=f"{target}-{group}-{p}", marks=_nightly(m, p, nightly))
                       for p in profiles if _runs(p)]
    return params


def _control_runs() -> list[Any]:
    """One control per distinct kill ``args`` and profile; kills without args share the healthy run."""
    params = []
    for target in TARGETS:
        m = load_matrix(target)
        for args in dict.fromkeys(k.args for k in m.kills.values() if k.args):
            kills = [k for k in m.kills.values() if k.args == args]
            nightly = all(k.nightly for k in kills)
            params += [pytest.param(target, args, p, id=f"{target}-{' '.join(args)}-{p}",
                                    marks=_nightly(m, p, nightly))
                       for p in sorted(m.profiles) if _runs(p) and m.named(kills, p)]
    return params


def _healthy_runs() -> list[Any]:
    params = []
    for t in TARGETS:
        m = load_matrix(t)
        params += [pytest.param(t, p, id=f"{t}-{p}", marks=_nightly(m, p))
                   for p in sorted({m.profile(c.key) for c in m.checks.values() if not c.pending}) if _runs(p)]
    return params


def _nightly(m: Matrix, profile: str, kills_nightly: bool = False) -> list[Any]:
    """``nightly`` for the runs of a nightly kill, or of a profile the target's matrix sends to nightly."""
    return [pytest.mark.nightly] if kills_nightly or profile in m.nightly else []


def _healthy_nodes(m: Matrix, check: Check) -> list[str]:
    # A pending parametrized instance (pending_params) is unproven both ways, like a pending check.
    return [n for n in nodes_of(m.target, check) if param_id(n) not in check.pending_params]


# ------------------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("target", ALL_TARGETS)
def test_matrix_names_every_suite_test(target: str, record_property: Any) -> None:
    """Every target has a matrix; no suite test may go without a killer, a measurement reason or a pending reason."""
    if target not in TARGETS:
        record_property(PROPERTY, json.dumps({"target": target, "no_matrix": True}))
    assert target in TARGETS, (f"{target}: targets/{target}.yaml has no kill matrix "
                               f"fixtures/killmatrix/{target}.yaml: none of its checks is proven")
    m = load_matrix(target)
    functions = {function_key(n) for n in collected(target)}
    missing = sorted(functions - set(m.checks))
    stale = sorted(set(m.checks) - functions)
    assert not missing, f"{target}: suite tests with no entry in fixtures/killmatrix/{target}.yaml: {missing}"
    assert not stale, f"{target}: fixtures/killmatrix/{target}.yaml names tests suites/ no longer has: {stale}"
    unused = sorted(set(m.kills) - {k for c in m.checks.values() for k in c.killed_by})
    assert not unused, f"{target}: kills no check names: {unused}"
    for c in m.checks.values():
        for kill, expect in c.killed_by.items():
            assert nodes_of(target, c, expect), f"{target}: {c.key} under {kill}: no collected instance selected"
    # Every parametrized instance of a killed check is selected by a kill, or pending/skipped with its reason.
    uncovered = [n for c in m.checks.values() for n in c.uncovered(nodes_of(target, c))]
    assert not uncovered, (f"{target}: parametrized instances no kill selects (only/except) and no pending_params "
                           f"or skipped_params entry explains: {uncovered}")
    # A check with unproven parametrized instances (pending_params) counts as pending in the tally, not killed.
    kinds = {k: "pending" if c.pending_params else c.kind for k, c in m.checks.items()}
    record_property(PROPERTY, json.dumps({
        "target": target, "checks": kinds, "pending": {k: c.pending for k, c in m.checks.items() if c.pending},
        "profiles": {k: m.profile(k) for k in m.checks},
        "kills": {k.name: {"checks": sorted(c.key for c in m.checks.values() if k.name in c.killed_by),
                           "control": k.control} for k in m.kills.values()}}))


@pytest.mark.parametrize(("target", "profile"), _healthy_runs())
def test_healthy_simulator_passes_every_check(target: str, profile: str, tmp_path: Path,
                                              record_property: Any) -> None:
    """Without a fault every listed check passes: the "passes without it" half, and the control of kills
    without ``args``."""
    m = load_matrix(target)
    # Pending checks are unproven both ways: their healthy pass belongs to the proof still to come.
    checks = [c for c in m.checks.values() if m.profile(c.key) == profile and not c.pending]
    outcomes = run_suites(m, [n for c in checks for n in _healthy_nodes(m, c)], profile, (), tmp_path)
    bad = []
    for c in checks:
        wrong = [w for n in _healthy_nodes(m, c) if (w := judge_healthy(outcomes[n], n, c))]
        bad += wrong
        _record(record_property, c.key, target=target, check=c.key, healthy=not wrong)
    assert not bad, f"{target} ({profile}): checks that do not behave on a healthy simulator:\n" + "\n".join(bad)


@pytest.mark.parametrize(("target", "group", "profile"), _kill_runs())
def test_kill_fails_the_checks_it_names(target: str, group: str, profile: str, tmp_path: Path,
                                        record_property: Any) -> None:
    """Under the kill (or its group) every check it names fails with its code (and message regex, if any), and the other
    checks of the same suite files do not fail (unless listed under the kill's ``collateral`` with a reason)."""
    m = load_matrix(target)
    kills = [k for k in m.kills.values() if k.group == group]
    plan = plan_kill_run(m, kills, profile)
    outcomes = run_suites(m, plan.nodes, profile, tuple(a for k in kills for a in k.breaks + k.args), tmp_path)
    problems: list[str] = []
    verdicts: dict[tuple[str, str], bool] = {}
    for c, kill, expect, node in plan.named:
        # A setup error is the harness's: never counted as the kill's failure of the check.
        wrong = judge_harness(outcomes[node], node) or judge_named(outcomes[node], node, m.kills[kill], expect)
        problems += [wrong] if wrong else []
        verdicts[(c.key, kill)] = verdicts.get((c.key, kill), True) and not wrong
    for (key, kill), ok in verdicts.items():
        _record(record_property, f"{key}:{kill}", target=target, check=key, kill=kill, ok=ok)
    collateral = collateral_problems(m, plan, outcomes)
    _record(record_property, f"collateral:{group}:{profile}", target=target, group=group,
            collateral_failures=len(collateral))
    problems += collateral
    assert not problems, f"{target}: kill group {group!r} ({profile}):\n" + "\n".join(problems)


@pytest.mark.parametrize(("target", "args", "profile"), _control_runs())
def test_kill_control_passes(target: str, args: tuple[str, ...], profile: str, tmp_path: Path,
                             record_property: Any) -> None:
    """A kill's conditions without its breakage (faults, broken artifacts) pass the checks it names: the kill,
    not a threshold it moved or a proxy it left out, is what fails them. One run for all kills sharing ``args``."""
    m = load_matrix(target)
    kills: list[Kill] = [k for k in m.kills.values() if k.args == args]
    named = m.named(kills, profile)
    checks = list({c.key: c for c, *_ in named}.values())
    outcomes = run_suites(m, [n for c in checks for n in _healthy_nodes(m, c)], profile, args, tmp_path)
    bad = {c.key: [w for n in _healthy_nodes(m, c) if (w := judge_healthy(outcomes[n], n, c))] for c in checks}
    for k in kills:
        wrong = [w for c, kill, _ in named if kill == k.name for w in bad[c.key]]
        _record(record_property, f"control:{k.name}:{profile}", target=target, kill=k.name, control_ok=not wrong)
    problems = [w for ws in bad.values() for w in ws]
    assert not problems, (f"{target}: control {' '.join(args)} ({profile}), the kills' conditions without their "
                          f"faults, fails:\n" + "\n".join(problems))
