#!/usr/bin/env bash
# `make test-engine`: the SDK e2e suite (e2e/engine-real/, openai-node and the
# Vercel AI SDK) through Moonji against a real inference engine, Ollama
# v0.17.4 serving the real tiny model stories260K.
#
# - Ollama is built from the Go module proxy by the shared build script
#   (../shared/realengine/build-ollama.sh), once per machine: it is cached
#   under $MOONJI_REALENGINE_OUT (default /tmp/realengine) and later runs
#   reuse it. The first build takes several minutes (measured: ~10 on 2 cores).
# - The shared tree (build script, model) is ../shared from the repository
#   root, or $MOONJI_SHARED (a clone elsewhere, e.g. CI's, sets
#   MOONJI_SHARED=/work/shared).
# - This script starts `ollama serve` on a free loopback port, creates the
#   model `tiny` from the shared GGUF, writes the gateway's configuration
#   (e2e/engine-real/moonji.yaml with the Ollama URL filled in) and runs
#   Playwright with playwright.engine.config.ts, which starts `bin/moonji
#   serve` (built by `make build`). Ollama is stopped on exit, whatever
#   happens. Extra arguments go to Playwright (e.g. -g 'embeddings').
# - Then web/real_engine_faults_test.go cuts that Ollama's connection
#   mid-answer through a fault proxy.
# - Playwright's output (what a failed test leaves) goes to
#   test-results/engine-real/, apart from `make test`'s, so that neither run
#   erases the other's (Playwright empties its output directory at start).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

die() { echo "test-engine: $*" >&2; exit 1; }

