#!/usr/bin/env bash
# Set up (once) and run every check: ruff, the import contracts, and the test suite.
#   ./scripts/test.sh            # everything
#   ./scripts/test.sh -k conv    # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${POCKET_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[test] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.pocket-dev-installed"
if [ ! -e "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[test] installing pocketnn[dev] into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q -e ".[dev]" >&2
  touch "$stamp"
fi
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba_cache}
echo "[test] ruff" >&2
"$VENV/bin/ruff" check pocket tests bench examples scripts
echo "[test] import contracts" >&2
"$VENV/bin/lint-imports" --no-cache
echo "[test] pytest" >&2
"$VENV/bin/python" -m pytest -n 2 -q "$@"
