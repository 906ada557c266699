#!/usr/bin/env bash
# The soak's front (-front-cmd): the README's nginx configuration
# (deploy/nginx/moonji.conf) in front of the replicas (SOAK_REPLICAS), with
# a proxy_read_timeout of SOAK_PROXY_TIMEOUT (20s: a little above the
# replicas' 15 s keep-alives, far below the engine faults' silences), so
# that every stream whose engine stalls lives only by its keep-alives.
# Prints the base URL, then runs nginx until it gets SIGTERM.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
dir="${SOAK_DIR:?}/nginx"
mkdir -p "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
servers=""
for r in $SOAK_REPLICAS; do servers="$servers    server $r;\n"; done
site=$(sed -e "s|    server 127.0.0.1:8080;.*|$servers|" \
           -e "s|listen 80;|listen 127.0.0.1:$port;|" \
           -e "s|proxy_read_timeout 120s;|proxy_read_timeout ${SOAK_PROXY_TIMEOUT:-20s};|" \
           "$here/deploy/nginx/moonji.conf")
cat > "$dir/nginx.conf" <<NG
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/body; proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fcgi; uwsgi_temp_path $dir/uwsgi; scgi_temp_path $dir/scgi;
$(printf '%b' "$site")
}
NG
nginx -t -p "$dir" -c "$dir/nginx.conf" >&2
echo "http://127.0.0.1:$port"
# In the foreground of this script, which the soak stops with SIGTERM: the
# trap passes it on (nginx's master then stops its worker too), so that
# nothing holds the soak's pipe once it is done.
nginx -p "$dir" -c "$dir/nginx.conf" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid"; exit 0' TERM INT
wait "$pid"
