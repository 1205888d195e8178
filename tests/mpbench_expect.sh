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

"$mpbench" --json="$json" "$@"
rc=$?
if [ "$rc" -ne 0 ]; then
	echo "FAIL: mpbench $* exited $rc"
	exit 1
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
exit $fail
