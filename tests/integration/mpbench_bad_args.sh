#!/bin/sh
# Bad arguments print usage and exit 2; nothing is started.
mpbench=$1
fail=0
check() {
	"$mpbench" "$@" >/dev/null 2>/tmp/mpbench_bad_args.$$
	rc=$?
	if [ "$rc" -ne 2 ] || ! grep -qi usage /tmp/mpbench_bad_args.$$; then
		echo "FAIL: mpbench $* exited $rc (want 2 with usage)"
		fail=1
	fi
}
check --bogus
check --peers=0
check --algo=tree
check --codec=zip
check -b 3
check -b 1X
check --transport=smoke
check --grid=2xx2
check -b 1M -e 1K
rm -f /tmp/mpbench_bad_args.$$
exit $fail
