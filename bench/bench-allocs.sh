#!/usr/bin/env bash
# Heap allocations `moonji serve` makes per request and per relayed chunk
# (issue 12): go_memstats_mallocs_total from /metrics before and after N
# requests sent one at a time with curl (SQLite, no Redis, not pinned). The
# shared bench mock answers with streams of 1 chunk, then of CHUNKS chunks,
# no delay; the difference per extra chunk is what relaying a chunk
# allocates. Then non-streamed requests with wrk, and an allocation profile
# of those (PROFILE=FILE, read with go tool pprof -sample_index=alloc_objects
# -base FILE.base bin/moonji FILE).
#
#   bench/bench-allocs.sh
#   N=200 CHUNKS=2000 PROFILE=/tmp/allocs.pprof bench/bench-allocs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-$(cd .. && pwd)/shared/bench}
. bench/bench-lib.sh
BIN=${MOONJI_BIN:-bin/moonji}
[ -n "${MOONJI_BIN:-}" ] || make -s build
command -v wrk >/dev/null || { echo "wrk not found (Debian: apt-get install wrk)" >&2; exit 2; }
N=${N:-100}
CHUNKS=${CHUNKS:-1000}
dir=$(mktemp -d)
(cd "$BENCH/mockup" && go build -o "$dir/mockup" main.go)
port=18094
mock="" server=""
trap 'kill $server $mock 2>/dev/null || true; wait $server $mock 2>/dev/null || true; rm -rf "$dir"' EXIT

mallocs() { curl -s "http://127.0.0.1:$port/metrics" | awk '/^go_memstats_mallocs_total/{print $2}'; }

# start CHUNKS: the mock streaming CHUNKS chunks, and a fresh gateway.
start() {
  kill $server $mock 2>/dev/null || true
  wait $server $mock 2>/dev/null || true
  "$dir/mockup" -listen 127.0.0.1:18080 -chunks "$1" -delay 0 >/dev/null 2>&1 &
  mock=$!
  rm -rf "$dir/run" && mkdir -p "$dir/run"
  bench_config "$dir/run/moonji.yaml" $port "sqlite://$dir/run/moonji.db"
  key=$("$BIN" keys create --config "$dir/run/moonji.yaml" --owner bench@localhost --name bench --rpm 100000000)
  MOONJI_PPROF=${PROFILE:+127.0.0.1:16061} MOONJI_JOURNAL_DIR=$dir/run/journal MOONJI_DEV_ADMIN_PASSWORD=bench \
    "$BIN" serve --config "$dir/run/moonji.yaml" >"$dir/run/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
}

# per_stream: mallocs per streamed request, N sent one at a time after 20
# to warm up; the cost of one /metrics read is taken off.
per_stream() {
  local body='{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}' a a2 b
  send() { curl -s -o /dev/null -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$port/v1/chat/completions"; }
  for _ in $(seq 20); do send; done
  sleep 0.5
  a=$(mallocs); a2=$(mallocs)
  for _ in $(seq "$N"); do send; done
  sleep 0.5
  b=$(mallocs)
  python3 -c "print(($b - $a - ($a2 - $a)) / $N)"
}

start 1
one=$(per_stream)
start "$CHUNKS"
many=$(per_stream)
echo "streams: $one mallocs a request with 1 chunk, $many with $CHUNKS chunks"
python3 -c "print('per extra chunk: %.3f mallocs' % (($many - $one) / ($CHUNKS - 1)))"

start 1
printf 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\nwrk.headers["Authorization"] = "Bearer %s"\n' \
  "'{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'" "$key" >"$dir/post.lua"
url=http://127.0.0.1:$port/v1/chat/completions
wrk -t1 -c1 -d2s -s "$dir/post.lua" "$url" >/dev/null # warm-up
sleep 0.3
[ -z "${PROFILE:-}" ] || curl -s -o "$PROFILE.base" http://127.0.0.1:16061/debug/pprof/allocs
a=$(mallocs); a2=$(mallocs)
n=$(wrk -t1 -c4 -d5s -s "$dir/post.lua" "$url" | awk '/requests in/{print $1}')
sleep 0.3
b=$(mallocs)
[ -z "${PROFILE:-}" ] || curl -s -o "$PROFILE" http://127.0.0.1:16061/debug/pprof/allocs
python3 -c "print('non-streamed: %.1f mallocs a request (%d requests)' % (($b - $a - ($a2 - $a)) / $n, $n))"
