"""The accuracy gate refuses to certify a deployment that runs DSpark's synthetic acceptance.

Seed 002 ('Speculative decoding'): the synthetic-acceptance alternative is "for performance benchmarking only;
never use it for accuracy evaluation". Detection is the preflight rule ``spec-synthetic-acceptance``'s
(:func:`pytest_ml4.preflight.rules.engine.synthetic_hits`), applied here to every engine launch in the manifests,
performance-annotated ones included, plus the target's own engine flags.
"""

from __future__ import annotations

from pathlib import Path

from pytest_ml4.preflight.loader import load_paths
from pytest_ml4.preflight.model import LintContext
from pytest_ml4.preflight.rules.common import engine_sites
from pytest_ml4.preflight.rules.engine import synthetic_hits
from pytest_ml4.targets import Target


def synthetic_acceptance(target: Target, manifests: list[Path]) -> list[str]:
    """Where synthetic acceptance is switched on (empty: the gate may certify)."""
    reasons = [f"target {target.name}: {role}.speculative.synthetic_acceptance is true"
               for role, eng in (("engine", target.engine), ("prefill_engine", target.prefill_engine))
               if eng is not None and eng.speculative is not None and eng.speculative.synthetic_acceptance]
    existing = [p for p in manifests if p.exists()]
    for site in engine_sites(LintContext(documents=load_paths(existing, target))):
        hits = synthetic_hits(site)
        if hits:
            reasons.append(f"{site.doc.path} ({site.where}): {', '.join(hits)}")
    return reasons


def refusal(reasons: list[str]) -> str:
    return ("accuracy gate refuses to certify: DSpark synthetic acceptance is on, so the outputs are not the "
            "model's (seeds/002 'never use it for accuracy evaluation'): " + "; ".join(reasons))
