#!/usr/bin/env bash
# Memory and CPU of several builds at 1,000 req/s, alternated in one
# sitting (issue 12): the shared bench mock and vegeta on core 0, each build
# in turn started unpinned and then pinned to core 1 with all its threads,
# as the shared harness does (SQLite, no Redis, unless DB=postgres), and
# held at RATE for DUR.
# Prints, per build: its CPU over the middle of the run, its mean RSS over
# the same window (sampled each second) split into anonymous memory and the
# binary's (and other files') mapped pages (/proc/PID/status), and the
# latency vegeta saw.
#
#   bench/bench-mem.sh /tmp/moonji-a /tmp/moonji-b /tmp/moonji-a /tmp/moonji-b
#   RATE=500 DUR=20s bench/bench-mem.sh bin/moonji
#   DB=postgres bench/bench-mem.sh bin/moonji   (the ledger in PostgreSQL,
#       rate limits in Redis: $PG and $REDIS, see bench/bench-lib.sh)
#
# A "build" may be a wrapper script, e.g. one that sets GOGC. Needs vegeta
# (VEGETA=path; ../shared/bench/README.md says how to install it).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-$(cd .. && pwd)/shared/bench}
. bench/bench-lib.sh
VEGETA=${VEGETA:-$(command -v vegeta || echo /tmp/bench-bin/vegeta)}
RATE=${RATE:-1000}
DUR=${DUR:-15s}
[ $# -ge 1 ] || { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
dir=$(mktemp -d)
bench_mock "$dir"
server=""
trap 'kill $mock $server 2>/dev/null || true; wait $mock $server 2>/dev/null || true; bench_drop_schemas; rm -rf "$dir"' EXIT
sleep 0.5
# The measuring window: from 3 s into the load to 2 s before its end.
secs=${DUR%s}
[[ $secs =~ ^[0-9]+$ ]] && [ "$secs" -ge 8 ] || { echo "DUR must be whole seconds, at least 8s (got $DUR)" >&2; exit 2; }
window=$((secs - 5))
kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$2/status"; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for bin in "$@"; do
  d=$(mktemp -d -p "$dir")
  bench_pinned "$bin" "$d"
  taskset -c 0 "$VEGETA" attack -targets "$d/targets" -rate "$RATE" -duration "$DUR" >"$d/results.bin" &
  load=$!
  sleep 3
  t0=$(ticks "$pid"); s0=$(date +%s%N)
  # RSS moves by several MB with the phase of the GC cycle: sample it once
  # a second over the window and report the means.
  rss=0 anon=0 file=0 n=0
  for _ in $(seq "$window"); do
    sleep 1
    rss=$((rss + $(kb VmRSS "$pid"))); anon=$((anon + $(kb RssAnon "$pid"))); file=$((file + $(kb RssFile "$pid"))); n=$((n + 1))
  done
  rss=$((rss / n)) anon=$((anon / n)) file=$((file / n))
  t1=$(ticks "$pid"); s1=$(date +%s%N)
  wait $load
  lat=$("$VEGETA" report -type=text "$d/results.bin" | awk '/^Latencies/{print "p50 " $11 " p90 " $12 " p99 " $14}')
  ok=$("$VEGETA" report -type=text "$d/results.bin" | awk '/^Success/{print $3}')
  hz=$(getconf CLK_TCK)
  cpu=$(awk -v t="$((t1 - t0))" -v ns="$((s1 - s0))" -v hz="$hz" 'BEGIN{printf "%.0f", 100 * t / hz / (ns / 1e9)}')
  awk -v b="$(basename "$bin"):" -v c="$cpu" -v r="$rss" -v a="$anon" -v f="$file" -v l="$lat" -v ok="$ok" \
    'BEGIN{printf "%-18s CPU %3s %%  RSS %5.1f MB (anon %5.1f, file %5.1f)  %s  ok %s\n", b, c, r/1024, a/1024, f/1024, l, ok}'
  kill $server; wait $server 2>/dev/null || true; server=""
done
