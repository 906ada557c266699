#!/usr/bin/env bash
# Moonji against nginx as a null proxy, in one sitting, with the shared
# harness (../shared/bench/overhead.sh; its README says what it measures).
# Runs, one after the other against the same mock: Moonji with the ledger in
# SQLite (the embedded default), Moonji with the ledger in PostgreSQL and
# Redis rate limits, then nginx. Each prints its table; all land in
# $WORK/results. "floor" (not run by default) adds bench/floorproxy: a Go
# reverse proxy with nothing in it, fasthttp's server and client, on one
# core (GOMAXPROCS 1) — what any Go gateway costs on this machine.
#
#   bench/bench-overhead.sh                 (about 3 x 9 minutes)
#   ROUNDS=1 RATE_DUR=5s bench/bench-overhead.sh   (a quick look)
#   ONLY="sqlite nginx" bench/bench-overhead.sh
#   ONLY="sqlite postgres floor nginx" bench/bench-overhead.sh
#   MOONJI_BIN=/tmp/moonji-before LABEL_PREFIX=before- ONLY=sqlite bench/bench-overhead.sh
#                                  (another build, e.g. an earlier commit's)
#
# Needs vegeta (VEGETA=path; see the harness's README), nginx-light (the
# harness installs it), PostgreSQL and Redis on loopback for the second run.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-$(cd .. && pwd)/shared/bench}
. bench/bench-lib.sh
export WORK=${WORK:-/tmp/peerbench}
export VEGETA=${VEGETA:-$(command -v vegeta || echo /tmp/bench-bin/vegeta)}
ONLY=${ONLY:-"sqlite postgres nginx"}
MOONJI_BIN=${MOONJI_BIN:-bin/moonji}
[ "$MOONJI_BIN" = bin/moonji ] && make -s build
port=18090
dir=$(mktemp -d)
server=""
trap '[ -z "$server" ] || kill $server 2>/dev/null || true; "$BENCH/nginx-baseline.sh" stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

run_moonji() { # label database_url redis_url
  local label=$1 db=$2 redis=$3 d="$dir/$1"
  mkdir -p "$d"
  bench_config "$d/moonji.yaml" "$port" "$db" "$redis"
  bench_serve "$MOONJI_BIN" "$d/moonji.yaml" "$d"
  local key
  key=$("$MOONJI_BIN" keys create --config "$d/moonji.yaml" --owner bench@localhost --name bench --rpm 100000000)
  GW_PID=$server LABEL=${LABEL_PREFIX:-}$label "$BENCH/overhead.sh" "http://127.0.0.1:$port/v1" "Authorization: Bearer $key"
  kill "$server"; wait "$server" 2>/dev/null || true; server=""
}

for what in $ONLY; do
  case $what in
    sqlite) run_moonji moonji-sqlite "sqlite://$dir/sqlite/moonji.db" "" ;;
    postgres)
      schema="bench_$(date +%s)"
      psql "$PG" -qc "CREATE SCHEMA $schema" >/dev/null
      run_moonji moonji-postgres "$PG&search_path=$schema" "$REDIS"
      psql "$PG" -qc "DROP SCHEMA $schema CASCADE" >/dev/null ;;
    floor)
      go build -o "$dir/floorproxy" ./bench/floorproxy
      # Started on its core, so that Go sizes GOMAXPROCS to it.
      taskset -c "${CORE_GW:-1}" "$dir/floorproxy" -listen "127.0.0.1:$port" -upstream 127.0.0.1:18080 &
      server=$!
      sleep 0.5
      GW_PID=$server LABEL=go-floor "$BENCH/overhead.sh" "http://127.0.0.1:$port/v1"
      kill "$server"; wait "$server" 2>/dev/null || true; server="" ;;
    nginx)
      "$BENCH/nginx-baseline.sh" start
      GW_PID=$(pgrep -P "$(cat /tmp/bench-nginx/nginx.pid)") LABEL=nginx "$BENCH/overhead.sh" http://127.0.0.1:8090/v1
      "$BENCH/nginx-baseline.sh" stop ;;
    *) echo "unknown: $what" >&2; exit 2 ;;
  esac
done
