#!/usr/bin/env bash
# Installs what the Allure report needs, idempotently:
#   * the Allure 2 CLI (npm allure-commandline, pinned) under $ML4_TOOLS/allure-<version>/ — report generation
#     then runs fully offline (tooling.md §1.1, §1.3);
#   * Java (Debian default-jre-headless) when no `java` is on PATH — the Allure 2 CLI is a JVM program;
#   * Debian `chromium` when missing — tests/test_allure_html.py renders the report headless (tooling.md §4).
# pytest_ml4/runtime/installed.py finds these again from the same $ML4_TOOLS layout.
set -euo pipefail
ALLURE_VERSION="${ML4_ALLURE_VERSION:-2.46.1}"
ML4_TOOLS="${ML4_TOOLS:-$HOME/.cache/pytest-ml4}"
dest="$ML4_TOOLS/allure-$ALLURE_VERSION"
bin="$dest/node_modules/.bin/allure"

apt_install() {
  # apt-get update only once per script run, and only when something is actually missing.
  if [ -z "${_ml4_apt_updated:-}" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    _ml4_apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if [ ! -x "$bin" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    as_root bash -c "$(declare -f apt_install); apt_install nodejs npm"
  fi
  mkdir -p "$dest"
  # --prefix keeps the package out of any global node_modules; no install scripts run for this package.
  npm install --prefix "$dest" --no-audit --no-fund --loglevel=error "allure-commandline@$ALLURE_VERSION" >/dev/null
fi

if ! command -v java >/dev/null 2>&1; then
  as_root bash -c "$(declare -f apt_install); apt_install default-jre-headless"
fi

if ! command -v chromium >/dev/null 2>&1; then
  as_root bash -c "$(declare -f apt_install); apt_install chromium"
fi

"$bin" --version >/dev/null
echo "allure $ALLURE_VERSION: $bin" >&2
