#!/usr/bin/env bash
# clients/python/test.sh — lint, unit tests, integration scenarios against a real idemd and
# provider-sim, and a wheel built, installed into a fresh venv and smoke-tested.
#
#   IDEM_BIN=/path/to/build/ci clients/python/test.sh     (default IDEM_BIN: ../../build/ci)
#
# Exits non-zero on any failure; missing binaries are a failure, not a skip.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY=/usr/bin/python3
export IDEM_BIN="$(cd "$HERE" && realpath -m "${IDEM_BIN:-../../build/ci}")"
export PYTHONDONTWRITEBYTECODE=1

WORK="$(mktemp -d -t idem-py-test.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

step() { printf '\n== %s\n' "$*"; }

step "binaries in $IDEM_BIN"
missing=0
for b in server/idemd tools/provider-sim; do
  if [[ -x "$IDEM_BIN/$b" ]]; then echo "ok      $b"; else echo "MISSING $IDEM_BIN/$b"; missing=1; fi
done
if (( missing )); then echo "FAIL: build idemd and provider-sim or set IDEM_BIN"; exit 1; fi

cd "$HERE"
step "lint: pyflakes"
$PY -m pyflakes src tests examples
step "lint: mypy --strict"
MYPYPATH=src $PY -m mypy --strict --cache-dir "$WORK/mypy" src tests examples

step "unit tests (no network beyond a loopback http.server)"
PYTHONPATH=src $PY -m unittest -v tests.test_unit tests.test_local

step "integration scenarios (real idemd + provider-sim)"
PYTHONPATH=src $PY -m unittest -v tests.test_integration

step "wheel: build, install into a fresh venv, smoke"
cp -r pyproject.toml README.md src "$WORK/"
mkdir -p "$WORK/dist"
(cd "$WORK" && $PY -m build --wheel --no-isolation --outdir "$WORK/dist" . > "$WORK/build.log" 2>&1) \
  || { cat "$WORK/build.log"; exit 1; }
WHEEL="$(ls "$WORK"/dist/*.whl)"
echo "built $(basename "$WHEEL")"
$PY -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --no-index --quiet "$WHEEL"
(cd "$WORK" && "$WORK/venv/bin/python" "$HERE/tests/smoke_wheel.py")

step "all passed"
