#!/usr/bin/env bash
# The nightly job: the project's own tests including the heavy proofs CI leaves out (`-m nightly` tests and the
# kill matrix's `load`, `restart` and `real` profiles: every profile), after the same install as CI. Usage: scripts/nightly.sh [extra pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export ML4_KILL_MATRIX_PROFILES="${ML4_KILL_MATRIX_PROFILES:-all}"
exec .venv/bin/python -m pytest tests -n 2 --dist loadfile -q -p no:cacheprovider "$@"
