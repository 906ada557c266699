#!/usr/bin/env bash
# The envelope attack of issue 42 against `moonji engine` (its builtin demo
# model, no token, on loopback): each scenario starts a fresh engine, reads
# its VmRSS, sends the envelopes from CONNS connections at once, each one
# envelope of SIZE bytes (a chat.request for a session that does not
# exist: no request runs), and reads VmRSS again (connections still open)
# and VmHWM, the peak.
#
#   bench/bench-engine-envelopes.sh /tmp/moonji-before /tmp/moonji-after
#
# Scenarios: 4 × 33 MiB and 1 × 40 MiB before any session (a stranger),
# then the same inside a session (session.open of the model first: a
# gateway), the bound that remains once a connection has a session.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
dir=$(mktemp -d)
engine=""
trap 'kill $engine 2>/dev/null || true; wait $engine 2>/dev/null || true; rm -rf "$dir"' EXIT
go build -o "$dir/envattack" ./internal/engine/testdata/envattack
cat >"$dir/engine.yaml" <<'EOF'
backends: [{name: demo, kind: builtin}]
models: [{name: m, backend: demo}]
EOF

# scenario BINARY CONNS SIZE SESSION_MODEL
scenario() {
	: >"$dir/engine.log"
	MOONJI_ENGINE_TOKEN= "$1" engine --listen 127.0.0.1:0 --config "$dir/engine.yaml" 2>"$dir/engine.log" &
	engine=$!
	local url=""
	for _ in $(seq 100); do
		url=$(sed -n 's/.*moonji engine is listening" url=\(ws:[^ ]*\).*/\1/p' "$dir/engine.log")
		[ -n "$url" ] && break
		sleep 0.1
	done
	[ -n "$url" ] || { cat "$dir/engine.log" >&2; exit 1; }
	sleep 1 # let start-up settle before the first reading
	local where="before any session"
	[ -z "$4" ] || where="inside a session of $4"
	echo "== $1: $2 × $3 bytes, $where"
	"$dir/envattack" -url "$url" -pid "$engine" -conns "$2" -size "$3" ${4:+-session "$4"}
	kill "$engine"
	wait "$engine" 2>/dev/null || true
	engine=""
}

for bin in "$@"; do
	scenario "$bin" 4 $((33 << 20)) ""
	scenario "$bin" 1 $((40 << 20)) ""
	scenario "$bin" 4 $((33 << 20)) m
	scenario "$bin" 1 $((40 << 20)) m
done
