#!/usr/bin/env bash
# Issue 46's soak: three replicas (bin/moonji serve) on one PostgreSQL schema
# and a private redis-server, mixed traffic (chat answers, /v1 streams and
# whole answers, stops, client aborts) while each fault is injected in turn
# (PostgreSQL restarted/down; Redis restarted, down, silent, slow, lossy; the
# engine stalling and resetting mid-stream; the engine link cut), then: one
# row per id a client saw with the outcome it saw, gauges at 0, RSS and
# goroutines flat after warm-up. Exits 1 when an invariant is broken.
#
#   scripts/soak.sh                          # 3 minutes (CI)
#   SOAK_DURATION=30m scripts/soak.sh        # the full run
#   SOAK_OUT=/tmp/soak scripts/soak.sh -faults pg_down,redis_slow -workers 24
#   scripts/soak.sh -front-cmd ./nginx-front.sh -fault-hook ./nginx-idle.sh  # SOAK_REPLICAS: the replicas
#
# It needs redis-server on PATH and a PostgreSQL (MOONJI_TEST_POSTGRES_DSN,
# default postgres://postgres@127.0.0.1:5432/test): it makes a schema of its
# own there and drops it; neither server is ever stopped (fault proxies go
# in front). Reports, logs and each request's record go to SOAK_OUT (default
# a new temporary directory): report.md, report.svg, summary.json,
# requests.jsonl, and each process's log.
set -euo pipefail
cd "$(dirname "$0")/.."
export SOAK_DURATION="${SOAK_DURATION:-3m}"
OUT="${SOAK_OUT:-$(mktemp -d /tmp/moonji-soak.XXXXXX)}"
command -v redis-server >/dev/null || { echo "soak: redis-server is not on PATH" >&2; exit 2; }
echo "== soak: $SOAK_DURATION, reports in $OUT"
go build -o bin/moonji .
go build -o bin/soak ./bench/soak
# The clients go through the README's nginx (deploy/nginx/moonji.conf) with
# a 20 s idle timeout, so a stalled engine's stream lives by its keep-alives;
# SOAK_FRONT=none talks to the replicas directly.
front=()
if [ "${SOAK_FRONT:-nginx}" = nginx ] && { command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; }; then
  export PATH="$PATH:/usr/sbin"
  front=(-front-cmd "$PWD/bench/soak/nginx-front.sh")
fi
exec bin/soak -out "$OUT" ${front[@]+"${front[@]}"} "$@"
