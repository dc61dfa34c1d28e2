#!/usr/bin/env bash
# The nightly loop on the embedded simulator, for every target: run the functional suites, generate and render the
# report, compare with the previous night and the baseline. Shows what a real nightly produces without a cluster.
# Usage: examples/nightly-sim.sh [REPORTS_DIR]   (default reports-sim/)
set -uo pipefail
cd "$(dirname "$0")/.."
reports="${1:-reports-sim}"
py=.venv/bin/python
status=0
for target in $("$py" -c 'from pytest_ml4.target.model import known_targets; print(" ".join(known_targets()))'); do
  "$py" -m pytest suites/ --target "$target" --sim -m "smoke or tools or reasoning" -q --ml4-reports="$reports" \
    || status=1
  run_dir="$(.venv/bin/ml4-report latest --runs "$reports" --target "$target")"
  .venv/bin/ml4-report generate "$run_dir" --render || status=1
  .venv/bin/ml4-report compare --runs "$reports" --target "$target" || status=1
done
.venv/bin/ml4-report scan "$reports" || status=1
exit "$status"
