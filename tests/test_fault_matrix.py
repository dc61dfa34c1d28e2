"""Fault-detection matrix: the tool and reasoning suites bite.

For each simulator fault, the suites run (through pytester, in a subprocess) against the simulator started with
that fault, directly (``--endpoint``), and a few cases again behind the real LiteLLM proxy of the target's
topology. The intended tests must fail with a message naming the defect, every failure of the run must name
it (nothing unrelated breaks), and the listed unrelated tests must pass. The healthy simulator and the legacy
reasoning-field profiles (vLLM <= 0.11 ``reasoning_content``; 0.11.1-0.15 both fields) must pass everything.

Each run is one narrow selection (``-k``) of both suites against a fast simulator profile, so the matrix takes
a few minutes on two cores.
"""

from __future__ import annotations

import fnmatch
import secrets
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.simulator import SimServer
from test_sim_support import kill_processes_mentioning

from pytest_ml4.target.model import load_target

REPO = Path(__file__).resolve().parent.parent
SUITES = [str(REPO / "suites" / "test_tools.py"), str(REPO / "suites" / "test_reasoning.py")]
TARGET = "rtxpro6000-tp8"
#: A representative slice of both suites: each check kind once, streamed and not.
SELECTION = ("separated or token_count or (effort_is_accepted and (none or high)) or invalid "
             "or (auto_calls and weather) or tool_choice_is_obeyed or test_parallel_calls or round_trip")
#: Fast timing for the simulator under test.
FAST = {"sim": {"ttft_s": 0.005, "itl_ms": 0.2}}

TOOL_CALLING = ["test_auto_calls_the_matching_tool_with_valid_arguments[weather-*]",
                "test_tool_choice_is_obeyed[auto-*]", "test_tool_choice_is_obeyed[required-*]",
                "test_tool_choice_is_obeyed[named-*]", "test_parallel_calls[*]",
                "test_round_trip_answer_uses_the_tool_result[*]"]
REASONING = ["test_reasoning_is_separated_from_content[*]", "test_reasoning_token_count_agrees_with_usage[*]",
             "test_each_reasoning_effort_is_accepted[high-*]"]
VALIDATION = ["test_invalid_tool_requests_are_rejected[*]", "test_invalid_reasoning_requests_are_rejected[*]"]
STREAMED = ["*[stream]", "*-stream]"]
NON_STREAMED = ["*[nonstream]", "*-nonstream]"]
STREAMED_ANSWERS = TOOL_CALLING + REASONING


@dataclass
class Case:
    name: str
    faults: list[str]                       # --fault specs the simulator starts with
    defect: str | None = None               # phrase every failure must contain (None: nothing may fail)
    must_fail: list[str] = field(default_factory=list)
    must_pass: list[str] = field(default_factory=list)
    only_streamed: bool = False             # must_fail restricted to streamed variants
    selection: str | None = SELECTION       # -k expression; None runs both suites whole
    sim_extra: dict[str, str] = field(default_factory=dict)   # sim.extra profile switches


def fault(name: str) -> list[str]:
    return [name]


CASES = [
    Case("healthy", [], must_pass=["*"]),
    Case("legacy_reasoning_content", [], sim_extra={"reasoning_field": "reasoning_content"}, must_pass=["*"]),
    Case("legacy_both_fields", [], sim_extra={"reasoning_field": "both"}, must_pass=["*"]),
    Case("reasoning_parser_off", fault("reasoning_parser_off"), "reasoning parser off",
         must_fail=REASONING + ["test_auto_calls_the_matching_tool_with_valid_arguments[weather-*]"],
         must_pass=VALIDATION + ["test_each_reasoning_effort_is_accepted[none-*]"]),
    Case("tool_parser_off", fault("tool_parser_off"), "tool parser off",
         must_fail=TOOL_CALLING, must_pass=VALIDATION + REASONING + ["test_tool_choice_is_obeyed[none-*]"]),
    Case("invalid_tool_json", fault("invalid_tool_json"), "invalid JSON in tool-call arguments",
         must_fail=TOOL_CALLING, must_pass=VALIDATION + REASONING + ["test_tool_choice_is_obeyed[none-*]"]),
    Case("bad_tool_ids", fault("bad_tool_ids"), "are not Mistral ids",
         must_fail=TOOL_CALLING, must_pass=VALIDATION + REASONING + ["test_tool_choice_is_obeyed[none-*]"]),
    Case("reasoning_usage_missing", fault("reasoning_usage_missing"), "reasoning tokens missing from usage",
         must_fail=["test_reasoning_token_count_agrees_with_usage[*]", "test_each_reasoning_effort_is_accepted[high-*]"],
         must_pass=VALIDATION + TOOL_CALLING + ["test_reasoning_is_separated_from_content[*]",
                                                "test_each_reasoning_effort_is_accepted[none-*]"]),
    Case("no_done", fault("no_done"), "stream ended without 'data: [DONE]'", must_fail=STREAMED_ANSWERS,
         must_pass=VALIDATION + NON_STREAMED, only_streamed=True),
    Case("no_usage_chunk", fault("no_usage_chunk"), "no usage chunk", must_fail=STREAMED_ANSWERS,
         must_pass=VALIDATION + NON_STREAMED, only_streamed=True),
    Case("midstream_error", fault("midstream_error"), "in-band error event", must_fail=STREAMED_ANSWERS,
         must_pass=VALIDATION + NON_STREAMED, only_streamed=True),
]


@dataclass
class Outcome:
    name: str
    status: str          # passed | failed | skipped
    text: str


