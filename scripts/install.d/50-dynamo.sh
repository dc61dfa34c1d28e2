#!/usr/bin/env bash
# Installs the real NVIDIA Dynamo 1.6.1 (frontend + Python worker runtime) into its own venv under
# $ML4_TOOLS/dynamo-<version>/venv, and converts the simulator's Tekken file into the HF tokenizer.json model
# directory the frontend needs ($ML4_TOOLS/dynamo-<version>/model).
# Recipe: shared/reference/real-dynamo.md "Install": `ai-dynamo` depends on `aisimulate`, a placeholder sdist that
# cannot install here, so both Dynamo wheels go in with --no-deps and their run-time deps are listed by hand.
# Why its own venv: Dynamo pins kubernetes<33 and transformers, which clash with the project's venv.
# The embedded worker (harness/pytest_ml4_sim/sim/dynamo_worker.py) imports the project's simulated engine: the checkout is
# put on PYTHONPATH when the worker is launched (no copy of the project lives here, so the worker always runs the
# checkout's code); this venv only adds the engine's own deps (pyyaml, mistral-common, prometheus-client).
# Idempotent: a stamp file marks a finished install, so a second run returns at once. Nothing is fetched at run time.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.bash"
version="${ML4_DYNAMO_VERSION:-1.6.1}"
dest="$tools/dynamo-$version"
venv="$dest/venv"
stamp="$dest/.ml4-installed"
ml4_stamp_ok "$stamp" -x "$venv/bin/python" -f "$dest/model/tokenizer.json" && exit 0
mkdir -p "$dest"
rm -rf "$dest/model"
ml4_venv "$venv"
ml4_pip "$venv" --no-deps "ai-dynamo==$version" "ai-dynamo-runtime==$version"
ml4_pip "$venv" 'pydantic>=2.10.6,<=2.13.5' 'uvloop>=0.21.0' 'aiohttp>=3.14.3,<4' 'certifi>=2026.10.19' \
  'kubernetes>=32.0.1,<33' 'msgspec>=0.19.0' 'prometheus-client>=0.23.1,<1' 'pyzmq>=26' 'redis>=6.2,<9' \
  'tqdm>=4' 'transformers>=4.56.0' 'typing-extensions>=4.10.0' 'zstandard>=0.23,<1' \
  'pyyaml>=6' 'mistral-common>=1.13,<2'
# The HF tokenizer.json model dir, converted offline from the Tekken file the simulator already provisions
# (15-sim-tekken.sh writes it under $ML4_TOOLS/sim).
PYTHONPATH="$here:$here/harness" "$venv/bin/python" -m pytest_ml4_sim.deploy.dynamo_model "$dest/model"
# Check the frontend and the worker runtime import with the offline environment.
HF_HUB_OFFLINE=1 "$venv/bin/python" -c "import dynamo.frontend, dynamo.llm, dynamo.runtime" >/dev/null
touch "$stamp"
