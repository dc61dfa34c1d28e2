#!/usr/bin/env bash
# Installs the LiteLLM proxy (litellm[proxy]) into its own venv under $ML4_TOOLS/litellm-<version>.
# Why its own venv: it is ~750 MB and pins openai/fastapi versions that must not leak into the project's venv.
# Version: 1.108.7, the release the tooling reference (shared/reference/tooling.md section 3) observed.
# Idempotent: a stamp file marks a finished install, so a second run returns at once.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.bash"
version="${ML4_LITELLM_VERSION:-1.108.7}"
dest="$tools/litellm-$version"
stamp="$dest/.ml4-installed"
ml4_stamp_ok "$stamp" -x "$dest/bin/litellm" && exit 0
mkdir -p "$tools"
ml4_venv "$dest"
ml4_pip "$dest" "litellm[proxy]==$version"
# Check the console script starts with the offline environment (no network is tried with these set).
LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY_DISABLED=true LITELLM_DONT_SHOW_FEEDBACK_BOX=true \
  "$dest/bin/python" -c "import litellm.proxy.proxy_server" >/dev/null
touch "$stamp"
