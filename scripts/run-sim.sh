#!/usr/bin/env bash
# The main job against the embedded simulator: install, then run every suite for a target end to end
# (smoke, tools, reasoning, osl, kv, restart, perf with the short CI profile, preflight, and accuracy on the seeded
# 200-per-category BFCL sample the stored simulator baselines were recorded on: a baseline is compared only under
# the same conditions, so a smaller sample would leave the gate not judged and the run unsigned, exit 6; a nightly
# run drops --accuracy-size for the whole set), writing the run's
# artifacts and Allure results under reports/<stamp>-<target>-<hex>/.
# This is the README's first Quickstart command. Usage: scripts/run-sim.sh [TARGET] [extra pytest args...]
# (the restart suite owns the simulator process, so the run is not split across xdist workers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
target="${1:-rtxpro6000-tp8}"
shift || true
exec .venv/bin/python -m pytest suites --target "$target" --sim --perf-short --accuracy-size 200 "$@"
