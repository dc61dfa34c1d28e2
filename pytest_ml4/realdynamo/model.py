"""The model directory the real ``dynamo.vllm`` worker and the real frontend share.

The worker's vLLM reads ``tekken.json`` (``--tokenizer-mode mistral``) and ``config.json``; the frontend tokenises
with an HF ``tokenizer.json``. Both are derived from the SAME Tekken file (the tiny model of
:mod:`pytest_ml4.realvllm.model`), so worker and frontend agree token for token and the control tokens keep their
ids (``[TOOL_CALLS]`` 9, ``[THINK]``/``[/THINK]``/``[ARGS]``/``[CALL_ID]`` 32-35).

Run by ``scripts/install.d/65-dynamo-vllm.sh`` inside the dynamo-vllm venv: ``python -m pytest_ml4.realdynamo.model
DEST``. Never at test time.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pytest_ml4.realvllm.model import write_model_dir
from pytest_ml4.sim.dynamo_model import save_hf_tokenizer


def write_dynamo_vllm_model(dest: Path) -> Path:
    """Write config.json + tekken.json + tokenizer.json into ``dest`` (built aside, then moved in place)."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_model_dir(tmp)
    save_hf_tokenizer(tmp / "tekken.json", tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


if __name__ == "__main__":
    print(write_dynamo_vllm_model(Path(sys.argv[1])))
