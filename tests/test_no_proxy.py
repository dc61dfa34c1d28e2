"""``--ml4-no-proxy``: the suites talk to the engine behind a proxied target's LiteLLM proxy.

The proxy repairs a missing ``[DONE]`` (reference/litellm.md), so an engine that drops it passes through the proxy;
going around the proxy makes the smoke suite's stream-grammar check catch it. Bad combinations are usage errors.
"""

from __future__ import annotations

import pytest

from pytest_ml4.target.model import load_target

SMOKE = "suites/test_smoke.py"


def test_engine_only_view_of_a_proxied_target() -> None:
    declared = load_target("rtxpro6000-tp8")
    view = declared.without_proxy()
    assert declared.has_proxy and not view.has_proxy
    assert view.serving.stack == "vllm" and view.serving.bypassed_proxy == declared.serving.proxy
    assert view.serving.served_model_name == declared.serving.engine_served_model_name
    assert view.gates == declared.gates and view.engine == declared.engine
    dynamo = load_target("gb300-agg")
    assert dynamo.without_proxy() is dynamo


def test_sim_without_proxy_shows_the_engine_dropping_done(pytester: pytest.Pytester, smoke_copy: None) -> None:
    run_dir = pytester.path / "run"
    result = pytester.runpytest_subprocess("--target", "rtxpro6000-tp8", "--sim", "--ml4-no-proxy",
                                           "--ml4-fault", "no_done", "--ml4-run-dir", str(run_dir),
                                           "-p", "no:cacheprovider", SMOKE)
    out = result.stdout.str()
    assert "[simulated, engine direct (--ml4-no-proxy), faults: no_done]" in out
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("passed", 0) >= 8, out[-3000:]
    result.stdout.fnmatch_lines(["FAILED suites/test_smoke.py::test_stream_answers_known_question_with_clean_grammar*"])
    assert "[DONE]" in out
    assert not (run_dir / "proxy").exists(), "a LiteLLM proxy was started although --ml4-no-proxy was given"


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "gb300-agg", "--sim"], "--ml4-no-proxy: target gb300-agg has no proxy in front of its engine"),
    (["--target", "rtxpro6000-tp8"], ("--ml4-no-proxy against a live deployment needs --endpoint with the engine's "
                                      "URL: ML4_RTXPRO_URL is the litellm proxy's")),
])
def test_bad_combinations_are_usage_errors(pytester: pytest.Pytester, smoke_copy: None, args: list[str],
                                           message: str) -> None:
    result = pytester.runpytest(*args, "--ml4-no-proxy", SMOKE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()
