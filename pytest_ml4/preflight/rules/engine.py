"""Engine rules: memory on the 95 GiB RTX PRO card, the KV pool vs max-model-len, DSpark and the hybrid KV
cache manager, synthetic spec-decode acceptance, the RTX unit's allocator setting, and unparsable configs."""

from __future__ import annotations

from collections.abc import Iterator

from pytest_ml4.evidence.memory import MemoryPlan, plan_memory
from pytest_ml4.preflight.model import Finding, LintContext, Severity, VllmLaunch
from pytest_ml4.preflight.rules.common import EngineSite, engine_sites, truthy
from pytest_ml4.preflight.rules.registry import RULES, rule

ANY = ("vllm", "dgd", "litellm", "perf")
ENGINES = ("vllm", "dgd")
# Seed 000: "Free memory on device cuda:X (93.94/95.06 GiB) ... is less than desired GPU memory utilization".
_FREE_AT_START_FRACTION = 93.94 / 95.06


@rule("config-parse", Severity.ERROR,
      "config could not be read as written",
      "fix the syntax (valid YAML, balanced quotes, valid JSON in --speculative-config / --kv-transfer-config)",
      "issue 6 'Parsers': JSON-valued flags such as --speculative-config must parse; a flag the engine cannot "
      "parse stops it at start-up", ANY)
