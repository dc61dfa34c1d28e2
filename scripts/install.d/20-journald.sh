#!/usr/bin/env bash
# Installs the journald tools the log readers and their tests use: `journalctl` (package systemd) and
# `systemd-journal-remote` (package systemd-journal-remote), which turns Journal Export Format into a real
# journal file that the journald reader's tests read back with `journalctl --file`.
# Debian packages via apt-get; systemd-journal-remote is pinned to the installed systemd's version because it
# depends on libsystemd-shared of exactly that version (an unpinned install would upgrade systemd itself).
# Links both binaries into $ML4_TOOLS/journald-<systemd version>/bin (pytest_ml4.logs.journald finds them there).
# Idempotent: a second run only re-checks that the binaries exist.
set -euo pipefail
tools="${ML4_TOOLS:-$HOME/.cache/pytest-ml4}"
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
find_remote() {
  for p in /lib/systemd/systemd-journal-remote /usr/lib/systemd/systemd-journal-remote; do
    [ -x "$p" ] && { echo "$p"; return 0; }
  done
  return 1
}
if ! command -v journalctl >/dev/null 2>&1; then
  as_root apt-get update -q >/dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends systemd >/dev/null
fi
version="$(dpkg-query -W -f='${Version}' systemd)"
dest="$tools/journald-$version/bin"
if [ -x "$dest/journalctl" ] && [ -x "$dest/systemd-journal-remote" ]; then
  exit 0
fi
if ! find_remote >/dev/null; then
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "systemd-journal-remote=$version" >/dev/null 2>&1 || {
    as_root apt-get update -q >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "systemd-journal-remote=$version" >/dev/null
  }
fi
mkdir -p "$dest"
ln -sf "$(command -v journalctl)" "$dest/journalctl"
ln -sf "$(find_remote)" "$dest/systemd-journal-remote"
"$dest/systemd-journal-remote" --help >/dev/null
"$dest/journalctl" --version >/dev/null
