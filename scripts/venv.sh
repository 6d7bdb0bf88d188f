# Sourced by main.sh and test.sh: make .venv (once) and install pocketnn[$1] into it.
# Reinstalls when pyproject.toml is newer than the last install.
PY=${PYTHON:-python3}
VENV=${POCKET_VENV:-.venv}
pocket_venv() {
  local extra=$1 tag=$2
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[$tag] creating $VENV" >&2
    "$PY" -m venv "$VENV"
  fi
  local stamp="$VENV/.pocket-$extra-installed"
  if [ ! -e "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "[$tag] installing pocketnn[$extra] into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q -e ".[$extra]" >&2
    touch "$stamp"
  fi
  export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba_cache}
}
