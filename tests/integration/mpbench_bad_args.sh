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
# As check, and the message must contain $1.
check_says() {
	want=$1
	shift
	check "$@"
	if ! grep -qF -- "$want" /tmp/mpbench_bad_args.$$; then
		echo "FAIL: mpbench $* did not say '$want':"
		cat /tmp/mpbench_bad_args.$$
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
# Sizes are in the library's grammar (src/common/size.h): a count beyond
# 2^64 - 1 bytes is refused, never wrapped. 18014398509482048K is 2^64 plus
# 64K: wrapped, it would be a valid 64K and the benchmark would run.
check_says "bad size '18014398509482048K' for --minbytes" -b 18014398509482048K -e 64K
check_says "bad size '17179869184G' for --maxbytes" -e 17179869184G
check_says "bad size '99999999999999999999' for --minbytes" -b 99999999999999999999
check_says "bad size '18014398509482048K' for --chunk" --chunk=18014398509482048K -e 64K
check_says "bad size '' for --minbytes" -b ''
check_says "bad size '-64K' for --minbytes" -b -64K
rm -f /tmp/mpbench_bad_args.$$
exit $fail
