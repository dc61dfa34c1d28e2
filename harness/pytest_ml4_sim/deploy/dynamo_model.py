"""The model directory the real Dynamo frontend reads: an HF ``tokenizer.json`` converted from the simulator's Tekken.

The frontend tokenises prompts and detokenises the workers' token ids itself, so it needs a HF tokenizer; a raw
Mistral directory (``tekken.json``) gives a model card with ``"tokenizer": null`` and the frontend never serves it
(shared/reference/real-dynamo.md "Run time"). ``transformers``' ``convert_tekken_tokenizer`` converts the derived
v15 Tekken file of :mod:`pytest_ml4.evidence.tokenizer` offline, with the same ids as mistral-common's, so the worker
(which decodes with mistral-common) and the frontend agree token for token; the control tokens ``[THINK]``,
``[/THINK]``, ``[TOOL_CALLS]``, ``[ARGS]``, ``[CALL_ID]`` stay in the text the frontend's parsers see.

Run by ``scripts/install.d/50-dynamo.sh`` inside the Dynamo venv (it needs ``transformers``):
``python -m pytest_ml4_sim.deploy.dynamo_model DEST``. Never at test time.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

#: Tokens the frontend's mistral parsers look for; the conversion must keep each as one special token.
PARSER_TOKENS = ("[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
#: The Tekken version the conversion starts from (v15: Mistral Large 4's, with ``[MODEL_SETTINGS]``).
TEKKEN_VERSION = 15
#: The minimal HF config the model card needs (architecture family only: no weights are ever loaded).
MODEL_CONFIG = {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "max_position_embeddings": 1048576,
                "bos_token_id": 1, "eos_token_id": 2}


def convert(dest: Path) -> Path:
    """Write ``tokenizer.json`` (+ tokenizer_config and chat template) into ``dest``; returns ``dest``."""
    from transformers.integrations.mistral import convert_tekken_tokenizer

    from pytest_ml4.evidence.tokenizer import SPECIAL_TOKENS, tekken_path

    tok = convert_tekken_tokenizer(str(tekken_path(TEKKEN_VERSION)))
    for marker in PARSER_TOKENS:
        ids = tok.convert_tokens_to_ids([marker])
        if ids != [SPECIAL_TOKENS.index(marker)]:
            raise SystemExit(f"dynamo_model: {marker} converted to ids {ids}, want [{SPECIAL_TOKENS.index(marker)}]")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok.save_pretrained(str(tmp))
    # register_llm reads a config.json; the worker publishes the real context length in its runtime config.
    (tmp / "config.json").write_text(json.dumps(MODEL_CONFIG | {"vocab_size": len(tok)}, indent=1))
    tmp.rename(dest)
    return dest


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pytest_ml4_sim.deploy.dynamo_model DEST", file=sys.stderr)
        return 2
    print(convert(Path(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
