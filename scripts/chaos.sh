#!/usr/bin/env bash
# The chaos run at full size (make test runs a small one): thousands of mixed
# requests against one gateway — aborts at random moments, clients that never
# read, engine errors, hangs and disconnects, stops, 429s, 503s, malformed,
# deeply nested, duplicate-key, oversized and key-less bodies — then exactly
# one row per request with the outcome its client saw, gauges at 0,
# goroutines and memory back near where they started.
#
#   scripts/chaos.sh                 # 10,000 requests on SQLite
#   MOONJI_TEST_POSTGRES_DSN=postgres://postgres@127.0.0.1:5432/test?sslmode=disable scripts/chaos.sh
#   N=20000 WORKERS=48 MOONJI_CHAOS_SEED=42 scripts/chaos.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N="${N:-10000}"
WORKERS="${WORKERS:-24}"
echo "== chaos: $N requests, $WORKERS workers (SQLite; PostgreSQL too when MOONJI_TEST_POSTGRES_DSN is set)"
MOONJI_CHAOS_N="$N" MOONJI_CHAOS_WORKERS="$WORKERS" go test -count=1 -timeout 60m -run '^TestChaos$' -v ./web/ 2>&1 |
  grep -E 'chaos:|outcomes|^ +[0-9]+  |--- |^ok|FAIL|chaos_test'
