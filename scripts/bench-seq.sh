#!/usr/bin/env bash
# Sequential added latency of several builds, alternated in one sitting
# (issue 12): the shared bench mock on core 0, each build in turn started
# on core 1 (SQLite, no Redis), and the shared bench client sending 2,000
# requests one at a time, three times, to the mock directly and through the
# gateway. Prints, per build, the added p50 of each run (gateway - direct).
#
#   scripts/bench-seq.sh /tmp/moonji-a /tmp/moonji-b /tmp/moonji-a /tmp/moonji-b
#
# A "build" may be a wrapper script, e.g. one that sets GOMAXPROCS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-$(cd .. && pwd)/shared/bench}
[ $# -ge 1 ] || { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
dir=$(mktemp -d)
(cd "$BENCH/mockup" && go build -o "$dir/mockup" main.go)
(cd "$BENCH/benchcli" && go build -o "$dir/benchcli" main.go)
taskset -c 0 "$dir/mockup" -listen 127.0.0.1:18080 >/dev/null 2>&1 &
mock=$!
srv=""
trap 'kill $mock $srv 2>/dev/null; wait $mock $srv 2>/dev/null; rm -rf "$dir"' EXIT
sleep 0.5
p50() { "$@" | sed -E 's/.*p50=([0-9.]+)ms.*/\1/'; }
for bin in "$@"; do
  d=$(mktemp -d -p "$dir")
  cat >"$d/moonji.yaml" <<YAML
listen: 127.0.0.1:18092
database_url: "sqlite://$d/moonji.db"
rate_limit: {requests_per_minute: 100000000}
backends: [{name: mock, kind: openai, url: http://127.0.0.1:18080/v1, max_concurrency: 4096, max_queue: 4096}]
models: [{name: gpt-4o-mini, backend: mock}]
YAML
  MOONJI_JOURNAL_DIR=$d/journal MOONJI_DEV_ADMIN_PASSWORD=bench taskset -c 1 "$bin" serve --config "$d/moonji.yaml" >"$d/serve.log" 2>&1 &
  srv=$!
  for _ in $(seq 100); do curl -sf http://127.0.0.1:18092/healthz >/dev/null && break; sleep 0.1; done
  key=$("$bin" keys create --config "$d/moonji.yaml" --owner bench@localhost --name bench --rpm 100000000)
  gw=(taskset -c 0 "$dir/benchcli" -url http://127.0.0.1:18092/v1 -model gpt-4o-mini -H "Authorization: Bearer $key")
  direct=(taskset -c 0 "$dir/benchcli" -url http://127.0.0.1:18080/v1 -model gpt-4o-mini)
  "${gw[@]}" -mode seq -n 500 -warmup 0 -out /dev/null >/dev/null # warm-up
  line="$(basename "$bin"):"
  for _ in 1 2 3; do
    d50=$(p50 "${direct[@]}" -mode seq -n 2000 -warmup 50 -out /dev/null)
    g50=$(p50 "${gw[@]}" -mode seq -n 2000 -warmup 50 -out /dev/null)
    line="$line $(awk -v g="$g50" -v d="$d50" 'BEGIN { printf "%+.3fms (direct %.3f)", g - d, d }')"
  done
  echo "$line"
  kill "$srv"; wait "$srv" 2>/dev/null || true; srv=""
done
