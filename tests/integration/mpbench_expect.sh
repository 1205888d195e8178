#!/bin/sh
# Run mpbench, then check fields of its JSON output:
#   mpbench_expect.sh MPBENCH 'peers_lost=2 wrong=0' [mpbench arguments...]
# Each KEY=VALUE must match the last result row (one object per line), or
# else a top-level field. mpbench must exit 0.
mpbench=$1
expect=$2
shift 2
json=$(mktemp /tmp/mpbench_expect.XXXXXX) || exit 1
trap 'rm -f "$json"' EXIT

# One run and its checks: 0, or 1 after saying what failed.
run() {
	"$mpbench" --json="$json" "$@"
	rc=$?
	if [ "$rc" -ne 0 ]; then
		echo "FAIL: mpbench $* exited $rc"
		return 1
	fi
	row=$(grep '"bytes":' "$json" | tail -n 1)
	fail=0
	for kv in $expect; do
		key=${kv%%=*}
		want=${kv#*=}
		got=$(printf '%s\n' "$row" | sed -n "s/.*\"$key\": \([^,}]*\).*/\1/p")
		if [ -z "$got" ]; then
			got=$(sed -n "s/^ *\"$key\": \([^,}]*\).*/\1/p" "$json" | head -n 1)
		fi
		if [ "$got" != "$want" ]; then
			echo "FAIL: $key is ${got:-missing}, want $want"
			fail=1
		else
			echo "ok: $key = $got"
		fi
	done
	return $fail
}

# MPBENCH_EXPECT_TRIES=N (default 1): a target met in most runs but not
# all (a timing race, measured and written up where the test is defined)
# passes if one of N runs meets it; every failed try is printed.
tries=${MPBENCH_EXPECT_TRIES:-1}
i=1
while ! run "$@"; do
	if [ "$i" -ge "$tries" ]; then
		exit 1
	fi
	i=$((i + 1))
	echo "retrying: try $i of $tries"
done
exit 0
