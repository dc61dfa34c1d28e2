"""Dynamo rules: disaggregated KV handoff and role consistency, DGD names, the frontend (chat processor,
session affinity, migration), the Vera Rubin stability settings and the Mistral parsers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

from pytest_ml4.preflight.model import (
    DgdComponent,
    DgdDocument,
    Finding,
    LintContext,
    PerfRun,
    Severity,
)
from pytest_ml4.preflight.rules.common import engine_sites, truthy
from pytest_ml4.preflight.rules.registry import RULES, rule

DGD = ("dgd",)
_PD_CAPABLE = {"NixlConnector"}  # the PD-capable child Dynamo requires exactly one of (dynamo.md §8)


#: What a component must have parsed to be judged: a worker's engine arguments or a frontend's settings.
Part = Literal["engine", "frontend"]


def _components(doc: DgdDocument, *roles: str, part: Part = "engine") -> list[DgdComponent]:
    """The components of ``doc`` in ``roles`` (every role when none is given) that have ``part`` parsed: the one
    walk over a DGD that every rule here uses."""
    return [c for c in doc.components if (not roles or c.role in roles) and getattr(c, part) is not None]


def _frontends(doc: DgdDocument) -> list[DgdComponent]:
    return _components(doc, "frontend", part="frontend")


def _where(doc: DgdDocument, comp: DgdComponent, *, role: bool = False) -> str:
    """``dgd/component`` (with ``(role)`` for a worker), the ``where`` of a finding on one component."""
    return f"{doc.name}/{comp.name}" + (f" ({comp.role})" if role else "")


def _connectors(cfg: dict[str, Any] | None) -> list[str]:
    """Connector names of a --kv-transfer-config, MultiConnector children flattened."""
    if not cfg:
        return []
    name = str(cfg.get("kv_connector", ""))
    if name == "MultiConnector":
        children = ((cfg.get("kv_connector_extra_config") or {}).get("connectors")) or []
        return [str(c.get("kv_connector", "")) for c in children if isinstance(c, dict)]
    return [name] if name else []


@rule("disagg-kv-connector", Severity.ERROR,
      "disaggregated worker without a NIXL handoff: --kv-offloading-size (alone or next to a connector) replaces "
      "NixlConnector with the OffloadingConnector and silently disables the prefill->decode KV transfer",
      "drop --kv-offloading-size and pass --kv-transfer-config with a MultiConnector holding NixlConnector and "
      "the OffloadingConnector, identically on prefill and decode",
      "seeds/002 'Host KV tier': 'Disaggregated wraps the OffloadingConnector in a MultiConnector next to NIXL on "
      "both roles; setting only --kv-offloading-size replaces NIXL and silently disables the handoff'; dynamo.md "
      "§8 (_post_init_kv_transfer_config overwrites kv_connector)", DGD)
def check_disagg_connector(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["disagg-kv-connector"]
    for doc in ctx.of(DgdDocument):
        if not doc.is_disagg:
            continue
        shapes = {}
        for comp in _components(doc, "prefill", "decode"):
            assert comp.engine is not None
            where = _where(doc, comp, role=True)
            names = _connectors(comp.engine.kv_transfer())
            shapes[comp.role] = sorted(names)
            if comp.engine.has("kv-offloading-size"):
                yield r.finding(doc, "--kv-offloading-size set", line=comp.line, where=where)
            elif not _PD_CAPABLE & set(names):
                yield r.finding(doc, f"no NixlConnector in --kv-transfer-config (connectors: {names or 'none'})",
                                line=comp.line, where=where)
        if len(set(map(tuple, shapes.values()))) > 1:
            yield r.finding(doc, f"roles use different connectors {shapes}; the MultiConnector must match on "
                                 "both roles", where=doc.name)


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if value is not None else "unset"


@rule("disagg-role-mismatch", Severity.ERROR,
      "prefill and decode differ in block size, speculative configuration or KV cache dtype: the KV handed "
      "over does not match the layout the decode side expects",
      "give both roles the same --block-size (64), the same --speculative-config and the same --kv-cache-dtype",
      "seeds/002 'GB300 settings / Disaggregated transfer': 'Prefill and decode must use the same block size "
      "(64) and speculative configuration'; 'Vera Rubin settings / KV cache': 'Both roles of a disaggregated "
      "deployment must use the same dtype'; Notes: synthetic acceptance 'set it on both roles or neither'", DGD)
def check_role_mismatch(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["disagg-role-mismatch"]
    for doc in ctx.of(DgdDocument):
        comps = _components(doc, "prefill", "decode")
        decode = next((c for c in comps if c.role == "decode"), None)
        if decode is None or decode.engine is None:
            continue
        for other in comps:
            if other is decode or other.engine is None:
                continue
            for label, get in (("block size", lambda e: e.block_size()),
                               ("speculative config", lambda e: e.speculative()),
                               ("KV cache dtype", lambda e: e.kv_cache_dtype())):
                a, b = get(other.engine), get(decode.engine)
                if _canon(a) != _canon(b):
                    yield r.finding(doc, f"{label}: {other.name} ({other.role}) {_canon(a)} vs {decode.name} "
                                         f"(decode) {_canon(b)}", line=other.line, where=doc.name)


@rule("dgd-name-prefix", Severity.ERROR,
      "two DynamoGraphDeployments in one namespace where one name is a prefix of the other: the frontend "
      "cross-routes requests between them",
      "rename one deployment (or move it to another namespace) so neither name is a prefix of the other",
      "seeds/002 Notes 'Concurrent deployments': 'Never run two DynamoGraphDeployments in one namespace where one "
      "name is a prefix of the other; the frontend cross-routes requests between them'", DGD)
def check_name_prefix(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["dgd-name-prefix"]
    dgds = ctx.of(DgdDocument)
    for i, a in enumerate(dgds):
        for b in dgds[i + 1:]:
            # An unset namespace is whatever `kubectl apply -n` gets, so it may be the other one's.
            same_ns = a.namespace is None or b.namespace is None or a.namespace == b.namespace
            if not same_ns or not a.name or not b.name:
                continue
            short, long_ = sorted((a, b), key=lambda d: len(d.name))
            if long_.name.startswith(short.name):
                for doc in (a, b):
                    other = b if doc is a else a
                    yield r.finding(doc, f"'{short.name}' is a prefix of '{long_.name}' (other: {other.path})",
                                    where=doc.name)


@rule("frontend-chat-processor", Severity.ERROR,
      "frontend does not use the Dynamo chat processor: the vLLM processor drops x-dynamo-session-id and "
      "bypasses the Mistral tool/reasoning parsing the workers are set up for",
      "remove --dyn-chat-processor (default dynamo) or set it to dynamo",
      "seeds/002 Notes 'Session affinity': 'Keep the Dynamo chat processor; the vLLM processor drops this header' "
      "and 'Tool calls': 'keep the Dynamo chat processor'; flag name --dyn-chat-processor (default dynamo) from "
      "the public Dynamo docs (chat-processors.mdx), not in dynamo.md; the DYN_CHAT_PROCESSOR env twin is assumed "
      "from Dynamo's DYN_* flag convention", DGD)
def check_chat_processor(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["frontend-chat-processor"]
    for doc in ctx.of(DgdDocument):
        for comp in _frontends(doc):
            assert comp.frontend is not None
            value = comp.frontend.setting("dyn-chat-processor", "DYN_CHAT_PROCESSOR")
            if value is not None and value.lower() != "dynamo":
                yield r.finding(doc, f"--dyn-chat-processor {value}", line=comp.line, where=_where(doc, comp))


def _clients_send_session_ids(doc: DgdDocument, ctx: LintContext) -> str | None:
    """Why we believe clients of ``doc`` send x-dynamo-session-id, or None."""
    if doc.target is not None and doc.target.serving.session_affinity:
        return f"target {doc.target.name} has serving.session_affinity: true"
    for perf in ctx.of(PerfRun):
        if perf.target_dgd not in (None, doc.name):
            continue
        if truthy(perf.env.get("AIPERF_HTTP_X_DYNAMO_SESSION_ID_FROM_CORRELATION_ID", "")):
            return f"{perf.path} sets AIPERF_HTTP_X_DYNAMO_SESSION_ID_FROM_CORRELATION_ID"
        for inv in perf.invocations:
            if any(h and "x-dynamo-session-id" in h.lower() for h in inv.args.flags.get("header", [])):
                return f"{perf.path} sends an X-Dynamo-Session-ID header"
    return None


@rule("session-affinity-ttl", Severity.ERROR,
      "clients send x-dynamo-session-id but the frontend has no session affinity TTL: the header gives session "
      "identity only, requests of one conversation land on different workers and lose their KV prefix",
      "set --router-session-affinity-ttl-secs (1..31536000) or DYN_ROUTER_SESSION_AFFINITY_TTL_SECS on the "
      "frontend, with --router-mode kv",
      "seeds/002 Notes 'Session affinity': 'Clients send x-dynamo-session-id so the KV router can pin a "
      "conversation to a worker'; dynamo.md §5: 'Session affinity is disabled by default ... Supplying the header "
      "without the TTL option provides session identity but does not enable router affinity'", DGD + ("perf",))
def check_session_ttl(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["session-affinity-ttl"]
    for doc in ctx.of(DgdDocument):
        why = _clients_send_session_ids(doc, ctx)
        if why is None:
            continue
        for comp in _frontends(doc):
            assert comp.frontend is not None
            raw = comp.frontend.setting("router-session-affinity-ttl-secs", "DYN_ROUTER_SESSION_AFFINITY_TTL_SECS")
            ok = raw is not None and raw.isdigit() and 1 <= int(raw) <= 31536000
            if not ok:
                detail = "TTL unset" if raw is None else f"TTL {raw!r} outside 1..31536000"
                yield r.finding(doc, f"{detail} ({why})", line=comp.line, where=_where(doc, comp))


@rule("migration-limit", Severity.ERROR,
      "request migration off (--migration-limit 0, the default): a worker restart fails every in-flight request "
      "instead of moving it to another worker",
      "set --migration-limit 3 (or DYN_MIGRATION_LIMIT=3) on the frontend",
      "dynamo.md §6: 'Frontend --migration-limit / DYN_MIGRATION_LIMIT: default 0 (off); the docs say \"Start with "
      "3\"'; targets/*.yaml serving.migration_limit: 3", DGD)
def check_migration(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["migration-limit"]
    for doc in ctx.of(DgdDocument):
        fronts = _frontends(doc)
        values = [c.frontend.setting("migration-limit", "DYN_MIGRATION_LIMIT") for c in fronts if c.frontend]
        # Older Dynamo releases took the flag on the workers; accept it there too.
        values += [c.engine.get("migration-limit") for c in _components(doc) if c.engine is not None]
        set_values = [v for v in values if v is not None]
        if not fronts:
            continue
        if not set_values:
            yield r.finding(doc, "--migration-limit unset (default 0)", line=fronts[0].line, where=doc.name)
        elif any(not v.isdigit() or int(v) == 0 for v in set_values):
            yield r.finding(doc, f"--migration-limit {', '.join(set_values)}", line=fronts[0].line, where=doc.name)


def _eagle_block_drop_disabled(comp: DgdComponent) -> bool:
    eng = comp.engine
    if eng is None:
        return False
    for name in ("speculative-config", "additional-config"):
        if truthy((eng.json(name) or {}).get("disable_eagle_block_drop", False)):
            return True
    return eng.switch("disable-eagle-block-drop") or truthy(comp.env.get("VLLM_DISABLE_EAGLE_BLOCK_DROP", ""))


def _vr_missing(comp: DgdComponent, disagg: bool) -> list[str]:
    env = comp.env
    missing = []
    if env.get("VLLM_USE_BREAKABLE_CUDAGRAPH") != "0":
        missing.append("VLLM_USE_BREAKABLE_CUDAGRAPH=0")
    if str(env.get("DYN_HEALTH_CHECK_ENABLED", "")).lower() != "false":
        missing.append("DYN_HEALTH_CHECK_ENABLED=false")
    if not _eagle_block_drop_disabled(comp):
        missing.append("disable_eagle_block_drop")
    if disagg:
        if env.get("NIXL_TELEMETRY_ENABLE", "").lower() not in ("y", "yes"):
            missing.append("NIXL_TELEMETRY_ENABLE=y")
        if env.get("UCX_CUDA_IPC_ENABLE_MNNVL", "").lower() not in ("y", "yes"):
            missing.append("UCX_CUDA_IPC_ENABLE_MNNVL=y")
        tls = {t.strip() for t in env.get("UCX_TLS", "").split(",")}
        if not {"cuda_copy", "cuda_ipc", "tcp"} <= tls:
            missing.append("UCX_TLS=cuda_copy,cuda_ipc,tcp")
    return missing


@rule("vr200-stability", Severity.ERROR,
      "Vera Rubin worker without the recipe's stability/transfer settings: CUDA-graph breaks, health-canary "
      "timeouts under long prefills, dropped trailing prefix blocks, or failing NIXL transfers",
      "set VLLM_USE_BREAKABLE_CUDAGRAPH=0, DYN_HEALTH_CHECK_ENABLED=false, disable_eagle_block_drop (in "
      "--speculative-config) and, disaggregated, NIXL_TELEMETRY_ENABLE=y, UCX_CUDA_IPC_ENABLE_MNNVL=y, "
      "UCX_TLS=cuda_copy,cuda_ipc,tcp",
      "seeds/002 'Vera Rubin settings': Stability 'VLLM_USE_BREAKABLE_CUDAGRAPH=0, DYN_HEALTH_CHECK_ENABLED=false "
      "... and disable_eagle_block_drop (DSpark counts as eagle ...)'; Disaggregated transfer "
      "'UCX_CUDA_IPC_ENABLE_MNNVL=y with UCX_TLS=cuda_copy,cuda_ipc,tcp ... NIXL_TELEMETRY_ENABLE=y is required "
      "because the operator injects n'; where disable_eagle_block_drop lives is not stated, so a "
      "speculative/additional-config key, a --disable-eagle-block-drop switch or VLLM_DISABLE_EAGLE_BLOCK_DROP "
      "are accepted", DGD)
def check_vr200(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["vr200-stability"]
    for doc in ctx.of(DgdDocument):
        if doc.hardware.family != "vr200":
            continue
        for comp in _components(doc):
            missing = _vr_missing(comp, doc.is_disagg)
            if missing:
                yield r.finding(doc, "missing " + ", ".join(missing), line=comp.line, where=_where(doc, comp, role=True))


@rule("dynamo-mistral-parsers", Severity.ERROR,
      "Mistral tool-call/reasoning parsing not set up: tool calls and reasoning come back as plain content",
      "workers: --dyn-tool-call-parser mistral --dyn-reasoning-parser mistral; frontend: DYN_PARSER_VERSION=2; "
      "plain vllm serve: --tool-call-parser mistral --reasoning-parser mistral --enable-auto-tool-choice",
      "seeds/002 'Tool calls': 'Workers run --dyn-tool-call-parser mistral --dyn-reasoning-parser mistral and the "
      "frontend sets DYN_PARSER_VERSION=2'; seeds/000 stable unit '--reasoning-parser mistral --tool-call-parser "
      "mistral --enable-auto-tool-choice'", ("vllm", "dgd"))
def check_parsers(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["dynamo-mistral-parsers"]
    for site in engine_sites(ctx):
        if site.component is None:
            need = {"tool-call-parser": "mistral", "reasoning-parser": "mistral"}
            missing = [f"--{k} {v}" for k, v in need.items() if (site.args.get(k) or "").lower() != v]
            if not site.args.switch("enable-auto-tool-choice"):
                missing.append("--enable-auto-tool-choice")
        else:
            need = {"dyn-tool-call-parser": "mistral", "dyn-reasoning-parser": "mistral"}
            missing = [f"--{k} {v}" for k, v in need.items() if (site.args.get(k) or "").lower() != v]
        if missing:
            yield r.finding(site.doc, "missing " + ", ".join(missing), line=site.line, where=site.where)
    for doc in ctx.of(DgdDocument):
        for comp in _frontends(doc):
            if comp.env.get("DYN_PARSER_VERSION") != "2":
                yield r.finding(doc, f"frontend DYN_PARSER_VERSION={comp.env.get('DYN_PARSER_VERSION', 'unset')}",
                                line=comp.line, where=_where(doc, comp))


def _mistral_parser_sites(doc: DgdDocument) -> list[str]:
    """The workers of ``doc`` that run a ``mistral`` tool-call or reasoning parser."""
    return [c.name for c in _components(doc) if c.engine is not None and "mistral" in {
        (c.engine.get("dyn-tool-call-parser") or "").lower(), (c.engine.get("dyn-reasoning-parser") or "").lower()}]


@rule("dynamo-parser-v2-unserved", Severity.ERROR,
      "the frontend sets DYN_PARSER_VERSION=2 with the workers' mistral parsers on a Dynamo image that has no "
      "Mistral v2 parser: the model is never served (every request 404 with an empty body; frontend log 'the "
      "configured parser pair has no compatible unified v2 implementation')",
      "run an image whose Dynamo has a Mistral v2 parser (pytest_ml4/data/dynamo/versions.yaml mistral_parser_v2: true, "
      "e.g. the seed's vllm-runtime:1.7.0-mistral-large-4-dev.1); on a public 1.6.x image unset "
      "DYN_PARSER_VERSION instead, knowing 1.6.x then drops Mistral Large 4's [TOOL_CALLS]name[ARGS] calls",
      "reference/real-dynamo.md 'Mistral parsing in 1.6.1' (DYN_PARSER_VERSION=2 column: 'model never served: every "
      "request 404, empty body') and real-dynamo-1.6.1-transcripts/python-worker/31_v2_*; seeds/002 'the frontend "
      "sets DYN_PARSER_VERSION=2'; the version from the frontend container's image tag", DGD)
def check_parser_v2_served(ctx: LintContext) -> Iterator[Finding]:
    from pytest_ml4.stacks.dynamo_versions import behaviour, image_version

    r = RULES["dynamo-parser-v2-unserved"]
    for doc in ctx.of(DgdDocument):
        workers = _mistral_parser_sites(doc)
        for comp in _frontends(doc):
            if comp.env.get("DYN_PARSER_VERSION") != "2" or not workers:
                continue
            version = image_version(comp.image)
            row = behaviour(version) if version else None
            # An image whose version the table does not know is not judged here: no evidence either way.
            if row is not None and not row.mistral_parser_v2:
                yield r.finding(doc, f"frontend image {comp.image} (Dynamo {version}, no Mistral v2 parser) with "
                                     f"DYN_PARSER_VERSION=2 and mistral parsers on {', '.join(workers)}",
                                line=comp.line, where=_where(doc, comp))
