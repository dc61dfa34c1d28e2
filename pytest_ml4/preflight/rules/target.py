"""Target drift: a manifest that says something else than the target YAML the suites judge it by."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pytest_ml4.preflight.model import (
    DgdDocument,
    Finding,
    LintContext,
    LiteLLMConfig,
    PerfRun,
    Severity,
    VllmLaunch,
)
from pytest_ml4.preflight.rules.common import EngineSite, engine_sites
from pytest_ml4.preflight.rules.engine import synthetic_keys
from pytest_ml4.preflight.rules.registry import RULES, rule
from pytest_ml4.preflight.shell import expand_vars
from pytest_ml4.target.model import Target


def engine_drift(site: EngineSite) -> list[str]:
    """Where the launch's flags disagree with the target's engine section (only flags the launch sets)."""
    base = site.base_engine()
    target = site.doc.target
    if base is None or target is None:
        return []
    out: list[str] = []
    for flag, want in (("max-model-len", base.max_model_len), ("max-num-seqs", base.max_num_seqs),
                       ("max-num-batched-tokens", base.max_num_batched_tokens),
                       ("gpu-memory-utilization", base.gpu_memory_utilization), ("block-size", base.block_size),
                       ("tensor-parallel-size", target.topology.tensor_parallel),
                       ("kv-offloading-size", base.kv_offloading_size_gib)):
        have = site.args.number(flag)
        if have is not None and (want is None or abs(have - float(want)) > 1e-9):
            out.append(f"--{flag} {have:g} vs {want}")
    dtype = site.args.kv_cache_dtype()
    if dtype is not None and dtype != base.kv_cache_dtype:
        out.append(f"--kv-cache-dtype {dtype} vs {base.kv_cache_dtype}")
    spec = site.args.speculative() or {}
    want_spec = base.speculative
    have_spec = (str(spec.get("method")), int(spec.get("num_speculative_tokens", 0))) if spec else None
    if have_spec != ((want_spec.method, want_spec.num_speculative_tokens) if want_spec else None):
        out.append(f"speculative {have_spec} vs {want_spec.method if want_spec else None}")
    synthetic = bool(synthetic_keys(spec))
    if want_spec is not None and synthetic != want_spec.synthetic_acceptance:
        out.append(f"synthetic acceptance {synthetic} vs {want_spec.synthetic_acceptance}")
    if site.args.switch("disable-hybrid-kv-cache-manager") != base.disable_hybrid_kv_cache_manager:
        out.append(f"--disable-hybrid-kv-cache-manager vs {base.disable_hybrid_kv_cache_manager}")
    served = site.args.get("served-model-name")
    want_name = target.serving.engine_served_model_name or target.serving.served_model_name
    if served is not None and served != want_name:
        out.append(f"--served-model-name {served} vs {want_name}")
    return out


def dgd_drift(doc: DgdDocument, target: Target) -> list[str]:
    """DGD name (restart control and log reading find pods by it) and replica counts vs the target."""
    out: list[str] = []
    if target.control.dgd and target.control.dgd != doc.name:
        out.append(f"DGD name {doc.name} vs control.dgd {target.control.dgd}")
    topo = target.topology
    for role, want in (("agg", topo.workers if topo.kind == "agg" else None),
                       ("prefill", topo.prefill_workers or None), ("decode", topo.decode_workers or None)):
        comps = doc.by_role(role)
        have = sum(c.replicas or 1 for c in comps)
        if want is not None and comps and have != want:
            out.append(f"{role} replicas {have} vs topology {want}")
    return out


def unit_drift(doc: VllmLaunch, target: Target) -> list[str]:
    """The unit file's name is what journald reading and restarts address (target logs.unit / control.unit)."""
    if doc.kind != "systemd":
        return []
    name = Path(doc.path).name
    wants = {u for u in (target.control.unit, target.logs.unit) if u}
    return [f"unit file {name} vs target unit {u}" for u in sorted(wants) if u != name]


def proxy_drift(doc: LiteLLMConfig, target: Target) -> list[str]:
    proxy = target.serving.proxy
    if proxy is None:
        return []
    aliases = {str(d.get("model_name")) for d in doc.deployments()}
    if proxy.model_alias in aliases:
        return []
    return [f"model_name {sorted(aliases)} vs proxy.model_alias {proxy.model_alias}"]


def perf_drift(doc: PerfRun, target: Target) -> list[str]:
    """Measured-window length and concurrency of an aiperf run vs the target's perf section."""
    out: list[str] = []
    for inv in doc.invocations:
        duration = inv.args.number("benchmark-duration")
        if duration is not None and duration != target.perf.duration_s:
            out.append(f"--benchmark-duration {duration:g} vs perf.duration_s {target.perf.duration_s:g}")
        raw = inv.args.get("concurrency")
        value = expand_vars(raw, doc.env) if raw else None
        if duration is not None and value and value.isdigit() and int(value) not in target.perf.concurrencies:
            out.append(f"--concurrency {value} not in perf.concurrencies {target.perf.concurrencies}")
    return out


@rule("target-manifest-drift", Severity.ERROR,
      "manifest differs from the target YAML the suites judge it by: memory, KV and perf gates, log reading and "
      "restarts then address a configuration that is not the one running",
      "make targets/<name>.yaml (engine / prefill_engine / topology / serving / control / logs) and the manifest "
      "say the same",
      "docs/ARCHITECTURE.md 'every default number ... names the seed or reference line it comes from': the target "
      "is the suite's copy of the seed's flags (seeds/000 stable unit, seeds/002 recipes), the manifest the "
      "deployed one", ("vllm", "dgd", "litellm", "perf"))
def check_drift(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["target-manifest-drift"]
    for site in engine_sites(ctx):
        diffs = engine_drift(site)
        if diffs and site.doc.target is not None:
            yield r.finding(site.doc, f"target {site.doc.target.name}: " + "; ".join(diffs), line=site.line,
                            where=site.where)
    for doc in ctx.documents:
        target = doc.target
        if target is None:
            continue
        if isinstance(doc, DgdDocument):
            diffs = dgd_drift(doc, target)
        elif isinstance(doc, VllmLaunch):
            diffs = unit_drift(doc, target)
        elif isinstance(doc, LiteLLMConfig):
            diffs = proxy_drift(doc, target)
        elif isinstance(doc, PerfRun):
            diffs = perf_drift(doc, target)
        else:
            diffs = []
        if diffs:
            yield r.finding(doc, f"target {target.name}: " + "; ".join(diffs))
