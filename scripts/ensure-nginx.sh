#!/usr/bin/env bash
# Installs Debian's nginx (nginx-light) when it is missing: the tests put a
# real nginx with a short idle timeout in front of the gateway
# (web/proxy_idle_test.go). On a Mac, `brew install nginx` does the same;
# without it those tests skip, saying so.
set -euo pipefail
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "nginx is missing and this is not Debian: the idle-timeout proxy tests will skip" >&2
  exit 0
fi
echo "nginx is missing: installing Debian's nginx-light" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx-light >/dev/null
# The package starts a system nginx on port 80; the tests run their own.
$sudo service nginx stop >/dev/null 2>&1 || $sudo nginx -s quit >/dev/null 2>&1 || true
