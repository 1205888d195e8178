#!/usr/bin/env bash
# The dpdk transport against its path's own limit and against tcp, in one run
# (doc/performance.md, "DPDK"). Needs root, a build with the dpdk transport
# and dpdk-testpmd (Debian package dpdk-dev).
#
#   tools/bench_dpdk.sh [BUILD_DIR]       (default: build)
#
# 1. memif: dpdk-testpmd txonly -> rxonly between two processes gives the raw
#    frame rate of net_memif for our frame size (1514 bytes: MTU 1500); then
#    mpbench --transport=dpdk --peers=2 (its own memif pair) averages 1-16 MiB.
# 2. veth: two network namespaces on a bridge, each with a veth carrying an
#    IP address; mpbench runs one peer per namespace from a hostfile, once
#    with --transport=tcp (kernel TCP over the veths) and once with
#    --transport=dpdk (net_af_packet on the same veths).
# Shard throughput = bytes one peer sends per average (wire_bytes) / time.
# Everything it creates is removed on exit.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$top/build}
mpbench=$build/tools/mpbench
testpmd=$(command -v dpdk-testpmd || true)
sizes=(-b 1M -e 16M -f 4 -n 5 -w 2)
tag=mpbd$$
tmp=$(mktemp -d /tmp/bench_dpdk.XXXXXX)

[ "$(id -u)" -eq 0 ] || { echo "bench_dpdk: run as root" >&2; exit 1; }
[ -x "$mpbench" ] || { echo "bench_dpdk: no $mpbench (build first)" >&2; exit 1; }
[ -n "$testpmd" ] || { echo "bench_dpdk: dpdk-testpmd missing (apt-get install dpdk-dev)" >&2; exit 1; }
"$mpbench" --transport=dpdk --help >/dev/null 2>&1 ||
	{ echo "bench_dpdk: $mpbench has no dpdk transport" >&2; exit 1; }

cleanup() {
	for i in 0 1; do ip netns del "$tag-$i" 2>/dev/null || true; done
	ip link del "${tag}b" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# Shard throughput in MB/s of the rows of an mpbench table: "size MB/s" lines.
rates() {
	awk '/^ +[0-9]+ +[0-9]+ +float/ { printf "%d %.0f\n", $1, $11 / $8 }' "$1"
}

echo "== memif: raw frame rate (dpdk-testpmd txonly -> rxonly, 1514-byte frames)"
eal="--no-huge -m 512 --no-pci --no-telemetry"
sock=/$tag.sock
# Each forwards on its own core (the main lcores only print statistics).
"$testpmd" -l 0-1 --main-lcore=0 $eal --file-prefix="${tag}s" --vdev="net_memif0,role=server,socket=$sock" -- \
	--total-num-mbufs=16384 --rxd=1024 --txd=1024 --nb-cores=1 --forward-mode=rxonly --stats-period=1 --auto-start >"$tmp/rx.log" 2>&1 &
rxpid=$!
sleep 3
"$testpmd" -l 0-1 --main-lcore=1 $eal --file-prefix="${tag}c" --vdev="net_memif0,role=client,socket=$sock" -- \
	--total-num-mbufs=16384 --rxd=1024 --txd=1024 --nb-cores=1 --forward-mode=txonly --txpkts=1514 --stats-period=1 --auto-start \
	>"$tmp/tx.log" 2>&1 &
txpid=$!
sleep 8
kill -INT "$txpid" "$rxpid" 2>/dev/null || true
wait "$txpid" "$rxpid" 2>/dev/null || true
# The best 1-second receive rate after the first two seconds.
pps=$(grep -o 'Rx-pps: *[0-9]*' "$tmp/rx.log" | awk '{print $2}' | tail -n +3 | sort -n | tail -1 || true)
raw=$(awk -v p="${pps:-0}" 'BEGIN { printf "%.0f", p * 1514 / 1e6 }')
echo "testpmd memif: ${pps:-0} frames/s = $raw MB/s of frames"

echo "== memif: mpbench --transport=dpdk --peers=2 ${sizes[*]}"
"$mpbench" --transport=dpdk --peers=2 "${sizes[@]}" >"$tmp/memif.log" 2>&1
grep -v '^mpbench: size\|mp action' "$tmp/memif.log"
echo "   size  dpdk-memif MB/s  vs testpmd raw"
rates "$tmp/memif.log" | while read -r size r; do
	awk -v s="$size" -v r="$r" -v raw="$raw" \
		'BEGIN { printf "%8d %12d %14.0f%%\n", s, r, (raw > 0 ? 100 * r / raw : 0) }'
done

echo "== veth: tcp and dpdk (af_packet) on one bridged veth segment, 2 peers"
ip link add "${tag}b" type bridge
ip link set "${tag}b" up
for i in 0 1; do
	ns=$tag-$i
	ip netns add "$ns"
	ip link add "${tag}h$i" type veth peer name "${tag}n$i" netns "$ns"
	ip link set "${tag}h$i" master "${tag}b" up
	ip -n "$ns" link set "${tag}n$i" address "02:00:00:00:7e:0$((i + 1))" up
	ip -n "$ns" addr add "10.79.0.$((i + 1))/24" dev "${tag}n$i"
	ip -n "$ns" link set lo up
done
printf '10.79.0.1:29500\n10.79.0.2:29500\n' >"$tmp/hosts.tcp"
printf '02-00-00-00-7e-01/10.79.0.1:7000\n02-00-00-00-7e-02/10.79.0.2:7000\n' >"$tmp/hosts.dpdk"
for t in tcp dpdk; do
	for i in 1 0; do
		env MP_DPDK_VDEV="net_af_packet0,iface=${tag}n$i,framecnt=4096" \
			MP_DPDK_IP="10.79.0.$((i + 1))" MP_DPDK_RTO_MIN_US=20000 \
			ip netns exec "$tag-$i" "$mpbench" --transport=$t --hostfile="$tmp/hosts.$t" \
			--rank=$i --run="$tag-$t" "${sizes[@]}" >"$tmp/$t.$i.log" 2>&1 &
	done
	wait
	echo "-- $t (rank 0)"
	grep -v '^mpbench: size\|mp action' "$tmp/$t.0.log"
done
echo "   size  tcp-veth MB/s  dpdk-veth MB/s  dpdk/tcp"
join <(rates "$tmp/tcp.0.log") <(rates "$tmp/dpdk.0.log") | while read -r size a b; do
	awk -v s="$size" -v a="$a" -v b="$b" \
		'BEGIN { printf "%8d %12d %15d %9.2f\n", s, a, b, (a > 0 ? b / a : 0) }'
done