# The shared tree: $MOONJI_SHARED, else ../shared beside the repository,
# else /work/shared (where this workplace's machines keep it, for a clone
# made elsewhere, such as CI's); a relative path is taken from the
# repository root.
shared=${MOONJI_SHARED:-../shared}
case $shared in /*) ;; *) shared=$root/$shared ;; esac
if [ -z "${MOONJI_SHARED:-}" ] && [ ! -f "$shared/realengine/build-ollama.sh" ] && [ -f /work/shared/realengine/build-ollama.sh ]; then
  shared=/work/shared
fi
build_script=$shared/realengine/build-ollama.sh
gguf=$shared/models/stories260K.gguf
if [ ! -f "$build_script" ] || [ ! -f "$gguf" ]; then
  die "no shared real-engine tree at $shared (want realengine/build-ollama.sh and models/stories260K.gguf).
Set MOONJI_SHARED to the directory that holds them (e.g. MOONJI_SHARED=/work/shared)."
fi
shared=$(cd "$shared" && pwd)
gguf=$shared/models/stories260K.gguf

[ -x bin/moonji ] || die "bin/moonji is missing: run \`make build\` (or \`make test-engine\`)"
command -v curl >/dev/null || die "curl is needed to wait for Ollama"

# 1. Ollama, built once per machine. The lock keeps two runs on one machine
#    from building into the same directory at once.
out=${MOONJI_REALENGINE_OUT:-/tmp/realengine}
mkdir -p "$out"
ollama=$out/bin/ollama
if [ ! -x "$ollama" ]; then
  echo "test-engine: building Ollama v0.17.4 into $out (once per machine: several minutes, ~10 on 2 cores)..." >&2
  start=$SECONDS
fi
(
  flock 9
  OUT=$out bash "$build_script" >/dev/null
) 9>"$out/.build.lock"
[ -x "$ollama" ] || die "the build did not produce $ollama"
[ -z "${start:-}" ] || echo "test-engine: Ollama built in $((SECONDS - start)) s" >&2

# This run's files: the gateway's database and configuration, Ollama's log.
# Under e2e/.tmp/ (ignored by git, removed by `make clean`).
run=$root/e2e/.tmp/engine-real
rm -rf "$run"
mkdir -p "$run" "$out/models" "$out/home"

# freeport prints a loopback TCP port nobody listens on right now.
freeport() {
  node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# 2. `ollama serve` on a free port, with its models and HOME under $out (the
#    README of the shared tree). HOME is set for Ollama's processes only, not
#    for npm and Playwright. setsid makes it the leader of its own process
#    group, so that the trap stops its model runners with it.
#
#    OLLAMA_NUM_PARALLEL: Ollama 0.17.4 leaks a request slot now and then
#    when a client disconnects mid-stream (in v0.17.4's server/routes.go the
#    handlers send each chunk on an unbuffered channel that streamResponse
#    stops reading when the client is gone, so the sending goroutine can
#    block with the slot held). Measured here without
#    Moonji: about one disconnect in 30-70. With the default single slot,
#    every later request then hangs until its client gives up. The abort and
#    Stop tests disconnect on purpose (that is Moonji cancelling the engine's
#    work), so Ollama gets spare slots; the gateway still sends each backend
#    one request at a time (max_concurrency 1 in e2e/engine-real/moonji.yaml).
ollama_port=$(freeport)
ollama_env=(env OLLAMA_HOST="127.0.0.1:$ollama_port" OLLAMA_MODELS="$out/models" HOME="$out/home"
  OLLAMA_NUM_PARALLEL="${OLLAMA_NUM_PARALLEL:-8}")
"${ollama_env[@]}" setsid "$ollama" serve >"$run/ollama.log" 2>&1 &
ollama_pid=$!

stop_ollama() {
  local rc=$?
  if kill -0 "$ollama_pid" 2>/dev/null; then
    kill -TERM -- "-$ollama_pid" 2>/dev/null || kill -TERM "$ollama_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$ollama_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$ollama_pid" 2>/dev/null || true
  fi
  wait "$ollama_pid" 2>/dev/null || true
  if [ "$rc" -ne 0 ]; then
    echo "test-engine: failed (exit $rc); the last lines of Ollama's log ($run/ollama.log):" >&2
    tail -n 20 "$run/ollama.log" >&2 || true
  fi
  exit "$rc"
}
trap stop_ollama EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Wait until it answers (it starts in well under a second; 30 s at most).
for i in $(seq 300); do
  curl -sf "http://127.0.0.1:$ollama_port/api/version" >/dev/null 2>&1 && break
  kill -0 "$ollama_pid" 2>/dev/null || die "ollama serve exited at start"
  [ "$i" -lt 300 ] || die "ollama serve did not answer on 127.0.0.1:$ollama_port within 30 s"
  sleep 0.1
done

# 3. The model `tiny`, from the shared GGUF (idempotent: the same blob and
#    Modelfile give the same model).
printf 'FROM %s\n' "$gguf" >"$run/Modelfile"
"${ollama_env[@]}" "$ollama" create tiny -f "$run/Modelfile" >"$run/ollama-create.log" 2>&1 ||
  { cat "$run/ollama-create.log" >&2; die "ollama create tiny failed"; }

# 4. The gateway's configuration, pointing at this Ollama, and the suite.
sed "s#__OLLAMA_URL__#http://127.0.0.1:$ollama_port/v1#g" e2e/engine-real/moonji.yaml >"$run/moonji.yaml"
export MOONJI_ENGINE_E2E_PORT=${MOONJI_ENGINE_E2E_PORT:-$(freeport)}
echo "test-engine: Ollama on 127.0.0.1:$ollama_port, Moonji on 127.0.0.1:$MOONJI_ENGINE_E2E_PORT" >&2
npx playwright test --config playwright.engine.config.ts "$@"

# 5. A fault against the real engine: its connection cut mid-answer, through
#    a fault proxy (web/real_engine_faults_test.go; skipped by `make test`,
#    which has no engine).
MOONJI_TEST_OLLAMA_URL="http://127.0.0.1:$ollama_port/v1" go test -count=1 -run '^TestRealEngine' ./web/
