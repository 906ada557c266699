#!/usr/bin/env bash
# Installs Debian's chromium when it is missing: Playwright's own browser
# download cannot work on these machines, so the e2e suite drives this one.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
  exit 0
fi
echo "chromium is missing: installing Debian's package" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
