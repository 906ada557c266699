#!/usr/bin/env bash
# Builds Jaeger (all-in-one, v2) once into a cache directory and prints the
# binary's path. web/tracing_test.go runs it as the real trace backend that
# Moonji's OTLP exporter is proven against. Jaeger lives in its own module
# (tools/jaeger) so that its large dependency graph never enters the
# gateway's go.mod. The first build takes several minutes on a small
# machine; later calls return at once.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version="$(awk '$1 == "github.com/jaegertracing/jaeger" {print $2}' "$root/tools/jaeger/go.mod")"
if [ -z "$version" ]; then
  echo "tools/jaeger/go.mod does not require github.com/jaegertracing/jaeger" >&2
  exit 1
fi
cache="${MOONJI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/moonji}/jaeger-$version"
bin="$cache/jaeger"
if [ ! -x "$bin" ]; then
  mkdir -p "$cache"
  echo "building jaeger $version into $cache (once; takes a few minutes)" >&2
  # Build into a temporary name and rename: a build interrupted halfway
  # never leaves a binary that looks finished.
  (cd "$root/tools/jaeger" && CGO_ENABLED=0 go build -trimpath -o "$bin.tmp.$$" github.com/jaegertracing/jaeger/cmd/jaeger)
  mv "$bin.tmp.$$" "$bin"
fi
echo "$bin"
