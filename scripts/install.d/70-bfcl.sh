#!/usr/bin/env bash
# Installs the Berkeley Function Calling Leaderboard's data and AST checker (bfcl-eval 2026.3.23) for the
# accuracy suite, into its own folder $ML4_TOOLS/bfcl-eval-<version>/site (a pip --target dir; the suite's loader
# pytest_ml4/accuracy/bfcl.py appends it to sys.path).
# Why --no-deps: a full install resolves ~150 packages (torch, CUDA, vendor SDKs; >3 GB) that only the
# memory/web-search categories need (shared/reference/bfcl.md "Package"). The single-turn data and the checker
# need two small pure-Python libraries, installed beside it with --no-deps too (utils.py imports filelock,
# model_handler/utils.py imports tenacity); the vendor-SDK module bfcl_eval.constants.model_config is replaced by
# the loader's stub. Idempotent: a stamp file marks a finished install. Nothing is fetched at run time.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.bash"
version="${ML4_BFCL_VERSION:-2026.3.23}"
dest="$tools/bfcl-eval-$version"
stamp="$dest/.ml4-installed"
ml4_stamp_ok "$stamp" -d "$dest/site/bfcl_eval/data" && exit 0
py="${PYTHON:-python3}"
mkdir -p "$tools"
rm -rf "$dest"
tmp="$dest.tmp.$$"
rm -rf "$tmp"
"$py" -m pip install -q --disable-pip-version-check --no-deps --no-compile --target "$tmp/site" \
  "bfcl-eval==$version" "filelock==4.3.1" "tenacity==9.2.1"
# The data files the suite reads must be there (JSON Lines, one per category).
test -s "$tmp/site/bfcl_eval/data/BFCL_v4_simple_python.json"
test -s "$tmp/site/bfcl_eval/data/possible_answer/BFCL_v4_simple_python.json"
mv "$tmp" "$dest"
touch "$stamp"
