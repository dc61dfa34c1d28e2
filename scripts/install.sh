#!/usr/bin/env bash
# Installs everything pytest-ml4 and its own tests need, idempotently:
#   * .venv in the checkout with the package and the embedded deployment (harness/), both editable, and their
#     Python dependencies;
#   * the external tools (each step in scripts/install.d/, e.g. aiperf in its own venv, the tiktoken cache,
#     the LiteLLM proxy, the Allure CLI and Java, journald tools, Chromium) under $ML4_TOOLS
#     (default ~/.cache/pytest-ml4), keyed by version so a second run is quick.
# Usage: scripts/install.sh [--core-only]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
export ML4_TOOLS="${ML4_TOOLS:-$HOME/.cache/pytest-ml4}"
mkdir -p "$ML4_TOOLS"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=".venv/.ml4-installed-$(cat pyproject.toml harness/pyproject.toml | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -U pip >/dev/null
  # The suite (editable) and, as its own distribution, the embedded deployment (harness/: --sim) with it.
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]" -e harness
  rm -f .venv/.ml4-installed-*
  touch "$stamp"
fi
[ "${1:-}" = "--core-only" ] && exit 0
for step in scripts/install.d/*.sh; do
  [ -e "$step" ] || continue
  echo "ml4 install: $(basename "$step")" >&2
  bash "$step"
done
