"""aiperf rules: fixed output length through ``min_tokens`` (never ``ignore_eos``), fresh artifact directories,
and perf Jobs pointed at a deployment that exists."""

from __future__ import annotations

from collections.abc import Iterator

from pytest_ml4.preflight.model import (
    AiperfInvocation,
    DgdDocument,
    Finding,
    LintContext,
    PerfRun,
    Severity,
)
from pytest_ml4.preflight.rules.common import truthy
from pytest_ml4.preflight.rules.registry import RULES, rule
from pytest_ml4.preflight.shell import is_run_unique

PERF = ("perf",)
_OSL_FLAGS = ("osl", "prompt-output-tokens-mean", "output-tokens-mean", "synthetic-output-tokens-mean")
# aiperf.md §4.5: the agentic scenario locks streaming and injects ignore_eos=true.
_IGNORE_EOS_SCENARIOS = ("inferencex-agentx-mvp",)


def _fixed_osl(inv: AiperfInvocation) -> int | None:
    for flag in _OSL_FLAGS:
        value = inv.args.number(flag)
        if value is not None:
            return int(value)
    return None


@rule("aiperf-ignore-eos", Severity.ERROR,
      "aiperf run with ignore_eos: EOS can be sampled anyway, the Mistral reasoning grammar then rejects tokens "
      "[2, 34] and the request is killed (ParserTooComplex)",
      "drop ignore_eos (and the inferencex-agentx-mvp scenario, which injects it); fix the output length with "
      "--extra-inputs 'min_tokens:<OSL>'",
      "seeds/000 'Measurement procedure': 'fixed-OSL benchmarks must use --extra-inputs min_tokens:4096, not "
      "ignore_eos: true ... the reasoning grammar then rejects tokens [2, 34] and the request is killed "
      "(ParserTooComplex)'; aiperf.md §4.5 (scenario injects ignore_eos=true)", PERF)
def check_ignore_eos(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["aiperf-ignore-eos"]
    for perf in ctx.of(PerfRun):
        for inv in perf.invocations:
            extra = inv.extra_inputs()
            if "ignore_eos" in extra and truthy(extra["ignore_eos"]):
                yield r.finding(perf, "--extra-inputs ignore_eos:true", line=inv.line, where=perf.name)
            scenario = inv.args.get("scenario")
            if scenario in _IGNORE_EOS_SCENARIOS:
                yield r.finding(perf, f"--scenario {scenario} injects ignore_eos=true", line=inv.line,
                                where=perf.name)


@rule("aiperf-fixed-osl-min-tokens", Severity.ERROR,
      "fixed-OSL aiperf run without min_tokens >= OSL: the model stops at EOS and the output lengths (and every "
      "per-token figure) drift from the nominal OSL",
      "add --extra-inputs 'min_tokens:<OSL>' next to the output-length flag",
      "seeds/000 'Measurement procedure': '--prompt-output-tokens-mean 4096 --extra-inputs min_tokens:4096' gave "
      "'output sequence length was exactly 4096.0 at every concurrency'; tooling.md §3.4 (drop_params passes "
      "min_tokens through the proxy)", PERF)
def check_min_tokens(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["aiperf-fixed-osl-min-tokens"]
    for perf in ctx.of(PerfRun):
        for inv in perf.invocations:
            osl = _fixed_osl(inv)
            if osl is None:
                continue
            raw = inv.extra_inputs().get("min_tokens")
            try:
                min_tokens = int(raw) if raw is not None else None
            except (TypeError, ValueError):
                min_tokens = None
            if min_tokens is None:
                yield r.finding(perf, f"OSL {osl} without min_tokens", line=inv.line, where=perf.name)
            elif min_tokens < osl:
                yield r.finding(perf, f"min_tokens {min_tokens} < OSL {osl}", line=inv.line, where=perf.name)


@rule("aiperf-artifact-dir-reuse", Severity.ERROR,
      "aiperf artifact directory reused (shared by two runs, or the same on every execution): exports of "
      "different runs overwrite or mix, and a gate can read a previous run's profile_export_aiperf.json",
      "give every run its own directory, e.g. RUN_ID=$(date +%s)-$HOSTNAME and --artifact-dir $ROOT/$RUN_ID/c$N",
      "seeds/000 'Reproduce / check': 'use a unique --output-artifact-dir per batch'; dynamo.md §7: results under "
      "/model-cache/perf/<epoch>_<job-name>/; aiperf.md §6 (exports written into the artifact dir)", PERF)
def check_artifact_dir(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["aiperf-artifact-dir-reuse"]
    for perf in ctx.of(PerfRun):
        seen: dict[str, AiperfInvocation] = {}
        for inv in perf.invocations:
            art = inv.artifact_dir
            if art is None:
                yield r.finding(perf, "no --artifact-dir: aiperf's default directory is the same on every run",
                                line=inv.line, where=perf.name)
                continue
            if art in seen:
                yield r.finding(perf, f"'{art}' also used by the command on line {seen[art].line}", line=inv.line,
                                where=perf.name)
                continue
            seen[art] = inv
            if not is_run_unique(art, perf.run_unique_vars):
                yield r.finding(perf, f"'{art}' is the same on the next run (no timestamp/uuid/pod-name part)",
                                line=inv.line, where=perf.name)


@rule("perf-job-dgd", Severity.ERROR,
      "perf Job's podAffinity points at a DynamoGraphDeployment that is not among the linted manifests: it "
      "benchmarks another deployment, or waits forever to be scheduled",
      "set the podAffinity nvidia.com/dynamo-graph-deployment-name value (and ENDPOINT) to the deployed DGD",
      "seeds/002 'Benchmark': 'Set ENDPOINT, CONCURRENCY and the podAffinity DGD name for the deployed recipe'; "
      "dynamo.md §2 (perf Job podAffinity selector)", PERF)
def check_perf_dgd(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["perf-job-dgd"]
    names = {d.name for d in ctx.of(DgdDocument)}
    if not names:
        return  # linting a Job alone: nothing to compare with
    for perf in ctx.of(PerfRun):
        if perf.target_dgd is not None and perf.target_dgd not in names:
            yield r.finding(perf, f"podAffinity DGD '{perf.target_dgd}' not in {sorted(names)}", where=perf.name)
        endpoint = perf.env.get("ENDPOINT", "")
        if perf.target_dgd and endpoint and not endpoint.startswith(f"{perf.target_dgd}-frontend"):
            yield r.finding(perf, f"ENDPOINT {endpoint} is not {perf.target_dgd}-frontend", where=perf.name)
