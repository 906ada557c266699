#!/usr/bin/env bash
# The highest rate of non-streamed requests one core sustains at p99 <= 5 ms
# (issue 12): `moonji serve` pinned to core 1; the engine and the load
# generator on core 0; open loop for 10 s at each rate in RATES.
#
#   bench/bench-maxrate.sh                          (the ledger in SQLite)
#   DB=postgres bench/bench-maxrate.sh              (PostgreSQL + Redis rate limits)
#   RATES="1000 3000 5000" bench/bench-maxrate.sh
#   PROFILE=/tmp/prof RATES=1000 bench/bench-maxrate.sh  (a 9 s CPU profile
#       and a heap profile per rate, cpu-RATE.pprof / heap-RATE.pprof)
#   DIRECT=1 bench/bench-maxrate.sh                 (the engine alone: what
#       the harness can offer at each rate)
#   SLOWLOG=/tmp/slow bench/bench-maxrate.sh        (the requests over 2 ms,
#       when each was due and its latency, in /tmp/slow-RATE.txt)
#
# The engine is nginx answering the bench mock's chat completion
# (bench_nginx_engine) and the load comes from bench/openloop, whose
# latencies count from when each request was due: vegeta and the Go mock
# cost core 0 too much a request to offer 5,000 req/s.
# ENGINE=mock LOADGEN=vegeta is the earlier harness. Needs nginx
# (Debian: nginx-light) for the default engine. GOGC and GOMAXPROCS, when
# set, go to the gateway.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-$(cd .. && pwd)/shared/bench}
. bench/bench-lib.sh
VEGETA=${VEGETA:-$(command -v vegeta || echo /tmp/bench-bin/vegeta)}
RATES=${RATES:-"1000 2000 3000 4000 5000 6000"}
BIN=${MOONJI_BIN:-bin/moonji}   # MOONJI_BIN: another build, e.g. the commit before a change
[ -n "${MOONJI_BIN:-}" ] || make -s build
ENGINE=${ENGINE:-nginx}
LOADGEN=${LOADGEN:-openloop}
if [ "$ENGINE" = nginx ] && ! command -v nginx >/dev/null; then
  echo "nginx not found (Debian: apt-get install nginx-light), or ENGINE=mock" >&2
  exit 2
fi
dir=$(mktemp -d)
if [ "$LOADGEN" = openloop ]; then
  go build -o "$dir/openloop" ./bench/openloop
fi
port=18091
db="sqlite://$dir/moonji.db" redis="" schema=""
if [ "${DB:-sqlite}" = postgres ]; then
  schema="maxrate_$(date +%s)"; psql "$PG" -qc "CREATE SCHEMA $schema" >/dev/null
  db="$PG&search_path=$schema" redis=$REDIS
fi
bench_config "$dir/moonji.yaml" "$port" "$db" "$redis"
if [ "$ENGINE" = nginx ]; then
  bench_nginx_engine "$dir"
else
  (cd "$BENCH/mockup" && go build -o "$dir/mockup" main.go)
  taskset -c 0 "$dir/mockup" -listen 127.0.0.1:18080 >"$dir/mock.log" 2>&1 &
  mock=$!
fi
env ${GOGC:+GOGC=$GOGC} ${GOMAXPROCS:+GOMAXPROCS=$GOMAXPROCS} ${PROFILE:+MOONJI_PPROF=127.0.0.1:16060} MOONJI_JOURNAL_DIR=$dir/journal MOONJI_DEV_ADMIN_PASSWORD=bench taskset -c 1 "$BIN" serve --config "$dir/moonji.yaml" >"$dir/serve.log" 2>&1 &
server=$!
# Wait for both to exit: an overloaded gateway drains its backlog while it
# shuts down, and the next run's gateway would share its core meanwhile.
trap 'kill $server $mock 2>/dev/null || true; wait $server $mock 2>/dev/null || true; [ -z "$schema" ] || psql "$PG" -qc "SET client_min_messages = warning; DROP SCHEMA $schema CASCADE" >/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
key=$("$BIN" keys create --config "$dir/moonji.yaml" --owner bench@localhost --name bench --rpm 100000000)
echo '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello"}]}' >"$dir/body.json"
url=http://127.0.0.1:$port/v1/chat/completions
[ -z "${DIRECT:-}" ] || url=http://127.0.0.1:18080/v1/chat/completions
printf 'POST %s\nAuthorization: Bearer %s\nContent-Type: application/json\n@%s\n' "$url" "$key" "$dir/body.json" >"$dir/targets"

# attack RATE SECONDS prints "p50 p90 p99 max ok%" (milliseconds).
attack() {
  if [ "$LOADGEN" = openloop ]; then
    taskset -c 0 "$dir/openloop" -url "$url" -body "$dir/body.json" -H "Authorization: Bearer $key" -rate "$1" -duration "$2s" ${SLOWLOG:+-slowlog "$SLOWLOG-$1.txt"} |
      awk '{ printf "%s %s %s %s %.2f\n", $8, $10, $12, $14, $6 * 100 / $4 }'
  else
    taskset -c 0 "$VEGETA" attack -rate "$1" -duration "$2s" -targets "$dir/targets" | "$VEGETA" report -type=json |
      python3 -c "import json,sys; d=json.load(sys.stdin); l=d['latencies']; print('%.3f %.3f %.3f %.3f %.2f' % tuple([l[k]/1e6 for k in ('50th','90th','99th','max')] + [d['success']*100]))"
  fi
}
attack 1000 5 >/dev/null # warm-up
hz=$(getconf CLK_TCK)
printf '%-6s %-9s %-9s %-9s %-9s %-8s %-6s\n' rate p50 p90 p99 max success cpu
for r in $RATES; do
  t0=$(awk '{print $14+$15}' /proc/$server/stat)
  if [ -n "${PROFILE:-}" ]; then
    mkdir -p "$PROFILE"
    (sleep 0.5; curl -s -o "$PROFILE/cpu-$r.pprof" "http://127.0.0.1:16060/debug/pprof/profile?seconds=9"
     curl -s -o "$PROFILE/heap-$r.pprof" "http://127.0.0.1:16060/debug/pprof/heap") &
    profiler=$!
  fi
  read -r p50 p90 p99 max ok < <(attack "$r" 10)
  t1=$(awk '{print $14+$15}' /proc/$server/stat)
  [ -z "${PROFILE:-}" ] || wait $profiler
  printf '%-6s %-9s %-9s %-9s %-9s %-8s %d%%\n' "$r" "${p50}ms" "${p90}ms" "${p99}ms" "${max}ms" "$ok%" $(((t1 - t0) * 100 / (10 * hz)))
done
