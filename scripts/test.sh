#!/usr/bin/env bash
# Run the test suite (creates ./.venv on first use). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m pytest -q "$@"
