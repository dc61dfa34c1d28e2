"""The suites' markers and what skips a test: hardware, topology, proxy and Dynamo markers against the target,
``sim_only`` without ``--sim``, the scale checks the tiny real-vLLM deployment cannot judge."""

from __future__ import annotations

import pytest

from pytest_ml4.plugin.state import get_state
from pytest_ml4.targets import Target

SUITE_MARKERS = {
    "smoke": "smoke chat: health, models, a known answer, stream grammar, usage, errors, a parallel burst",
    "tools": "tool calling through the Mistral tool parser",
    "reasoning": "reasoning separation through the Mistral reasoning parser",
    "osl": "fixed output-length correctness (min_tokens = max_tokens)",
    "kv": "KV cache sizing and memory health after boot",
    "restart": "restart resilience (disruptive: restarts the engine)",
    "perf": "performance gates with aiperf (long)",
    "preflight": "lint of deployment configs; needs no endpoint",
    "accuracy": "BFCL tool-calling accuracy vs a stored baseline (after a model or image change)",
}
HARDWARE_MARKERS = {
    "rtxpro": "applies to RTX PRO 6000 targets only",
    "gb300": "applies to GB300 targets only",
    "vr200": "applies to Vera Rubin VR200 targets only",
}
TOPOLOGY_MARKERS = {
    "single_node": "applies to single-node tensor-parallel targets only",
    "agg": "applies to aggregated Dynamo targets only",
    "disagg": "applies to disaggregated (prefill/decode) Dynamo targets only",
}
OTHER_MARKERS = {
    "needs_proxy": "applies only to targets served behind a proxy (LiteLLM)",
    "dynamo": "applies only to Dynamo-served targets",
    "sim_only": "needs the embedded simulator (e.g. fault injection); skipped against a real endpoint",
    "exclusive": "needs the endpoint to itself: under pytest-xdist no other worker's test runs while one of these "
                 "(with the fixtures it sets up or tears down) does (pytest_ml4/endpoint_lock.py)",
}


def pytest_configure(config: pytest.Config) -> None:
    for table in (SUITE_MARKERS, HARDWARE_MARKERS, TOPOLOGY_MARKERS, OTHER_MARKERS):
        for name, text in table.items():
            config.addinivalue_line("markers", f"{name}: {text}")


def skip_reason(target: Target, marker_names: set[str]) -> str | None:
    """Why a test with these markers does not apply to the target, or None when it does."""
    hw = marker_names & set(HARDWARE_MARKERS)
    if hw and target.family not in hw:
        return (f"hardware mismatch: test is for {', '.join(sorted(hw))}; "
                f"target {target.name} is {target.family}")
    topo = marker_names & set(TOPOLOGY_MARKERS)
    if topo and target.topology_kind not in topo:
        return (f"topology mismatch: test is for {', '.join(sorted(topo))}; "
                f"target {target.name} is {target.topology_kind}")
    if "needs_proxy" in marker_names and target.serving.bypassed_proxy is not None:
        return f"--ml4-no-proxy: this run goes around {target.name}'s {target.serving.bypassed_proxy.kind} proxy"
    if "needs_proxy" in marker_names and not target.has_proxy:
        return f"target {target.name} has no proxy in front of the engine ({target.serving.stack})"
    if "dynamo" in marker_names and not target.is_dynamo:
        return f"target {target.name} is not served by Dynamo ({target.serving.stack})"
    return None


def real_vllm_skip_reason(nodeid: str, marker_names: set[str]) -> str | None:
    """Why a test does not apply to the tiny real-vLLM deployment (``pytest_ml4/data/vllm/scale_checks.yaml``)."""
    from pytest_ml4.realvllm.model import scale_check_reason

    if "sim_only" in marker_names:
        return "needs the embedded simulator (fault injection); --sim-engine vllm runs real vLLM"
    return scale_check_reason(nodeid)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = get_state(config)
    if state.target is None:
        return
    for item in items:
        names = {m.name for m in item.iter_markers()}
        reason = skip_reason(state.target, names)
        if reason is None and "sim_only" in names and not state.use_sim:
            reason = "needs the embedded simulator (--sim)"
        if reason is None and state.sim_engine == "vllm":
            reason = real_vllm_skip_reason(item.nodeid, names)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
