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
  if [ -z "${NUMBA_CACHE_DIR:-}" ]; then
    export NUMBA_CACHE_DIR=$PWD/.numba_cache
    pocket_numba_cache "$tag"
  fi
}

# Numba keys a cached function on its own source file only: an edit of a module whose
# functions or LLVM intrinsics other modules compile in (kernels_fma's activations inside
# kernels_fma_dw's rows, an inlined helper) leaves those modules' cached machine code stale,
# and tests and benchmarks then run the old code (session s33 timed an old SiLU that way).
# So this checkout's own cache (.numba_cache, not a NUMBA_CACHE_DIR you set) is emptied
# whenever the package's sources differ from those that filled it.
pocket_numba_cache() {
  local dir=$NUMBA_CACHE_DIR mark=$NUMBA_CACHE_DIR/.pocket-sources digest
  digest=$(find pocket -name '*.py' -print0 | LC_ALL=C sort -z | xargs -0 sha1sum | sha1sum | cut -c1-40)
  if [ -d "$dir" ] && [ "$(cat "$mark" 2>/dev/null)" != "$digest" ]; then
    echo "[$1] pocket's sources changed: emptying $dir (Numba recompiles on first use)" >&2
    rm -rf "$dir"
  fi
  mkdir -p "$dir"
  echo "$digest" > "$mark"
}
