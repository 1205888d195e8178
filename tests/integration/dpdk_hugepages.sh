#!/bin/sh
# The dpdk transport on hugepages (MP_DPDK_HUGEPAGES=1: EAL --in-memory):
#   dpdk_hugepages.sh DPDK_MPBENCH_SH MPBENCH EXPECT [mpbench arguments...]
# With no free hugepages at all it first checks that a run asking for them
# fails with the driver's explanation. Then it reserves the 2 MiB pages it
# needs when too few are free, runs dpdk_mpbench.sh (exact averages, the
# counters in EXPECT), checks that every peer's EAL came up on hugepages,
# and gives the pages back on exit.
# Skips (77) without root or when the pages cannot be reserved.
runner=$1
mpbench=$2
shift
need=160 # 2 peers x 132 MiB (the driver's default -m at MTU 9000) and room for EAL's own
sysfs=/proc/sys/vm/nr_hugepages
if [ "$(id -u)" -ne 0 ] || [ ! -w "$sysfs" ]; then
	echo "SKIP: needs root to reserve hugepages ($sysfs)"
	exit 77
fi
free_pages() { awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo; }
orig=$(cat "$sysfs")
restore() { echo "$orig" >"$sysfs"; }
have=$(free_pages)
if [ "$have" -eq 0 ]; then
	msg=$(MP_DPDK_HUGEPAGES=1 "$mpbench" --transport=dpdk --peers=2 -b 4K -e 4K -n 1 -w 0 2>&1)
	if [ $? -eq 0 ] || ! printf '%s\n' "$msg" | grep -q 'MP_DPDK_HUGEPAGES=1 wants .* 0 pages are free'; then
		printf '%s\n' "$msg" | tail -5
		echo "FAIL: without free hugepages the run did not fail with the driver's explanation"
		exit 1
	fi
	echo "ok: without free hugepages: $(printf '%s\n' "$msg" | grep -o 'MP_DPDK_HUGEPAGES=1 wants [^:]*')"
fi
if [ "$have" -lt "$need" ]; then
	trap restore EXIT
	echo $((orig + need - have)) >"$sysfs"
	if [ "$(free_pages)" -lt "$need" ]; then
		echo "SKIP: could not reserve $need free 2 MiB hugepages (got $(free_pages))"
		exit 77
	fi
fi
out=$(mktemp /tmp/dpdk_hugepages.XXXXXX) || exit 1
MP_DPDK_HUGEPAGES=1 MP_DEBUG=INFO "$runner" "$@" >"$out" 2>&1
rc=$?
grep -v '\[moshpit\] INFO' "$out"
up=$(grep -c 'dpdk: EAL up: hugepages' "$out")
rm -f "$out"
[ "$rc" -eq 0 ] || exit "$rc"
if [ "$up" -ne 2 ]; then
	echo "FAIL: $up of 2 peers report EAL on hugepages"
	exit 1
fi
echo "ok: both peers ran on hugepages"
