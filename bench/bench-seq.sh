#!/usr/bin/env bash
# Sequential added latency of several builds, alternated in one sitting
# (issue 12): the shared bench mock on core 0, each build in turn started
# on core 1 (SQLite and no Redis unless told below), and the shared bench
# client sending 2,000 requests one at a time, three times, to the mock
# directly and through the gateway. Prints, per build, the added p50 of
# each run (gateway - direct).
# MODE=stream measures a stream's first byte instead: 300 streams of 5
# chunks 5 ms apart (CHUNKS=50 and N=200 for the harness's streams).
#
#   bench/bench-seq.sh /tmp/moonji-a /tmp/moonji-b /tmp/moonji-a /tmp/moonji-b
#   MODE=stream bench/bench-seq.sh /tmp/moonji-a /tmp/floorproxy
#
# A "build" may be a wrapper script, e.g. one that sets GOMAXPROCS=1,
# bench/floorproxy (go build -o /tmp/floorproxy ./bench/floorproxy):
# a proxy with nothing in it, the floor for a Go gateway, or "nginx": the
# harness's nginx-baseline.sh, the null proxy of issue 12's targets:
#
#   bench/bench-seq.sh nginx /tmp/floorproxy bin/moonji nginx /tmp/floorproxy bin/moonji
#
# A build followed by ",pg" keeps its ledger in a new schema of $PG, by
# ",redis" its rate limits in $REDIS (bench-lib.sh), so that one sitting
# can tell what each costs:
#
#   MODE=stream bench/bench-seq.sh bin/moonji bin/moonji,redis bin/moonji,pg bin/moonji,pg,redis
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-$(cd .. && pwd)/shared/bench}
. bench/bench-lib.sh
[ $# -ge 1 ] || { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
dir=$(mktemp -d)
(cd "$BENCH/benchcli" && go build -o "$dir/benchcli" main.go)
MODE=${MODE:-seq}
case $MODE in
  seq) bench_mock "$dir"; n=${N:-2000}; warm=50; stat=p50 ;;
  stream) bench_mock "$dir" -chunks "${CHUNKS:-5}"; n=${N:-300}; warm=5; stat="ttfb p50" ;;
  *) echo "MODE is seq or stream" >&2; exit 2 ;;
esac
server=""
trap 'kill $mock $server 2>/dev/null || true; wait $mock $server 2>/dev/null || true; "$BENCH/nginx-baseline.sh" stop >/dev/null 2>&1 || true; bench_drop_schemas; rm -rf "$dir"' EXIT
sleep 0.5
p50() { "$@" | sed -E "s/.*$stat=([0-9.]+)ms.*/\\1/"; }
# rounds LABEL DIR warms the path through the gateway (the gw array), then
# three times measures the engine directly (direct) and through the
# gateway, and prints LABEL with each round's added p50.
rounds() {
  "${gw[@]}" -mode "$MODE" -n 50 -warmup 0 -out "$2/warm" >/dev/null
  local line="$1:" d50 g50
  for _ in 1 2 3; do
    d50=$(p50 "${direct[@]}" -mode "$MODE" -n "$n" -warmup $warm -out "$2/direct")
    g50=$(p50 "${gw[@]}" -mode "$MODE" -n "$n" -warmup $warm -out "$2/gateway")
    line="$line $(awk -v g="$g50" -v d="$d50" 'BEGIN { printf "%+.3fms (direct %.3f)", g - d, d }')"
  done
  echo "$line"
}
direct=(taskset -c 0 "$dir/benchcli" -url http://127.0.0.1:18080/v1 -model gpt-4o-mini)
for build in "$@"; do
  bin=${build%%,*}
  if [ "$build" = nginx ]; then
    "$BENCH/nginx-baseline.sh" start >/dev/null
    gw=(taskset -c 0 "$dir/benchcli" -url http://127.0.0.1:8090/v1 -model gpt-4o-mini)
    rounds nginx "$dir"
    "$BENCH/nginx-baseline.sh" stop >/dev/null 2>&1
    sleep 0.3
    continue
  fi
  d=$(mktemp -d -p "$dir")
  bench_build_config "$build" "$d" 18092
  bench_serve "$bin" "$d/moonji.yaml" "$d" 1
  key=$("$bin" keys create --config "$d/moonji.yaml" --owner bench@localhost --name bench --rpm 100000000)
  gw=(taskset -c 0 "$dir/benchcli" -url http://127.0.0.1:18092/v1 -model gpt-4o-mini -H "Authorization: Bearer $key")
  rounds "$(basename "$build")" "$d"
  kill "$server"; wait "$server" 2>/dev/null || true; server=""
done
