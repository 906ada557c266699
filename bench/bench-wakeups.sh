#!/usr/bin/env bash
# How long the gateway's threads wait for the CPU after being woken, at
# 1,000 req/s on one core (issue 12): the shared bench
# mock and vegeta on core 0, each build in turn pinned to core 1 with all
# its threads (as bench/bench-mem.sh), perf recording the scheduler's
# wake-up and switch events for 5 s in the middle of the load. Prints, per
# build, the latency vegeta saw and bench/wakeups' report: the delay from
# each wake-up of one of the build's threads to the switch that ran it, and
# the threads that held the CPU through the long ones.
#
#   bench/bench-wakeups.sh bin/moonji
#   bench/bench-wakeups.sh /tmp/moonji-a /tmp/moonji-b /tmp/moonji-a /tmp/moonji-b
#   DB=postgres bench/bench-wakeups.sh bin/moonji   (PostgreSQL + Redis)
#
# Needs perf (Debian: linux-perf) with access to the sched tracepoints (root,
# or kernel.perf_event_paranoid ≤ -1), and vegeta (VEGETA=path).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-$(cd .. && pwd)/shared/bench}
. bench/bench-lib.sh
VEGETA=${VEGETA:-$(command -v vegeta || echo /tmp/bench-bin/vegeta)}
RATE=${RATE:-1000}
[ $# -ge 1 ] || { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
command -v perf >/dev/null || { echo "perf not found (Debian: apt-get install linux-perf)" >&2; exit 2; }
dir=$(mktemp -d)
go build -o "$dir/wakeups" ./bench/wakeups
bench_mock "$dir"
server=""
trap 'kill $mock $server 2>/dev/null || true; wait $mock $server 2>/dev/null || true; bench_drop_schemas; rm -rf "$dir"' EXIT
sleep 0.5
for bin in "$@"; do
  d=$(mktemp -d -p "$dir")
  bench_pinned "$bin" "$d"
  taskset -c 0 "$VEGETA" attack -targets "$d/targets" -rate "$RATE" -duration 15s >"$d/results.bin" &
  load=$!
  sleep 4
  for t in /proc/"$pid"/task/*; do
    echo "${t##*/} $(awk '{print $41, $19}' "$t/stat" 2>/dev/null)"
  done >"$d/policies"
  perf record -q -e sched:sched_switch -e sched:sched_waking -a -o "$d/perf.data" -- sleep 5 >/dev/null 2>&1
  wait $load
  comm=$(head -c 15 "/proc/$pid/comm")
  echo "== $(basename "$bin"): $("$VEGETA" report -type=text "$d/results.bin" | awk '/^Latencies/{print "p50 " $11 " p90 " $12 " p99 " $14}')"
  perf script -i "$d/perf.data" 2>/dev/null | "$dir/wakeups" -comm "$comm" -policies "$d/policies"
  kill $server; wait $server 2>/dev/null || true; server=""
done
