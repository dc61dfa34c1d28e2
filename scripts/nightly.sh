#!/usr/bin/env bash
# The nightly job: the project's own tests including the heavy proofs CI leaves out (`-m nightly`), after the same
# install as CI. Usage: scripts/nightly.sh [extra pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m pytest tests -n 2 --dist loadfile -q -p no:cacheprovider "$@"
