#!/usr/bin/env bash
# What one request costs the gateway's process, counted by the kernel:
# CPU time (task-clock), system calls (all, and read, epoll_pwait, futex),
# context switches and page faults per request, from `perf stat` over 5 s
# in the middle of each rate of bench/bench-maxrate.sh (gateway on core 1,
# engine and load on core 0).
#
#   bench/bench-syscalls.sh                         (3,000 and 5,000 req/s, SQLite)
#   RATES="2000" MOONJI_BIN=/tmp/floorproxy bench/bench-syscalls.sh   (the Go floor)
#   DB=postgres bench/bench-syscalls.sh             (PostgreSQL + Redis)
#
# Needs perf (Debian: linux-perf) and what bench-maxrate.sh needs.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "perf not found (Debian: apt-get install linux-perf)" >&2; exit 2; }
RATES=${RATES:-"3000 5000"}
BIN=${MOONJI_BIN:-bin/moonji}
[ -n "${MOONJI_BIN:-}" ] || make -s build
name=$(basename "$BIN")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
events=task-clock,context-switches,page-faults,raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_futex
# bench-maxrate.sh starts the gateway, warms up for 5 s, then runs each rate
# for 10 s; perf counts seconds 2–7 of each.
(
  for _ in $(seq 100); do pgrep -f "$name serve" >/dev/null && break; sleep 0.1; done
  sleep 8.5
  for r in $RATES; do
    sleep 2
    pid=$(pgrep -f "$name serve" | head -1)
    perf stat -x, -e "$events" -p "$pid" -o "$out/$r.txt" -- sleep 5
    sleep 3
  done
) &
counter=$!
MOONJI_BIN=$BIN RATES="$RATES" bench/bench-maxrate.sh
wait $counter
printf '\nper request (5 s of each rate):\n'
for r in $RATES; do
  awk -F, -v r="$r" '!/^#/ && NF > 2 {
      v = $1 / (5 * r); n = $3; sub(/^(raw_)?syscalls:sys_enter_?/, "", n); if (n == "") n = "syscalls"
      if (n == "task-clock") printf "  cpu %.3f ms", v; else printf "  %s %.2f", n, v
    } END { print "" }' "$out/$r.txt" | sed "s/^/$r req\/s:/"
done
