#!/bin/sh
# mpbench --transport=dpdk on the segment it builds itself, then checks:
#   dpdk_mpbench.sh MPBENCH 'inj_loss>0 frame_bad_ip=0' [mpbench arguments...]
# mpbench must exit 0 with no value out of bounds (it compares every peer's
# result with the exact mean), the "# dpdk counters" line must sum one file
# per peer, and each KEY=N, KEY>N or KEY<N must hold for it.
# Skips (77) without root, without network namespaces (3 or more peers) or
# when the library has no dpdk transport.
mpbench=$1
expect=$2
shift 2
if [ "$(id -u)" -ne 0 ]; then
	echo "SKIP: needs root (network namespaces, veths, a bridge)"
	exit 77
fi
if ! "$mpbench" --transport=dpdk --help >/dev/null 2>&1; then
	echo "SKIP: this libmoshpit was built without the dpdk transport"
	exit 77
fi
if ! ip netns add mpb-probe-$$ 2>/dev/null; then
	echo "SKIP: cannot create network namespaces here"
	exit 77
fi
ip netns del mpb-probe-$$
out=$(mktemp /tmp/dpdk_mpbench.XXXXXX) || exit 1
json=$(mktemp /tmp/dpdk_mpbench.XXXXXX) || exit 1
trap 'rm -f "$out" "$json"' EXIT

"$mpbench" --transport=dpdk --json="$json" "$@" >"$out" 2>&1
rc=$?
cat "$out"
if [ "$rc" -ne 0 ]; then
	echo "FAIL: mpbench --transport=dpdk $* exited $rc"
	exit 1
fi
if ! grep -q "^# Out of bounds values : 0 OK" "$out"; then
	echo "FAIL: values out of bounds"
	exit 1
fi
if ip netns list | grep -q "^mpb-"; then
	echo "FAIL: mpbench left network namespaces behind"
	exit 1
fi
line=$(grep "^# dpdk counters" "$out" | tail -n 1)
fail=0
# The JSON names the port's PMD (mp_transport_detail), as the INFO log does.
if ! grep -q '"dpdk_driver": "net_' "$json"; then
	echo "FAIL: the JSON does not name the DPDK driver:"
	grep transport_detail "$json"
	fail=1
fi
# The line sums one counter file per peer, and nothing else.
peers=$(printf '%s\n' "$@" | sed -n 's/^--peers=//p' | tail -n 1)
if [ -n "$peers" ] && ! printf '%s\n' "$line" | grep -q "^# dpdk counters ($peers peers)"; then
	echo "FAIL: the counters line is not from $peers peers: ${line%%:*}"
	fail=1
fi
for cond in $expect; do
	key=$(printf '%s' "$cond" | sed 's/[=<>].*//')
	op=$(printf '%s' "$cond" | sed 's/^[^=<>]*\([=<>]\).*/\1/')
	want=${cond#*[=<>]}
	got=$(printf '%s\n' "$line" | sed -n "s/.* $key=\([0-9]*\).*/\1/p")
	case $op in
	'=') [ -n "$got" ] && [ "$got" -eq "$want" ] ;;
	'>') [ -n "$got" ] && [ "$got" -gt "$want" ] ;;
	'<') [ -n "$got" ] && [ "$got" -lt "$want" ] ;;
	esac
	if [ $? -ne 0 ]; then
		echo "FAIL: $key is ${got:-missing}, want $op $want"
		fail=1
	else
		echo "ok: $key = $got ($op $want)"
	fi
done
exit $fail
