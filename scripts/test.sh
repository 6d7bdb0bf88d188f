#!/usr/bin/env bash
# Set up (once) and run every check: ruff, the import contracts, and the test suite.
#   ./scripts/test.sh            # everything
#   ./scripts/test.sh -k conv    # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
pocket_venv dev test
echo "[test] ruff" >&2
"$VENV/bin/ruff" check pocket tests bench examples scripts
echo "[test] import contracts" >&2
"$VENV/bin/lint-imports" --no-cache
echo "[test] pytest" >&2
"$VENV/bin/python" -m pytest -n 2 -q "$@"
