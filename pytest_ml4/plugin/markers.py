"""The suites' markers and what a check needs to apply: hardware, topology, proxy and Dynamo markers against the
target, ``sim_only`` without ``--sim``, the scale checks the tiny real-vLLM deployment cannot judge, and the needs
read from the target's own fields (:data:`NEED_MARKERS`: a field it must set, workers of a role, the embedded
deployment). A check that does not apply is decided here, at collection, before any request: a skip whose reason
starts with ``does not apply: `` (:data:`pytest_ml4.checks.verdict.DOES_NOT_APPLY_PREFIX`), never a pass and never
"not judged" (docs/decisions/checks-and-verdicts.md, "Four outcomes, and a run that was not judged is not signed")."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from pytest_ml4.checks.verdict import DOES_NOT_APPLY_PREFIX
from pytest_ml4.plugin.state import get_state
from pytest_ml4.stacks import stack_for, stack_markers
from pytest_ml4.target.model import Target

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
                 "(with the fixtures it sets up or tears down) does (pytest_ml4/client/lock.py)",
}
#: Markers whose arguments say what a check needs of the target; each is judged by :data:`NEEDS` from the target.
NEED_MARKERS = {
    "applies_if": "applies_if(FIELD, ..., why=TEXT): applies only where the target sets one of these dotted fields",
    "replicas": "replicas(ROLE, N): needs N workers of a role (stream: those holding a running stream; kv_routed: "
                "those the KV router places by prefix; largest: the role with the most workers)",
    "embedded_only": "stages its event through the embedded deployment (--sim, either engine); a live cluster cannot",
}


def _field(target: Target, dotted: str) -> Any:
    value: Any = target
    for part in dotted.split("."):
        value = getattr(value, part, None)
    return value


def _routed_role(target: Target) -> tuple[str, int]:
    """The workers the KV router places by prefix: the prefill role when disaggregated (control/dynamo.py)."""
    from pytest_ml4.control.dynamo import routed_phase

    topo = target.topology
    if routed_phase(topo.kind).prefill_instances:
        return "prefill", topo.prefill_workers
    return topo.stream_role()


def _largest_role(target: Target) -> tuple[str, int]:
    """The role with the most workers (disaggregated: prefill or decode): where one worker could answer apart."""
    topo = target.topology
    if topo.kind == "disagg":
        return max(("prefill", topo.prefill_workers), ("decode", topo.decode_workers), key=lambda r: r[1])
    return topo.stream_role()


#: Role name of ``replicas(ROLE, N)`` -> (the role's name on this target, its replica count).
ROLES: dict[str, Callable[[Target], tuple[str, int]]] = {
    "stream": lambda t: t.topology.stream_role(),
    "kv_routed": _routed_role,
    "largest": _largest_role,
}


def _applies_if(target: Target, mark: pytest.Mark, embedded: bool) -> str | None:
    if any(_field(target, f) not in (None, False, "", [], {}) for f in mark.args):
        return None
    why = mark.kwargs.get("why")
    return f"{target.name} sets no {' or '.join(mark.args)}" + (f" ({why})" if why else "")


def _replicas(target: Target, mark: pytest.Mark, embedded: bool) -> str | None:
    role_key, at_least = mark.args
    role, count = ROLES[role_key](target)
    if count >= at_least:
        return None
    return (f"{target.name} has {count} {role} worker(s) ({target.topology.kind} topology); this check needs "
            f"{at_least}" + (f" ({mark.kwargs['why']})" if mark.kwargs.get("why") else ""))


def _embedded_only(target: Target, mark: pytest.Mark, embedded: bool) -> str | None:
    if embedded:
        return None
    return ("staged only by the embedded deployment (--sim)"
            + (f": {mark.kwargs['why']}" if mark.kwargs.get("why") else ""))


#: Need marker -> the function saying why the target does not meet it (None when it does).
NEEDS: dict[str, Callable[[Target, pytest.Mark, bool], str | None]] = {
    "applies_if": _applies_if, "replicas": _replicas, "embedded_only": _embedded_only,
}


def unmet_need(target: Target, marks: Iterable[pytest.Mark], embedded: bool) -> str | None:
    """Why a check with these need markers does not apply to the target (the first unmet need), or None."""
    for mark in marks:
        judge = NEEDS.get(mark.name)
        reason = judge(target, mark, embedded) if judge is not None else None
        if reason:
            return reason
    return None


def does_not_apply(item: pytest.Item, reason: str) -> None:
    """Mark a collected check as not applying to the target, with the reason (never run, never a pass)."""
    item.add_marker(pytest.mark.skip(reason=DOES_NOT_APPLY_PREFIX + reason))


def pytest_configure(config: pytest.Config) -> None:
    for table in (SUITE_MARKERS, HARDWARE_MARKERS, TOPOLOGY_MARKERS, OTHER_MARKERS, NEED_MARKERS):
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
        return f"target {target.name} has no proxy in front of the engine ({stack_for(target).name})"
    return stack_marker_skip(target, marker_names)


def stack_marker_skip(target: Target, marker_names: set[str]) -> str | None:
    """A test marked for what only some stacks serve (``dynamo``), on a target whose stack does not."""
    stack = stack_for(target)
    for marker, serving in stack_markers().items():
        if marker in marker_names and marker not in stack.markers:
            return f"target {target.name} is not served by {serving} ({stack.name})"
    return None


def real_vllm_skip_reason(nodeid: str, marker_names: set[str]) -> str | None:
    """Why a test does not apply to the tiny real-vLLM deployment (``pytest_ml4/data/vllm/scale_checks.yaml``)."""
    from pytest_ml4.plugin.embedded import real_vllm_scale_reason

    if "sim_only" in marker_names:
        return "needs the embedded simulator (fault injection); --sim-engine vllm runs real vLLM"
    return real_vllm_scale_reason(nodeid)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = get_state(config)
    if state.target is None:
        return
    for item in items:
        names = {m.name for m in item.iter_markers()}
        reason = skip_reason(state.target, names)
        if reason is None and "sim_only" in names and not state.use_sim:
            reason = "needs the embedded simulator (--sim)"
        if reason is None:
            reason = unmet_need(state.target, item.iter_markers(), embedded=state.use_sim)
        if reason is None and state.sim_engine == "vllm":
            reason = real_vllm_skip_reason(item.nodeid, names)
        if reason:
            does_not_apply(item, reason)
