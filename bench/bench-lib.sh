# Shared by the bench scripts (sourced, not run).

# The PostgreSQL server and Redis the runs with DB=postgres use.
PG=${PG:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
REDIS=${REDIS:-redis://127.0.0.1:6379/0}

# bench_config FILE PORT DATABASE_URL [REDIS_URL] writes the configuration
# the bench scripts serve: one openai backend, the shared bench mock on
# 127.0.0.1:18080, and limits that never interfere.
bench_config() {
  cat >"$1" <<YAML
listen: 127.0.0.1:$2
database_url: "$3"
redis_url: "${4:-}"
redis_prefix: "bench$(date +%s):"
rate_limit: {requests_per_minute: 100000000}
backends: [{name: mock, kind: openai, url: http://127.0.0.1:18080/v1, max_concurrency: 4096, max_queue: 4096}]
models: [{name: gpt-4o-mini, backend: mock}]
YAML
}

# bench_build_config BUILD DIR PORT writes DIR/moonji.yaml for a build as
# the bench scripts name it: a binary, followed by ",pg" to keep its ledger
# in a new schema of $PG (bench_drop_schemas drops them) and by ",redis" to
# keep its rate limits and leases in $REDIS (e.g. bin/moonji,pg,redis).
bench_build_config() {
  local db="sqlite://$2/moonji.db" redis="" schema
  case ,${1#*,}, in *,pg,*)
    schema="bench_$(date +%s%N)"
    psql "$PG" -qc "CREATE SCHEMA $schema" >/dev/null
    bench_schemas+=("$schema")
    db="$PG&search_path=$schema" ;;
  esac
  case ,${1#*,}, in *,redis,*) redis=$REDIS ;; esac
  bench_config "$2/moonji.yaml" "$3" "$db" "$redis"
}

# bench_serve BIN CONFIG DIR [CPU] starts BIN serving CONFIG (its journal
# and log in DIR; on CPU alone when given), sets server to its pid and waits
# until it answers on the configured port.
bench_serve() {
  local pin=()
  [ -n "${4:-}" ] && pin=(taskset -c "$4")
  MOONJI_JOURNAL_DIR=$3/journal MOONJI_DEV_ADMIN_PASSWORD=bench "${pin[@]}" "$1" serve --config "$2" >"$3/serve.log" 2>&1 &
  server=$!
  local port
  port=$(awk -F: '/^listen:/{print $3}' "$2")
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
}

# bench_mock DIR [FLAGS...] builds the shared bench mock into DIR and starts
# it on 127.0.0.1:18080, on core 0, with FLAGS (e.g. -chunks 5); sets mock
# to its pid.
bench_mock() {
  local d=$1
  shift
  (cd "$BENCH/mockup" && go build -o "$d/mockup" main.go)
  taskset -c 0 "$d/mockup" -listen 127.0.0.1:18080 "$@" >/dev/null 2>&1 &
  mock=$!
}

# bench_nginx_engine DIR starts nginx on 127.0.0.1:18080, on core 0, as an
# engine answering every request with the bench mock's chat completion (the
# same bytes, usage included) and nothing else: an engine that costs the
# shared core far less a request than the Go mock, for the rates one core
# of the gateway is asked to sustain. Sets mock to its pid.
bench_nginx_engine() {
  local d=$1/nginx-engine
  mkdir -p "$d"
  cat >"$d/nginx.conf" <<NG
daemon off;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $d/body; proxy_temp_path $d/proxy;
  fastcgi_temp_path $d/fcgi; uwsgi_temp_path $d/uwsgi; scgi_temp_path $d/scgi;
  keepalive_requests 100000000; keepalive_timeout 300s;
  server {
    listen 127.0.0.1:18080;
    location / {
      default_type application/json;
      return 200 '{"id":"chatcmpl-mock1","object":"chat.completion","created":1796373502,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the mock upstream."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16},"system_fingerprint":"fp_mock"}';
    }
  }
}
NG
  taskset -c 0 nginx -c "$d/nginx.conf" &
  mock=$!
  for _ in $(seq 50); do curl -s -o /dev/null -X POST http://127.0.0.1:18080/v1/chat/completions && break; sleep 0.1; done
}

# bench_pinned BIN DIR starts BIN serving the bench configuration from DIR
# (port 18093), pins the serving process with all its threads to core 1,
# and writes DIR/targets, one chat completion for vegeta with a new key.
# Sets server (the started process) and pid (the serving one: the build
# itself, or the one its wrapper started). The ledger is in SQLite, or with
# DB=postgres in a new schema of $PG (bench_drop_schemas drops them) with
# rate limits in $REDIS.
bench_pinned() {
  local bin=$1 d=$2 key db="sqlite://$2/moonji.db" redis="" schema
  if [ "${DB:-sqlite}" = postgres ]; then
    schema="bench_$(date +%s%N)"
    psql "$PG" -qc "CREATE SCHEMA $schema" >/dev/null
    bench_schemas+=("$schema")
    db="$PG&search_path=$schema" redis=$REDIS
  fi
  bench_config "$d/moonji.yaml" 18093 "$db" "$redis"
  bench_serve "$bin" "$d/moonji.yaml" "$d"
  pid=$(pgrep -n -f "serve --config $d/moonji.yaml")
  taskset -a -p -c 1 "$pid" >/dev/null
  key=$("$bin" keys create --config "$d/moonji.yaml" --owner bench@localhost --name bench --rpm 100000000)
  printf '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}' >"$d/body.json"
  printf 'POST http://127.0.0.1:18093/v1/chat/completions\nAuthorization: Bearer %s\nContent-Type: application/json\n@%s\n' "$key" "$d/body.json" >"$d/targets"
}

# bench_drop_schemas drops the PostgreSQL schemas bench_pinned created (for
# a script's EXIT trap).
bench_schemas=()
bench_drop_schemas() {
  local s
  for s in "${bench_schemas[@]}"; do
    psql "$PG" -qc "SET client_min_messages = warning; DROP SCHEMA $s CASCADE" >/dev/null || true
  done
}
