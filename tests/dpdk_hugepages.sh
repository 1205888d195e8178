#!/bin/sh
# The dpdk transport on hugepages (MP_DPDK_HUGEPAGES=1: EAL --in-memory):
#   dpdk_hugepages.sh DPDK_MPBENCH_SH MPBENCH EXPECT [mpbench arguments...]
# Reserves the 2 MiB pages it needs when too few are free, runs
# dpdk_mpbench.sh (exact averages, the counters in EXPECT), checks that every
# peer's EAL came up on hugepages, and gives the pages back on exit.
# Skips (77) without root or when the pages cannot be reserved.
runner=$1
shift
need=160 # 2 peers x 128 MiB (mpbench's MP_DPDK_MEM_MB) and room for EAL's own
sysfs=/proc/sys/vm/nr_hugepages
if [ "$(id -u)" -ne 0 ] || [ ! -w "$sysfs" ]; then
	echo "SKIP: needs root to reserve hugepages ($sysfs)"
	exit 77
fi
free_pages() { awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo; }
orig=$(cat "$sysfs")
restore() { echo "$orig" >"$sysfs"; }
have=$(free_pages)
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
