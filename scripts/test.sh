#!/usr/bin/env bash
# Run the test suite (creates ./.venv on first use). Extra arguments go to pytest, and then only
# that runs.
#
# Without arguments, the packing tests run a second time with the compiled packing loop off
# (HFRAME_NATIVE=0, hframe_cli/write/compiled.py): the pure-Python path is the reference the
# compiled one is compared with, and what a machine without a C compiler runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
if [[ $# -gt 0 ]]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q
echo "== the packing tests again, in pure Python (HFRAME_NATIVE=0)"
HFRAME_NATIVE=0 exec .venv/bin/python -m pytest -q tests/format tests/write/test_native.py tests/write/test_fanout.py \
    tests/write/test_pack.py tests/write/test_resume.py tests/write/test_concurrency.py
