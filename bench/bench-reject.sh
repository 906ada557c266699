#!/usr/bin/env bash
# Latency of refused requests at ~2,000 req/s, measured from outside the
# process: `moonji serve` (the real binary) and wrk (C, separate process)
# on the same machine. Each wrk connection sends one request every 9 ms, so
# 20 connections make ~2,100 req/s; wrk reports the latency distribution.
#
#   bench/bench-reject.sh            (installs Debian's wrk when missing)
#   MOONJI_BIN=/tmp/moonji-old bench/bench-reject.sh   (another build, e.g. an earlier commit's)
#   MOONJI_DATABASE_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable&search_path=bench' \
#     bench/bench-reject.sh          (the ledger in PostgreSQL; the schema must exist)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo; $sudo apt-get install -y -qq wrk >/dev/null; }
[ -n "${MOONJI_BIN:-}" ] || make -s build
dir=$(mktemp -d)
port=18199
cat > "$dir/moonji.yaml" <<YAML
listen: 127.0.0.1:$port
database_url: sqlite://$dir/moonji.db
rate_limit: {requests_per_minute: 100000000}
backends:
  - {name: demo, kind: builtin, max_concurrency: 1, max_queue: 0}
models:
  - {name: moonji-demo, backend: demo}
YAML
MOONJI_DEV_ADMIN_PASSWORD=bench ${MOONJI_BIN:-bin/moonji} serve --config "$dir/moonji.yaml" >"$dir/serve.log" 2>&1 &
server=$!
holder=""
trap 'kill $server ${holder:-} 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
key=$(${MOONJI_BIN:-bin/moonji} keys create --config "$dir/moonji.yaml" --owner bench@localhost --name bench)
slow=$(${MOONJI_BIN:-bin/moonji} keys create --config "$dir/moonji.yaml" --owner slow@localhost --name slow --rpm 1)
url="http://127.0.0.1:$port"
# The backend's one slot is held by a request that never ends: every other
# request is refused at once with 503 queue_full.
curl -s -m 600 "$url/v1/chat/completions" -H "Authorization: Bearer $key" \
  -d '{"model":"moonji-demo","messages":[{"role":"user","content":"x"}],"mock":{"hang":true}}' >/dev/null &
holder=$!
curl -s "$url/v1/chat/completions" -H "Authorization: Bearer $slow" -d '{"model":"nope","messages":[]}' >/dev/null # uses up rpm 1
sleep 0.5

run() { # name key body path
  cat >"$dir/s.lua" <<LUA
wrk.method = "$([ -n "$3" ] && echo POST || echo GET)"
wrk.body = '$3'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $2"
function delay() return 9 end
LUA
  printf '%-22s ' "$1"
  wrk -t2 -c20 -d10s --latency -s "$dir/s.lua" "$url$4" | awk '/ 50%/{p50=$2} / 99%/{p99=$2} /Requests\/sec/{r=$2} /Non-2xx/{n=$5} END{printf "%s req/s  p50 %s  p99 %s\n", r, p50, p99}'
}
body='{"model":"moonji-demo","messages":[{"role":"user","content":"Hello there"}]}'
run "503 queue_full" "$key" "$body" /v1/chat/completions
run "429 rate_limited" "$slow" "$body" /v1/chat/completions
run "404 unknown model" "$key" '{"model":"nope","messages":[]}' /v1/chat/completions
run "floor: GET /v1/models" "$key" "" /v1/models
run "floor: GET /healthz" "" "" /healthz
