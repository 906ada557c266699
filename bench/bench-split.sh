#!/usr/bin/env bash
# Where a request's time goes inside the gateway (issue 12): the shared
# bench mock and client on core 0, each build in turn
# started on core 1 (GOMAXPROCS 1; SQLite and no Redis unless the build
# says so, as in bench-seq.sh), requests sent one at a time.
# perf traces the build's read and write system calls, and per request
# the time is split at them: from the request's read to the call to the
# engine ("before"), the engine's answer ("engine"), and from reading it
# to the first bytes written back ("after"). Prints, per build, the
# client's p50 without and with the trace (the trace slows every system
# call a little) and the split's medians.
#
#   bench/bench-split.sh bin/moonji /tmp/floorproxy
#   MODE=seq bench/bench-split.sh bin/moonji      (non-streamed answers)
#   CHUNKS=50 N=200 bench/bench-split.sh bin/moonji   (the harness's streams)
#   bench/bench-split.sh bin/moonji bin/moonji,pg,redis   (ledger in PostgreSQL, limits in Redis)
#
# MODE=stream (default) sends streams of CHUNKS chunks (5) DELAY apart
# (5ms) and splits at the first byte; MODE=seq non-streamed requests. A
# "build" may be bench/floorproxy (go build -o /tmp/floorproxy
# ./bench/floorproxy). Needs perf (Debian: linux-perf), as root or with
# kernel.perf_event_paranoid ≤ -1.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-$(cd .. && pwd)/shared/bench}
. bench/bench-lib.sh
[ $# -ge 1 ] || { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
command -v perf >/dev/null || { echo "perf not found (Debian: apt-get install linux-perf)" >&2; exit 2; }
MODE=${MODE:-stream}
N=${N:-300}
case $MODE in stream | seq) ;; *) echo "MODE is stream or seq" >&2; exit 2 ;; esac
dir=$(mktemp -d)
(cd "$BENCH/benchcli" && go build -o "$dir/benchcli" main.go)
bench_mock "$dir" -chunks "${CHUNKS:-5}" -delay "${DELAY:-5ms}"
server=""
trap 'kill $mock $server 2>/dev/null || true; wait $mock $server 2>/dev/null || true; bench_drop_schemas; rm -rf "$dir"' EXIT
sleep 0.5

# split TRACE CLIENT_FD ENGINE_FD prints the medians of one trace.
split() {
  awk -v c="$2" -v e="$3" '
    $0 ~ "read\\(fd: "c"[,<]" && $0 ~ "= [1-9][0-9]*$" { t0 = $1; open = 1; next }
    open && $0 ~ "writev?\\(fd: "e"[,<]" { te = $1 }
    open && $0 ~ "read\\(fd: "e"[,<]" && $0 ~ "= [1-9][0-9]*$" { tr = $1 }
    open && $0 ~ "write\\(fd: "c"[,<]" {
      before[n] = te - t0; engine[n] = tr - te; after[n] = $1 - tr; total[n] = $1 - t0; n++; open = 0
    }
    function median(a,   i, j, t, s) {
      for (i = 0; i < n; i++) s[i] = a[i]
      for (i = 1; i < n; i++) for (j = i; j > 0 && s[j] < s[j-1]; j--) { t = s[j]; s[j] = s[j-1]; s[j-1] = t }
      return s[int(n / 2)]
    }
    END { printf "%d requests, medians: before %.3f, engine %.3f, after %.3f, in all %.3f ms", n, median(before), median(engine), median(after), median(total) }
  ' "$1"
}

for build in "$@"; do
  bin=${build%%,*}
  d=$(mktemp -d -p "$dir")
  bench_build_config "$build" "$d" 18092
  bench_serve "$bin" "$d/moonji.yaml" "$d" 1
  key=$("$bin" keys create --config "$d/moonji.yaml" --owner bench@localhost --name bench --rpm 100000000)
  cli=(taskset -c 0 "$dir/benchcli" -url http://127.0.0.1:18092/v1 -model gpt-4o-mini -H "Authorization: Bearer $key")
  direct=(taskset -c 0 "$dir/benchcli" -url http://127.0.0.1:18080/v1 -model gpt-4o-mini)
  p50() { "$@" | grep -o 'p50=[0-9.]*ms' | head -1 | sed 's/p50=//; s/ms$//'; }
  "${cli[@]}" -mode "$MODE" -n 50 -warmup 0 -out "$d/warm" >/dev/null
  d50=$(p50 "${direct[@]}" -mode "$MODE" -n "$N" -warmup 5 -out "$d/direct")
  g50=$(p50 "${cli[@]}" -mode "$MODE" -n "$N" -warmup 5 -out "$d/plain")
  serving=$(pgrep -n -f "serve --config $d/moonji.yaml")
  perf trace -p "$serving" -e read,write,writev -o "$d/trace" &
  tracer=$!
  sleep 1
  t50=$(p50 "${cli[@]}" -mode "$MODE" -n "$N" -warmup 5 -out "$d/traced")
  kill -INT "$tracer"
  wait "$tracer" 2>/dev/null || true
  # The client's connection is the one its requests are read from; the
  # engine's, the one written to first after a request is read, most
  # often (PostgreSQL's and Redis's connections are written to too).
  cfd=$(grep -m1 -E 'read\(fd: [0-9]+.*count: 4096\) += [1-9]' "$d/trace" | sed -E 's/.*read\(fd: ([0-9]+).*/\1/')
  efd=$(awk -v c="$cfd" '
    $0 ~ "read\\(fd: "c"[,<]" && $0 ~ "= [1-9][0-9]*$" { open = 1; next }
    open && match($0, /writev?\(fd: [0-9]+/) { f = substr($0, RSTART, RLENGTH); sub(/.*: /, "", f); if (f != c) { n[f]++; open = 0 } }
    END { for (f in n) if (n[f] > best) { best = n[f]; e = f } print e }' "$d/trace")
  echo "$(basename "$build"): client p50 direct ${d50} ms, through it ${g50} ms (traced ${t50} ms); $(split "$d/trace" "$cfd" "$efd")"
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=""
done
