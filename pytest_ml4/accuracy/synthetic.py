"""The accuracy gate refuses to certify a deployment that runs DSpark's synthetic acceptance.

Seed 002 ('Speculative decoding'): the synthetic-acceptance alternative is "for performance benchmarking only;
never use it for accuracy evaluation". Detection is the preflight rule ``spec-synthetic-acceptance``'s
(:func:`pytest_ml4.preflight.rules.engine.synthetic_hits`), applied here to every engine launch in the manifests,
performance-annotated ones included, plus the target's own engine flags: what the deployment declares. And the
running engine is asked: the speculative config its log shows since its last boot (vLLM's ``non-default args``
line, the engine core's ``Initializing a V1 LLM engine ... speculative_config=`` line, which real ``dynamo.vllm``
workers log too). A launch changed by hand after the manifests were reviewed shows only there.
"""

from __future__ import annotations

from pathlib import Path

from pytest_ml4.logs.events import LogView, SpeculativeSetting
from pytest_ml4.preflight.loader import load_paths
from pytest_ml4.preflight.model import LintContext
from pytest_ml4.preflight.rules.common import engine_sites
from pytest_ml4.preflight.rules.engine import synthetic_hits
from pytest_ml4.target.model import Target


def synthetic_acceptance(target: Target, manifests: list[Path], engine_log: LogView | None = None) -> list[str]:
    """Where synthetic acceptance is switched on (empty: the gate may certify): the target, the manifests, and the
    running engine's logged speculative config when its log was read."""
    reasons = [f"target {target.name}: {role}.speculative.synthetic_acceptance is true"
               for role, eng in (("engine", target.engine), ("prefill_engine", target.prefill_engine))
               if eng is not None and eng.speculative is not None and eng.speculative.synthetic_acceptance]
    existing = [p for p in manifests if p.exists()]
    for site in engine_sites(LintContext(documents=load_paths(existing, target))):
        hits = synthetic_hits(site)
        if hits:
            reasons.append(f"{site.doc.path} ({site.where}): {', '.join(hits)}")
    if engine_log is not None:
        reasons += [f"the running engine logged speculative_config={e.spec} ({engine_log.source})"
                    for e in engine_log.all(SpeculativeSetting) if e.synthetic]
    return reasons


def engine_config_unread(engine_log: LogView | None, unreadable: str = "") -> str:
    """Why the running engine's speculative config could not be judged ("" when its log showed it)."""
    if engine_log is None:
        return f"the engine log could not be read ({unreadable or 'no log reader'})"
    if not engine_log.all(SpeculativeSetting):
        return (f"the engine log since its last boot ({engine_log.source}) shows no speculative config line "
                f"(vLLM's 'non-default args' or the engine core's 'Initializing a V1 LLM engine' line)")
    return ""


def refusal(reasons: list[str]) -> str:
    return ("accuracy gate refuses to certify: DSpark synthetic acceptance is on, so the outputs are not the "
            "model's (seeds/002 'never use it for accuracy evaluation'): " + "; ".join(reasons))