def read_junit(path: Path) -> list[Outcome]:
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            out.append(Outcome(case.get("name", ""), "failed", (bad.get("message") or "") + "\n" + (bad.text or "")))
        elif case.find("skipped") is not None:
            out.append(Outcome(case.get("name", ""), "skipped", ""))
        else:
            out.append(Outcome(case.get("name", ""), "passed", ""))
    return out


def glob(name: str, pattern: str) -> bool:
    """``*`` is the only wildcard: the brackets of parametrize ids are literal."""
    escaped = "".join("[[]" if ch == "[" else "[]]" if ch == "]" else ch for ch in pattern)
    return fnmatch.fnmatchcase(name, escaped)


def matching(outcomes: list[Outcome], patterns: list[str]) -> list[Outcome]:
    return [o for o in outcomes if any(glob(o.name, p) for p in patterns)]


def is_streamed(name: str) -> bool:
    return any(glob(name, p) for p in STREAMED)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fault_is_detected_by_the_intended_tests(pytester: pytest.Pytester, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, case: Case) -> None:
    """The simulator itself, started with the fault, as the endpoint (``--endpoint``).

    Not ``--sim``: for this target the plugin puts the real LiteLLM proxy in front, which repairs a missing
    ``[DONE]`` or usage chunk. ``--ml4-no-proxy`` because the endpoint is the engine: the suites then expect the
    engine's answers (a request the proxy would serve is the engine's 400 here)."""
    target = load_target(TARGET)
    monkeypatch.setenv(target.endpoint.api_key_env, "sk-matrix-" + secrets.token_urlsafe(12))
    junit = tmp_path / "junit.xml"
    overrides = {"sim": {**FAST["sim"], "extra": case.sim_extra}} if case.sim_extra else FAST
    with SimServer(target, faults=tuple(case.faults), overrides=overrides, log_file=tmp_path / "sim.log") as sim:
        result = pytester.runpytest_subprocess(
            *SUITES, "--target", TARGET, "--endpoint", sim.base_url, "--ml4-no-proxy", "-k", case.selection or "",
            "--ml4-reports",
            str(tmp_path / "reports"), f"--junitxml={junit}", "-p", "no:randomly", timeout=420)
    verify(case, junit, result.stdout.str())


def verify(case: Case, junit: Path, stdout: str) -> None:
    """The matrix rule: intended tests fail naming the defect, nothing else fails, unrelated tests pass."""
    assert junit.is_file(), f"the run produced no report:\n{stdout[-3000:]}"
    outcomes = read_junit(junit)
    assert len(outcomes) >= 20, f"selection too small ({len(outcomes)} tests):\n{stdout[-3000:]}"
    failed = [o for o in outcomes if o.status == "failed"]
    assert not [o for o in outcomes if o.status == "skipped"], "tests were skipped against the simulator"

    if case.defect is None:
        assert not failed, f"{case.name}: failures against a healthy profile: " + "; ".join(
            f"{o.name}: {o.text[:300]}" for o in failed)
        return

    unrelated = [o for o in failed if case.defect not in o.text]
    assert not unrelated, f"{case.name}: failures that do not name {case.defect!r}: " + " | ".join(
        f"{o.name}: {o.text[:400]}" for o in unrelated)
    for pattern in case.must_fail:
        hits = [o for o in matching(outcomes, [pattern]) if not case.only_streamed or is_streamed(o.name)]
        assert hits, f"{case.name}: no test matches {pattern!r}"
        passed = [o.name for o in hits if o.status != "failed"]
        assert not passed, f"{case.name}: the fault went undetected by {passed}"
    for pattern in case.must_pass:
        hits = matching(outcomes, [pattern])
        assert hits, f"{case.name}: no test matches {pattern!r}"
        broken = [o.name for o in hits if o.status != "passed"]
        assert not broken, f"{case.name}: unrelated tests failed: {broken}"


#: Behind the proxy. LiteLLM 1.108.7 itself appends [DONE] and computes a usage chunk, so the simulator's
#: no_done / no_usage_chunk never reach a client there (checked without the proxy above); a backend error
#: mid-stream does reach it, re-wrapped as LiteLLM's own in-band error event (tooling.md §3.6). The healthy suites
#: whole behind the proxy are the kill matrix's healthy fast run (tests/test_kill_matrix.py, same proxy, same
#: profile); the mid-stream error behind it is the plugin-path test below (one run proves both).
MIDSTREAM_BEHIND_PROXY = Case("midstream_error", ["midstream_error"], "in-band error event",
                              must_fail=STREAMED_ANSWERS, must_pass=VALIDATION + NON_STREAMED, only_streamed=True)


def test_sim_option_path_injects_the_fault(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """End to end through the plugin: ``--sim --ml4-fault`` starts the simulator and, for this target, the real
    LiteLLM proxy in front of it, with the fault; the suites catch LiteLLM's re-wrapped in-band error event."""
    case = MIDSTREAM_BEHIND_PROXY
    junit = tmp_path / "junit.xml"
    fast = [arg for key, value in FAST["sim"].items() for arg in ("--ml4-set", f"sim.{key}={value}")]
    result = pytester.runpytest_subprocess(
        *SUITES, "--target", TARGET, "--sim", *fast, "--ml4-fault", "midstream_error", "-k", SELECTION,
        "--ml4-reports", str(tmp_path / "reports"), f"--junitxml={junit}", "-p", "no:randomly", timeout=420)
    # The session's processes end with it (tests/test_sim_process.py checks that); none may outlive this test.
    kill_processes_mentioning(str(tmp_path / "reports"))
    verify(case, junit, result.stdout.str())
