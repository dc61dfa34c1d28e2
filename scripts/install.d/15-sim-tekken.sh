#!/usr/bin/env bash
# Pre-builds the simulator's derived Tekken tokenizer files (v13 and v15 special tokens on mistral-common's
# tekken_240911.json vocabulary) under $ML4_TOOLS/sim, so the first simulator start is as fast as later ones.
# Idempotent: the files are keyed by mistral-common's version and only written when missing.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
export ML4_TOOLS="${ML4_TOOLS:-$HOME/.cache/pytest-ml4}"
"$here/.venv/bin/python" -m pytest_ml4.evidence.tokenizer >/dev/null
