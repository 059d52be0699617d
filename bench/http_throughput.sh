#!/usr/bin/env bash
# Replays and first executions over HTTP with wrk (-t2 -c64 -d10s) against idemd on the store
# given as $1 (default: a SQLite file in a temporary directory), with the Redis replay cache when
# $2 is a redis:// URL. Run it under scripts/with-services to measure PostgreSQL and Redis:
#
#   bench/http_throughput.sh
#   scripts/with-services bash -c 'bench/http_throughput.sh "$IDEM_TEST_PG_URL" &&
#                                  bench/http_throughput.sh "$IDEM_TEST_PG_URL" "$IDEM_TEST_REDIS_URL"'
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${IDEM_BIN:-$root/build/release}
work=$(mktemp -d /tmp/idem-bench-XXXXXX)
store=${1:-sqlite://$work/idem.db}
redis=${2:-}
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait || true; rm -rf "$work"; }
trap cleanup EXIT

"$bin/tools/provider-sim" --listen 127.0.0.1:0 > "$work/provider.out" 2>/dev/null &
pids+=($!)
for _ in $(seq 1 50); do grep -q listening "$work/provider.out" && break; sleep 0.1; done
provider=$(grep -o 'http://[0-9.:]*' "$work/provider.out")
sed -e "s|^url = \"sqlite://data/idem.db\".*|url = \"$store\"|" \
    -e "s|^file = \"data/dev-secrets.toml\"|file = \"$work/secrets.toml\"|" \
    -e "s|^\\[idempotency\\]|[idempotency]\\nmax_new_keys_per_second = 0|" \
    "$root/config/idemd.dev.toml" > "$work/idemd.toml"
if [ -n "$redis" ]; then printf '\n[redis]\nurl = "%s"\n' "$redis" >> "$work/idemd.toml"; fi
"$bin/server/idemd" --config "$work/idemd.toml" --listen 127.0.0.1:0 --provider "$provider" \
  > "$work/idemd.out" 2> "$work/idemd.log" &
pids+=($!)
for _ in $(seq 1 100); do grep -q listening "$work/idemd.out" && break; sleep 0.1; done
url=$(grep -o 'http://[0-9.:]*' "$work/idemd.out")
echo "store: ${store%%\?*}${redis:+ + $redis}"
echo "replays:";          wrk -t2 -c64 -d10s -s "$root/bench/wrk/replay.lua" "$url" | grep -E "Requests/sec|Latency"
echo "first executions:"; wrk -t2 -c64 -d10s -s "$root/bench/wrk/first_execution.lua" "$url" | grep -E "Requests/sec|Latency"
