# Sourced (not run) by the install steps: the stamp/venv preamble they share. Named *.bash so that install.sh's
# loop over scripts/install.d/*.sh never runs it as a step.
# Stamp names and paths are the ones the steps always used ($dest/.ml4-installed): a change would reinstall
# every machine's tools.

#: Where the external tools live (install.sh exports it; a step run by hand gets the default).
tools="${ML4_TOOLS:-$HOME/.cache/pytest-ml4}"

# ml4_stamp_ok STAMP [TEST PATH]...: true when the STAMP file exists and each `test TEST PATH` holds
# (e.g. `-x "$venv/bin/python"`): a finished install whose files are still there, so the step can stop.
ml4_stamp_ok() {
  local stamp="$1"
  shift
  [ -f "$stamp" ] || return 1
  while [ $# -ge 2 ]; do
    test "$1" "$2" || return 1
    shift 2
  done
}

# ml4_venv DIR [PYTHON]: a fresh venv at DIR (what was there is removed) with a current pip.
ml4_venv() {
  local dir="$1" py="${2:-${PYTHON:-python3}}"
  rm -rf "$dir"
  "$py" -m venv "$dir"
  ml4_pip "$dir" -U pip >/dev/null
}

# ml4_pip VENV ARGS...: quiet `pip install ARGS` with VENV's interpreter.
ml4_pip() {
  local venv="$1"
  shift
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@"
}
