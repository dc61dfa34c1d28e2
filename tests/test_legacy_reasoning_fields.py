"""The tool and reasoning suites pass against a vLLM that names the reasoning field as older releases do.

vLLM <= 0.11 streams the reasoning as ``reasoning_content``; 0.11.1-0.15 send both ``reasoning`` and
``reasoning_content`` (``pytest_ml4/data/vllm/versions.yaml``). The simulator takes either form as a profile switch
(``sim.extra.reasoning_field``); a representative slice of both suites, streamed and not, must pass on each with
nothing skipped. The simulator is the endpoint itself (``--endpoint``, ``--ml4-no-proxy``): the LiteLLM proxy would
rewrite the field.

Which fault each check of these suites catches is the kill matrix's (``fixtures/killmatrix/rtxpro6000-tp8.yaml``:
the parser, tool-JSON, tool-id, usage and stream-grammar kills, with and without the proxy, every check streamed and
non-streamed, judged by verdict code with the rest of each suite file as collateral; ``tests/test_kill_matrix.py``).
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from killmatrix import read_junit
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.target.model import load_target

REPO = Path(__file__).resolve().parent.parent
SUITES = [str(REPO / "suites" / "test_tools.py"), str(REPO / "suites" / "test_reasoning.py")]
TARGET = "rtxpro6000-tp8"
#: A representative slice of both suites: each check kind once, streamed and not.
SELECTION = ("separated or token_count or (effort_is_accepted and (none or high)) or invalid "
             "or (auto_calls and weather) or tool_choice_is_obeyed or test_parallel_calls or round_trip")
#: The smallest slice that still holds every kind of check above, both ways.
MIN_OUTCOMES = 20


@pytest.mark.parametrize("field", ["reasoning_content", "both"])
def test_suites_pass_on_a_legacy_reasoning_field(pytester: pytest.Pytester, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, field: str) -> None:
    target = load_target(TARGET)
    monkeypatch.setenv(target.endpoint.api_key_env, "sk-legacy-" + secrets.token_urlsafe(12))
    junit = tmp_path / "junit.xml"
    overrides = {"sim": {"ttft_s": 0.005, "itl_ms": 0.2, "extra": {"reasoning_field": field}}}
    with SimServer(target, overrides=overrides, log_file=tmp_path / "sim.log") as sim:
        result = pytester.runpytest_subprocess(
            *SUITES, "--target", TARGET, "--endpoint", sim.base_url, "--ml4-no-proxy", "-k", SELECTION,
            "--ml4-reports", str(tmp_path / "reports"), f"--junitxml={junit}", "-p", "no:randomly", timeout=420)
    assert junit.is_file(), f"the run produced no report:\n{result.stdout.str()[-3000:]}"
    found = read_junit(junit)
    assert len(found) >= MIN_OUTCOMES, f"selection too small ({len(found)} tests): {sorted(found)}"
    # The slice holds streamed and non-streamed reasoning checks: the field is read both ways.
    assert any("stream" in n and "separated" in n for n in found), sorted(found)
    bad = {node: f"{o.kind}: {o.message[:300]}" for node, o in found.items() if o.status != "passed"}
    assert not bad, f"sim.extra.reasoning_field={field}: checks that did not pass: {bad}"