def check_parse(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["config-parse"]
    for doc in ctx.documents:
        for err in doc.errors:
            yield r.finding(doc, err)
    for site in engine_sites(ctx):
        for err in site.args.parse_errors:
            yield r.finding(site.doc, err, line=site.line, where=site.where)


@rule("rtx-moe-workspace-oom", Severity.ERROR,
      "gpu-memory-utilization >= 0.98 with max-num-batched-tokens >= 8192 on a 95 GiB card: the FusedMoE "
      "runner's 792 MiB workspace does not fit in the < 1 GiB left, the engine dies on its first big step",
      "use the stable unit's --gpu-memory-utilization 0.97 --max-num-batched-tokens 4096 (about 3 GiB headroom)",
      "seeds/000 'The crash: 792 MiB MoE workspace': crashing config --gpu-memory-utilization 0.98-0.983 "
      "--max-num-batched-tokens 8192; 'Tried to allocate 792.00 MiB ... of which 751.25 MiB is free'; also "
      "pytest_ml4.evidence.memory.plan_memory outcome oom_first_step", ENGINES)
def check_moe_oom(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["rtx-moe-workspace-oom"]
    for site in engine_sites(ctx):
        hw = site.doc.hardware
        if not hw.is_95gib_card:
            continue
        util, batched = site.util(), site.batched_tokens()
        if util > _FREE_AT_START_FRACTION:
            continue  # refused at start-up before any step: the start-up rule reports it
        if util >= 0.98 and batched >= 8192:
            yield r.finding(site.doc, f"--gpu-memory-utilization {util:g} --max-num-batched-tokens {batched}",
                            line=site.line, where=site.where)
            continue
        plan = _plan(site)
        if plan is not None and plan.outcome == "oom_first_step":
            yield r.finding(site.doc, f"memory model predicts it at util {util:g}, {batched} batched tokens "
                                      f"({plan.message})", line=site.line, where=site.where)


@rule("rtx-util-startup-refused", Severity.ERROR,
      "gpu-memory-utilization above the 93.94 of 95.06 GiB free at start-up on a 95 GiB card: vLLM refuses "
      "to start",
      "use --gpu-memory-utilization 0.97 (0.988 at the very most)",
      "seeds/000: '--gpu-memory-utilization 0.99 was refused at startup: Free memory on device cuda:X "
      "(93.94/95.06 GiB) ... is less than desired GPU memory utilization (0.99, 94.11 GiB)'", ENGINES)
def check_startup_refused(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["rtx-util-startup-refused"]
    for site in engine_sites(ctx):
        if site.doc.hardware.is_95gib_card and site.util() > _FREE_AT_START_FRACTION:
            total = site.doc.hardware.memory_per_gpu_gib or 95.06
            yield r.finding(site.doc, f"--gpu-memory-utilization {site.util():g} asks for "
                                      f"{site.util() * total:.2f} GiB", line=site.line, where=site.where)


def _plan(site: EngineSite) -> MemoryPlan | None:
    """The memory model's plan for this launch, or None without a target (no hardware spec to size against)."""
    hw = site.doc.hardware.spec
    engine = site.args.to_engine(site.base_engine())
    tp = site.tensor_parallel()
    if hw is None or engine is None or tp is None or tp < 1:
        return None
    return plan_memory(hw, engine, tp)


@rule("kv-pool-below-max-model-len", Severity.ERROR,
      "max-model-len is above the KV pool the memory model predicts: vLLM refuses to start ('To serve at "
      "least one request with the model's max seq len ...')",
      "lower --max-model-len to the predicted pool (or free memory: fewer batched tokens, more GPUs)",
      "seeds/000: 'the KV pool is sized from whatever memory is left' (272,636 tokens at max_model_len 204800) "
      "and open item 1 'verify GPU KV cache size >= 256,000 tokens'; vllm.md §9 too-short message; "
      "pytest_ml4.evidence.memory.plan_memory", ENGINES)
def check_kv_pool(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["kv-pool-below-max-model-len"]
    for site in engine_sites(ctx):
        plan = _plan(site)
        if plan is None or plan.outcome == "startup_refused":
            continue
        engine = site.args.to_engine(site.base_engine())
        mml = engine.max_model_len if engine is not None else 0
        if plan.outcome == "no_kv_memory" or plan.kv_pool_tokens < mml:
            est = " (estimate)" if plan.estimate else ""
            yield r.finding(site.doc, f"--max-model-len {mml} > predicted pool {plan.kv_pool_tokens} tokens{est}",
                            line=site.line, where=site.where)


@rule("dspark-hybrid-kv-manager", Severity.ERROR,
      "DSpark speculative decoding with the hybrid KV cache manager on: draft (sliding-window MLA) and target "
      "layers form two KV cache groups, a prefix hit needs both, continuation turns lose prefix reuse",
      "add --disable-hybrid-kv-cache-manager (on both roles when disaggregated)",
      "seeds/002 'GB300 settings / Hybrid KV cache manager off' and 'The recipes run with the vLLM hybrid KV "
      "cache manager off'; a plain vllm serve unit (seeds/000, measured with the manager on) gets a warning, "
      "since turning it off changes the KV pool that open item 1 checks", ENGINES)
def check_hybrid_manager(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["dspark-hybrid-kv-manager"]
    for site in engine_sites(ctx):
        spec = site.args.speculative() or {}
        if str(spec.get("method", "")).lower() != "dspark" or site.args.switch("disable-hybrid-kv-cache-manager"):
            continue
        severity = Severity.WARNING if isinstance(site.doc, VllmLaunch) else None
        yield r.finding(site.doc, "--disable-hybrid-kv-cache-manager missing", line=site.line, where=site.where,
                        severity=severity)


def synthetic_keys(obj: object, trail: str = "") -> list[str]:
    """Keys/values that switch on synthetic acceptance (any key or string value mentioning 'synthetic')."""
    found: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{trail}.{key}" if trail else str(key)
            if "synthetic" in str(key).lower() and value not in (None, False, 0, "", "none"):
                found.append(path)
            else:
                found += synthetic_keys(value, path)
    elif isinstance(obj, str) and "synthetic" in obj.lower():
        found.append(f"{trail}={obj}")
    return found


@rule("spec-synthetic-acceptance", Severity.ERROR,
      "synthetic spec-decode acceptance in a deployment that is not a pure performance run: outputs are not "
      "the model's, accuracy and tool-call checks become meaningless",
      "use real DSpark acceptance; only a performance-only deployment annotated "
      "'pytest-ml4/run-purpose: performance' (units: X-ML4-Run-Purpose=performance) may use it",
      "seeds/002 Notes 'Speculative decoding': 'A synthetic-acceptance alternative is commented next to the flag "
      "for performance benchmarking only; never use it for accuracy evaluation'", ENGINES)
def check_synthetic(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["spec-synthetic-acceptance"]
    for site in engine_sites(ctx):
        if site.doc.run_purpose == "performance":
            continue
        hits = synthetic_hits(site)
        if hits:
            yield r.finding(site.doc, ", ".join(hits), line=site.line, where=site.where)


def synthetic_hits(site: EngineSite) -> list[str]:
    """What switches synthetic acceptance on at one engine launch (spec config, flags, environment); also the
    accuracy gate's guard, which refuses it even in a performance-only deployment."""
    hits = synthetic_keys(site.args.speculative() or {})
    hits += [f"--{f}" for f in site.args.flags if "synthetic" in f]
    hits += [k for k, v in site.env.items() if "SYNTHETIC" in k.upper() and truthy(v)]
    return hits


@rule("rtx-expandable-segments", Severity.ERROR,
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True missing from the RTX PRO engine's environment: "
      "fragmentation eats the headroom the 792 MiB FusedMoE workspace needs",
      "add Environment=PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to the unit",
      "seeds/000 'Hardware and deployment, as logged': 'PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in "
      "the unit environment'", ("vllm",))
def check_expandable(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["rtx-expandable-segments"]
    for doc in ctx.of(VllmLaunch):
        if not doc.hardware.is_95gib_card:
            continue
        conf = doc.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if "expandable_segments:true" not in conf.replace(" ", "").lower():
            detail = f"PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else "PYTORCH_CUDA_ALLOC_CONF not set"
            yield r.finding(doc, detail, line=doc.engine.line, where="vllm serve")



@rule("expandable-segments-kv-connector", Severity.ERROR,
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True together with a KV connector (NIXL, MultiConnector, or "
      "the OffloadingConnector --kv-offloading-size creates): vLLM refuses the combination at start-up",
      "drop expandable_segments from the worker environment (it is an RTX PRO unit setting, not a Dynamo one)",
      "dynamo.md §8: 'vLLM rejects any KV connector together with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
      "unless the cumem allocator is on'; --enable-sleep-mode (which uses vLLM's cumem allocator) is taken as "
      "'on', an assumption the reference does not spell out", ENGINES)
def check_expandable_with_connector(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["expandable-segments-kv-connector"]
    for site in engine_sites(ctx):
        conf = site.env.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()
        if "expandable_segments:true" not in conf or site.args.switch("enable-sleep-mode"):
            continue
        connector = site.args.kv_transfer()
        if connector or site.args.has("kv-offloading-size"):
            what = connector.get("kv_connector") if connector else "--kv-offloading-size"
            yield r.finding(site.doc, f"expandable_segments with {what}", line=site.line, where=site.where)
