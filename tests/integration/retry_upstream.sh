#!/bin/sh
# Run a test command; if it fails because a process crashed inside a library
# we do not own (the first frame of its backtrace names LIB), run it again,
# at most twice, and say so. Any other failure, or a third crash, fails the
# test.
#   retry_upstream.sh LIB COMMAND [ARGS...]
# Why: libfabric 1.17's tcp provider (Debian 12) now and then crashes in
# fi_cq_read when a peer is SIGKILLed mid-transfer (doc/rdma.md, Known
# problems); the test is about our protocol's handling of the death.
lib=$1
shift
out=$(mktemp /tmp/retry_upstream.XXXXXX) || exit 1
trap 'rm -f "$out"' EXIT

try=1
while :; do
	"$@" >"$out" 2>&1
	rc=$?
	cat "$out"
	[ "$rc" -eq 0 ] && exit 0
	# The first frame after "terminated with signal" that is not the C
	# library's signal trampoline is where it crashed. Other peers' log
	# lines may come between (they write to the same terminal): frames
	# are the lines that start with a path.
	frame=$(grep -A12 'terminated with signal' "$out" | grep '^/' |
		grep -v '/libc\.so' | head -n 1)
	if [ "$try" -ge 3 ] || ! printf '%s\n' "$frame" | grep -q "$lib"; then
		exit "$rc"
	fi
	echo "retry_upstream: a process crashed inside $lib (upstream); try $((try + 1)) of 3"
	try=$((try + 1))
done
