#!/usr/bin/env bash
# Make ./.venv with hframe installed (editable) plus the test extras, once; reuse it after.
# Reinstalls when pyproject.toml or this script changes. Needs python3 (>= 3.10) with venv; PyPI reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
stamp=".venv/.hframe-installed"
# (the C source too: the compiled part is built at install, and rebuilt when it changes)
want="$(cat pyproject.toml scripts/bootstrap.sh hframe_cli/*/*.c | sha256sum | cut -d' ' -f1)"
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    .venv/bin/python -m pip install --quiet --upgrade pip >&2 || true
    # compat: the checkout on sys.path through a .pth line, as a plain install puts the package
    # there; the default editable finder imports pathlib, urllib and more at every interpreter
    # start (site: 16-27 ms against 3 ms, of each command's start-up, which no installed user
    # pays). setuptools calls compat transitional: where it is gone, the default mode.
    .venv/bin/python -m pip install --quiet -e '.[test]' --config-settings editable_mode=compat >&2 2>/dev/null \
        || .venv/bin/python -m pip install --quiet -e '.[test]' >&2
    echo "$want" > "$stamp"
fi
# bytecode for the package itself (an editable install has none): the command starts ~0.15 s
# faster where PYTHONDONTWRITEBYTECODE is set; stale .pyc files are ignored by Python
.venv/bin/python -m compileall -q hframe_cli >/dev/null || true
