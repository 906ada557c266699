#!/bin/sh
# Checks what the Dockerfile makes without Docker (none runs here): builds
# the binary with the Dockerfile's own build line, read from the Dockerfile
# so the two cannot drift apart, then starts it the way the image does — as
# the image's non-root user, in a data directory owned by that user, with
# only the image's ENV — and checks that it answers /healthz and /readyz and
# stops cleanly on SIGTERM.
#
# What differs from the image, and why: the image's absolute paths (/out,
# the WORKDIR) live under a temporary directory, because this runs on the
# developer's machine; and the port of MOONJI_LISTEN is 0, so that a gateway
# already listening on 8080 does not make the check fail. The host part is
# kept, so the binary still listens on all interfaces as in the image.
# Listening there, it refuses the embedded development login (README,
# Docker), so like any deployment of the image it is given a configuration
# file (MOONJI_CONFIG) with an oidc section; the provider is only contacted
# at the first sign-in, which never comes here.
set -eu
umask 022
cd "$(dirname "$0")/.."

say() { echo "test-image: $*"; }
die() { echo "test-image: $*" >&2; exit 1; }

# The build: the one RUN line of the Dockerfile that calls go build.
build=$(sed -n 's/^RUN \(CGO_ENABLED=0 go build .*\)$/\1/p' Dockerfile)
[ -n "$build" ] && [ "$(printf '%s\n' "$build" | wc -l)" -eq 1 ] ||
	die "want exactly one 'RUN CGO_ENABLED=0 go build' line in the Dockerfile"
case $build in
*" -o /out/moonji "*) ;;
*) die "the Dockerfile's build line no longer writes /out/moonji: $build" ;;
esac
# The run stage: its WORKDIR (the data directory), the owner of that
# directory (the non-root user), its ENV and its CMD.
workdir=$(sed -n 's/^WORKDIR \(\/.*\)$/\1/p' Dockerfile | tail -n 1)
owner=$(sed -n 's/^COPY .*--chown=\([0-9]*:[0-9]*\) .*$/\1/p' Dockerfile | tail -n 1)
cmd=$(sed -n 's/^CMD \[\(.*\)\]$/\1/p' Dockerfile | tr -d '",')
[ -n "$workdir" ] && [ -n "$owner" ] && [ -n "$cmd" ] ||
	die "could not read the run stage's WORKDIR, --chown owner or CMD from the Dockerfile"
# ENV instructions, continuation lines joined: one KEY=VALUE a line.
envs=$(awk '
	/^ENV / { on = 1; sub(/^ENV[ \t]+/, "") }
	on {
		line = $0
		more = sub(/[ \t]*\\$/, "", line)
		n = split(line, kv, /[ \t]+/)
		for (i = 1; i <= n; i++) if (kv[i] != "") print kv[i]
		if (!more) on = 0
	}' Dockerfile)
for kv in $envs; do
	case $kv in
	*=*) ;;
	*) die "an ENV of the Dockerfile is not KEY=VALUE: $kv" ;;
	esac
	case $kv in
	*\"* | *\'* | *\$*) die "quoted or substituted ENV values are not handled here: $kv" ;;
	esac
done

work=$(mktemp -d "${TMPDIR:-/tmp}/moonji-image.XXXXXX")
pid=
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
chmod 755 "$work"

say "building with the Dockerfile's line: $build"
sh -c "$(printf '%s\n' "$build" | sed "s# /out/# $work/out/#g")"
[ -x "$work/out/moonji" ] || die "the build line made no $work/out/moonji"

# The image's data directory, made as the image makes it (a copy of
# /out/data owned by the non-root user).
data=$work$workdir
mkdir -p "$(dirname "$data")"
cp -R "$work/out/data" "$data"

uid=${owner%:*}
gid=${owner#*:}
as=
if [ "$(id -u)" -ne 0 ]; then
	say "not root: running as uid $(id -u), which is not root either"
	uid=$(id -u)
elif command -v setpriv >/dev/null 2>&1; then
	chown -R "$owner" "$data"
	as="setpriv --reuid=$uid --regid=$gid --clear-groups"
elif command -v runuser >/dev/null 2>&1 && id nobody >/dev/null 2>&1; then
	uid=$(id -u nobody)
	chown -R "$uid" "$data"
	as="runuser -u nobody --"
else
	say "SKIPPED the non-root part: running as root, and neither setpriv nor runuser (util-linux) is here"
	uid=0
fi

# The operator's part: a configuration file naming an OpenID provider.
mkdir -p "$work/etc/moonji"
printf 'oidc:\n  issuer: https://idp.invalid\n  client_id: moonji\n' >"$work/etc/moonji/moonji.yaml"

# Only the image's environment, its paths moved under $work and port 0.
set -- MOONJI_CONFIG="$work/etc/moonji/moonji.yaml"
for kv in $envs; do
	kv=$(printf '%s\n' "$kv" | sed "s#$workdir#$data#g")
	case $kv in
	MOONJI_LISTEN=*) kv=$(printf '%s\n' "$kv" | sed 's/:[0-9]*$/:0/') ;;
	esac
	set -- "$@" "$kv"
done
say "starting '$cmd' in $data with: $*"
log=$work/serve.log
: >"$log"
(cd "$data" && exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@" \
	$as "$work/out/moonji" $cmd >"$log" 2>&1) &
pid=$!

# Wait for the listening line (the port was the kernel's choice).
addr=
tries=0
while [ -z "$addr" ]; do
	if ! kill -0 "$pid" 2>/dev/null; then
		cat "$log" >&2
		die "the binary exited before listening"
	fi
	tries=$((tries + 1))
	if [ "$tries" -gt 600 ]; then
		cat "$log" >&2
		die "the binary did not log that it listens within 60 s"
	fi
	addr=$(sed -n 's/.*msg="moonji is listening".* addr=\([^ ]*\).*/\1/p' "$log")
	[ -n "$addr" ] || sleep 0.1
done
port=${addr##*:}

if [ -r "/proc/$pid/status" ]; then
	running=$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")
	[ "$running" = "$uid" ] || die "the server runs as uid $running, want $uid"
	say "the server runs as uid $running"
fi

get() {
	if command -v curl >/dev/null 2>&1; then
		curl -fsS --max-time 10 "http://127.0.0.1:$port$1"
	else
		wget -q -T 10 -O - "http://127.0.0.1:$port$1"
	fi
}
for route in /healthz /readyz; do
	if ! body=$(get "$route"); then
		cat "$log" >&2
		die "GET $route failed"
	fi
	say "GET $route: $body"
done

kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
if [ "$rc" -ne 0 ]; then
	cat "$log" >&2
	die "the binary exited with status $rc on SIGTERM"
fi
if grep -q 'level=ERROR' "$log"; then
	cat "$log" >&2
	die "the binary logged errors"
fi
say "ok: built with the Dockerfile's line, served as uid $uid with the image's ENV, stopped cleanly"
