"""The model directory the real ``dynamo.vllm`` worker and the real frontend share.

The worker's vLLM reads ``config.json`` and ``tekken.json`` (``--tokenizer-mode mistral``): the tiny model of
:mod:`pytest_ml4_sim.realvllm.model`. The frontend tokenises and renders the chat template with an HF
``tokenizer.json``: the SAME files the simulated Dynamo deployment's frontend reads (``50-dynamo.sh``'s model dir,
converted from the project's v15 Tekken by :mod:`pytest_ml4_sim.deploy.dynamo_model`), so both Dynamo deployments render
the same prompt, accept the same ``reasoning_effort`` values (all seven of Mistral Large 4's template; the
dynamo-vllm venv's mistral-common 1.12 could only convert a template that knows ``none``/``high``) and the
worker's Tekken and the frontend's tokenizer agree token for token, which :func:`check_same_ids` verifies.

Run by ``scripts/install.d/65-dynamo-vllm.sh`` inside the dynamo-vllm venv: ``python -m pytest_ml4_sim.realdynamo.model
DEST FRONTEND_MODEL_DIR``. Never at test time.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from pytest_ml4.evidence.tokenizer import SPECIAL_TOKENS
from pytest_ml4_sim.deploy.dynamo_model import PARSER_TOKENS
from pytest_ml4_sim.realvllm.model import write_model_dir

#: The frontend's files, taken from the simulated Dynamo deployment's model dir.
FRONTEND_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def check_same_ids(model_dir: Path) -> None:
    """SystemExit naming the token when the frontend's ``tokenizer.json`` and the worker's ``tekken.json`` give a
    parser token (``[TOOL_CALLS]``, ``[THINK]``, ...) different ids, or differ in vocabulary size."""
    hf = json.loads((model_dir / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in hf["added_tokens"]}
    for marker in PARSER_TOKENS:
        if added.get(marker) != SPECIAL_TOKENS.index(marker):
            raise SystemExit(f"{model_dir}/tokenizer.json: {marker} has id {added.get(marker)}, the worker's "
                             f"tekken.json {SPECIAL_TOKENS.index(marker)}")
    tekken = json.loads((model_dir / "tekken.json").read_text())
    n_tekken = tekken["config"]["default_vocab_size"]
    n_hf = len(hf["model"]["vocab"]) + len(set(added.values()) - set(hf["model"]["vocab"].values()))
    if n_hf != n_tekken:
        raise SystemExit(f"{model_dir}: tokenizer.json has {n_hf} tokens, tekken.json {n_tekken}")


def write_dynamo_vllm_model(dest: Path, frontend_dir: Path) -> Path:
    """Write config.json + tekken.json and copy the frontend's files from ``frontend_dir`` into ``dest`` (built
    aside, checked, then moved in place)."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_model_dir(tmp)
    for name in FRONTEND_FILES:
        shutil.copy2(frontend_dir / name, tmp / name)
    check_same_ids(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m pytest_ml4_sim.realdynamo.model DEST FRONTEND_MODEL_DIR")
    print(write_dynamo_vllm_model(Path(sys.argv[1]), Path(sys.argv[2])))
