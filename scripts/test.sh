#!/usr/bin/env bash
# Run the test suite (creates ./.venv on first use). Extra arguments go to pytest, and then only
# that runs.
#
# Without arguments, the listing, packing and verify tests run a second time with the compiled parts off
# (HFRAME_NATIVE=0, hframe_cli/native.py): the pure-Python paths are the reference the
# compiled ones are compared with, and what a machine without a C compiler runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
if [[ $# -gt 0 ]]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q
echo "== the listing, packing and verify tests again, in pure Python (HFRAME_NATIVE=0)"
HFRAME_NATIVE=0 exec .venv/bin/python -m pytest -q tests/format tests/verify tests/sources/test_listing.py tests/sources/test_sources.py tests/sources/test_native_scan.py tests/write/test_native.py tests/write/test_fanout.py \
    tests/write/test_pack.py tests/write/test_resume.py
