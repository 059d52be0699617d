#!/usr/bin/env bash
# clients/typescript/test.sh — the whole check of @idem/client: install (npm ci), lint
# (tsc --strict --noEmit), build, unit tests, the scenarios against real idemd and provider-sim
# from $IDEM_BIN (default ../../build/ci, relative to this folder), then npm pack and a smoke test
# of the tarball installed into a fresh project. Exits non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
bin="${IDEM_BIN:-../../build/ci}"
case "$bin" in /*) ;; *) bin="$here/$bin" ;; esac
export IDEM_BIN="$bin"

step() { printf '\n== %s\n' "$*"; }

missing=0
for b in server/idemd tools/provider-sim; do
  if [[ ! -x "$IDEM_BIN/$b" ]]; then echo "FAIL: $IDEM_BIN/$b is missing (set IDEM_BIN)" >&2; missing=1; fi
done
[[ $missing == 0 ]] || exit 1

smoke=""
cleanup() { [[ -n "$smoke" ]] && rm -rf "$smoke"; return 0; }
trap cleanup EXIT

step "install (npm ci)"
npm ci --no-audit --no-fund

step "lint (tsc --strict --noEmit)"
npx tsc -p tsconfig.test.json --strict --noEmit

step "build"
rm -rf dist build
npx tsc -p tsconfig.json
npx tsc -p tsconfig.test.json

step "unit tests"
node --test --test-reporter=spec build/test/unit/*.test.js

step "integration scenarios (IDEM_BIN=$IDEM_BIN)"
node --test --test-reporter=spec build/test/integration/*.itest.js

step "pack and smoke test"
rm -f idem-client-*.tgz
tarball="$(npm pack --silent | tail -n 1)"
echo "tarball: $tarball"
contents="$(tar tzf "$tarball" | sort)"
echo "$contents"
if echo "$contents" | grep -Ev '^package/(dist/[a-z0-9]+\.(js|d\.ts)|README\.md|LICENSE|package\.json)$'; then
  echo "FAIL: the tarball holds more than dist, README, LICENSE and package.json" >&2
  exit 1
fi
for f in package/README.md package/LICENSE package/dist/index.js package/dist/index.d.ts; do
  echo "$contents" | grep -qx "$f" || { echo "FAIL: $f is not in the tarball" >&2; exit 1; }
done
smoke="$(mktemp -d)"
cp "$tarball" "$smoke/"
(
  cd "$smoke"
  cat > package.json <<'JSON'
{ "name": "idem-client-smoke", "version": "0.0.0", "private": true, "type": "module" }
JSON
  npm install --no-audit --no-fund --silent "./$tarball"
  [[ ! -d node_modules/typescript ]] || { echo "FAIL: a runtime dependency came along" >&2; exit 1; }
  cat > smoke.mjs <<'JS'
import { IdemClient, RetryBudget, KeyReused, ProblemError, uuidv7, UUIDV7, PROBLEM_TYPES } from "@idem/client";
const c = new IdemClient({ baseUrl: "http://127.0.0.1:9", apiKey: "k", budget: new RetryBudget({ capacity: 0 }) });
if (!UUIDV7.test(c.newKey()) || !UUIDV7.test(uuidv7())) throw new Error("keys");
if (PROBLEM_TYPES["idempotency-key-reused"] !== KeyReused || !(KeyReused.prototype instanceof ProblemError)) throw new Error("errors");
try { await c.createPayment({ merchant_order_no: "O", amount: "1.00", currency: "CNY" }); throw new Error("no error"); }
catch (e) { if (e.name !== "TransportError" || e.stoppedBy !== "budget" || e.attempts !== 1) throw e; }
console.log("smoke: imported @idem/client and made a call");
JS
  node smoke.mjs
  cat > smoke.ts <<'TS'
import { IdemClient, type IdemResponse, type Payment } from "@idem/client";
const c = new IdemClient({ baseUrl: "http://127.0.0.1:9", apiKey: "k" });
export const p: Promise<IdemResponse<Payment>> = c.createPayment({ merchant_order_no: "O", amount: "1.00", currency: "CNY" });
TS
  "$here/node_modules/.bin/tsc" --strict --noEmit --module nodenext --moduleResolution nodenext \
    --target es2022 --lib es2022,dom --types node --typeRoots "$here/node_modules/@types" smoke.ts
  echo "smoke: the type declarations check under tsc --strict"
)
echo
echo "PASS: @idem/client ($tarball)"
