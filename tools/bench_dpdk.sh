#!/usr/bin/env bash
# The dpdk transport against its path's own limit and against tcp, in one run
# (doc/performance.md, "DPDK"). Needs root, a build with the dpdk transport
# and dpdk-testpmd (Debian package dpdk-dev).
#
#   tools/bench_dpdk.sh [BUILD_DIR [RUNS]]   (default: build, 5)
#
# 1. memif, for each frame size (1514 bytes: MTU 1500; 9014: MTU 9000, the
#    mpbench default on memif; 32014: MTU 32000, which only memif carries),
#    RUNS times in turn: dpdk-testpmd txonly ->
#    rxonly between two processes gives the raw frame rate of net_memif; the
#    driver's own one-way throughput at the same frame size (test_dpdk_frames
#    --stream: 4 GiB as 1, 4 or 16 MiB messages, sent from registered memory,
#    received into posted buffers, the first tenth left out as warm-up, each
#    process pinned to its own CPU as testpmd's are) is the like-for-like
#    comparison, once as it is and once with the receiver a memif zero-copy
#    client with 256-slot rings (",zero-copy=yes,rsize=8": the server copies
#    frames straight into the receiver's mbufs, one copy fewer; 64 slots for
#    32014-byte frames, the same 2 MiB of ring); testpmd runs in both
#    set-ups too, and the better is the baseline (for 32014-byte frames also
#    testpmd's best at any of the sizes: its rate falls past 16 KiB frames,
#    and the stricter baseline is the one quoted); a memcpy of the
#    stream's bytes into its posted buffers by one core (test_dpdk_frames
#    --copy: memcpy and non-temporal stores, the better of the two) is the
#    second baseline, the bound for any receiver that writes the shards to
#    memory, and the same bytes cut into jumbo frames and copied into a
#    256-buffer ring (as memif's copy on the sending side does) bounds the
#    sender, and the same ring shared by two processes, one copying in and
#    one copying out (the stream without DPDK or a protocol), bounds both;
#    then
#    mpbench --transport=dpdk --peers=2 (its own memif pair) averages 1-16 MiB
#    (10 warm-up averages per size: memif's shared rings fault their 4 KiB
#    pages in during the first thousand frames), beside mpbench
#    --transport=loop (the same averaging between threads, no
#    device: the core's own ceiling). All of it RUNS times in turn; the
#    summary gives each rate's best (the capacity: other load on a shared
#    machine only lowers a rate) and median, and the best against testpmd's
#    best at the same frame size.
# 2. veth: two network namespaces on a bridge, each with a veth carrying an
#    IP address; mpbench runs one peer per namespace from a hostfile, once
#    with --transport=tcp (kernel TCP over the veths) and twice with
#    --transport=dpdk on the same veths, MTU 1500: net_af_packet, then
#    net_af_xdp.
# Shard throughput = bytes one peer sends per average (wire_bytes) / time.
# Everything it creates is removed on exit.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$top/build}
runs=${2:-5}
mpbench=$build/tools/mpbench
testpmd=$(command -v dpdk-testpmd || true)
sizes=(-b 1M -e 16M -f 4 -n 10 -w 10)
tag=mpbd$$
# The zero-copy receiver's memif arguments for LEN-byte frames (stream and
# testpmd alike): rings of about 2 MiB, 256 slots up to jumbo frames; the
# rule mpbench's own memif pair follows (tools/mpbench/dpdk_seg.c), so
# mpbench gets the same rings without being told.
zcargs() {
	local bs=$((($1 + 127) / 128 * 128)) rsize=8
	while [ "$rsize" -gt 5 ] && [ $(((1 << rsize) * bs)) -gt $((3 << 20)) ]; do
		rsize=$((rsize - 1))
	done
	echo ",zero-copy=yes,rsize=$rsize"
}
tmp=$(mktemp -d /tmp/bench_dpdk.XXXXXX)

[ "$(id -u)" -eq 0 ] || { echo "bench_dpdk: run as root" >&2; exit 1; }
[ -x "$mpbench" ] || { echo "bench_dpdk: no $mpbench (build first)" >&2; exit 1; }
[ -n "$testpmd" ] || { echo "bench_dpdk: dpdk-testpmd missing (apt-get install dpdk-dev)" >&2; exit 1; }
"$mpbench" --transport=dpdk --help >/dev/null 2>&1 ||
	{ echo "bench_dpdk: $mpbench has no dpdk transport" >&2; exit 1; }

cleanup() {
	# testpmd left running by an interrupted run (only this script's children)
	for p in $(jobs -p); do kill -INT "$p" 2>/dev/null || true; done
	for i in 0 1; do ip netns del "$tag-$i" 2>/dev/null || true; done
	ip link del "${tag}b" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# Shard throughput in MB/s of the rows of an mpbench table: "size MB/s" lines.
rates() {
	awk '/^ +[0-9]+ +[0-9]+ +float/ { printf "%d %.0f\n", $1, $11 / $8 }' "$1"
}

# testpmd LEN [zc]: the best 1-second receive rate of LEN-byte frames (MB/s),
# after the first two seconds. Each side forwards on its own core (the main
# lcores only print statistics); bsize makes one memif buffer hold one frame.
# With "zc" the receiver is the memif client, zero-copy with rings of
# zcargs LEN, as in the stream's zero-copy column; else memif's defaults.
testpmd_rate() {
	local len=$1 bs=$(( ($1 + 127) / 128 * 128 )) sock=/$tag.sock mb pps pids=()
	local eal="--no-huge -m 1024 --no-pci --no-telemetry" rx=server rxa="" rxeal="" n=16384
	[ "${2:-}" != zc ] || { rx=client rxa=$(zcargs "$len") rxeal=--single-file-segments; }
	mb=$((bs + 128 > 2176 ? bs + 128 : 2176))
	[ "$len" -le 16384 ] || n=4096 # 16384 mbufs of 32 KiB would not fit in -m
	# side rx|tx ROLE: one testpmd; the server starts first (a client dials it).
	side() {
		local mode=rxonly lc=0 more=$rxa pfx=r ex=$rxeal
		[ "$1" = rx ] || { mode="txonly --txpkts=$len"; lc=1; more=""; pfx=t; ex=""; }
		# shellcheck disable=SC2086
		"$testpmd" -l 0-1 --main-lcore=$lc $eal $ex \
			--file-prefix="$tag$pfx" --vdev="net_memif0,role=$2,socket=$sock,bsize=$bs$more" \
			-- --mbuf-size=$mb --total-num-mbufs=$n --rxd=1024 --txd=1024 --nb-cores=1 \
			--forward-mode=$mode --stats-period=1 --auto-start >"$tmp/$1.log" 2>&1 &
		pids+=($!)
	}
	if [ $rx = server ]; then side rx server; sleep 3; side tx client
	else side tx server; sleep 3; side rx client; fi
	sleep 8
	kill -INT "${pids[@]}" 2>/dev/null || true
	wait "${pids[@]}" 2>/dev/null || true
	pps=$(grep -o 'Rx-pps: *[0-9]*' "$tmp/rx.log" | awk '{print $2}' | tail -n +3 | sort -n | tail -1 || true)
	awk -v p="${pps:-0}" -v l="$len" 'BEGIN { printf "%.0f", p * l / 1e6 }'
}

stream=$build/tests/integration/test_dpdk_frames
# Every rate goes to $tmp/v.KEY, one line per run; summaries take the best
# (the capacity, which the machine's other load can only lower) and the median.
put() { echo "$2" >>"$tmp/v.$1"; }
best() { { sort -n "$tmp/v.$1" 2>/dev/null || true; } | awk '{ v = $1 } END { print v + 0 }'; }
median() { { sort -n "$tmp/v.$1" 2>/dev/null || true; } |
	awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }'; }
# rate_of TAG TEXT: the MB/s of TEXT's line "TAG: ...: N MB/s".
rate_of() { printf '%s\n' "$2" | sed -n "s/^$1: .*: \([0-9]*\) MB\/s/\1/p"; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", (b > 0 ? 100 * a / b : 0) }'; }

echo "== memif: $runs runs, each: memcpy baseline; testpmd raw rate; the driver's one-way stream"
echo "   (test_dpdk_frames --stream, 1/4/16 MiB messages); mpbench --transport=dpdk"
echo "   --peers=2 ${sizes[*]}; mpbench --transport=loop (the core alone)"
for run in $(seq 1 "$runs"); do
	line="run $run: memcpy"
	ring=""
	pipe=""
	for kib in 1024 4096 16384; do
		out=$(MP_DPDK_MTU=9000 "$stream" --copy "$kib" $((4194304 / kib + 1)) || true)
		r=$(rate_of copy "$out")
		g=$(rate_of copy-ring "$out")
		q=$(rate_of copy-pipe "$out")
		put "cp.$kib" "${r:-0}"
		put "cr.$kib" "${g:-0}"
		put "cq.$kib" "${q:-0}"
		line="$line ${r:-0}"
		ring="$ring ${g:-0}"
		pipe="$pipe ${q:-0}"
	done
	echo "   $line MB/s; the sender's copy into a ring (jumbo frames)$ring MB/s;" \
		"both through a ring shared by two processes$pipe MB/s"
	for mtu in 1500 9000 32000; do
		len=$((mtu + 14))
		raw=$(testpmd_rate "$len")
		rawz=$(testpmd_rate "$len" zc)
		put "tp.$len" "$raw"
		put "tpz.$len" "$rawz"
		line="run $run, $len-byte frames: testpmd $raw, zero-copy $rawz; stream"
		for zc in "" "$(zcargs "$len")"; do
			[ -z "$zc" ] || line="$line, zero-copy receiver"
			for kib in 1024 4096 16384; do
				out=$(MP_DPDK_MEMIF_ARGS=$zc MP_DPDK_MTU=$mtu timeout 300 "$stream" --stream \
					"$kib" $((4194304 / kib + 1)) 2>"$tmp/stream.err" || true)
				r=$(rate_of stream "$out")
				[ -n "$r" ] || { echo "   stream $kib KiB failed:"; grep -v 'mp action' "$tmp/stream.err" | tail -3; }
				put "st${zc:+z}.$len.$kib" "${r:-0}"
				line="$line ${r:-0}"
			done
		done
		MP_DPDK_MTU=$mtu "$mpbench" --transport=dpdk --peers=2 "${sizes[@]}" \
			>"$tmp/memif.log" 2>&1 ||
			{ echo "   mpbench --transport=dpdk failed:"; grep -v 'mp action' "$tmp/memif.log" | tail -5; }
		"$mpbench" --transport=loop --peers=2 "${sizes[@]}" >"$tmp/loop.log" 2>&1 || true
		line="$line, mpbench dpdk"
		while read -r size r; do put "mb.$len.$size" "$r"; line="$line $r"; done < <(rates "$tmp/memif.log")
		line="$line, loop"
		while read -r size r; do put "lp.$len.$size" "$r"; line="$line $r"; done < <(rates "$tmp/loop.log")
		c=$({ grep -h '^# dpdk counters' "$tmp/memif.log" |
			grep -o 'data_rtx=[0-9]*\|tx_again=[0-9]*' | tr '\n' ' '; } || true)
		echo "   $line MB/s; $c"
	done
done
echo "-- best (median) MB/s over $runs runs; % = best / testpmd's best at that frame size"
echo "   (the better of its two set-ups); memcpy: one core copying the stream's bytes"
echo "   from its source into its posted buffers, no device, with memcpy or with"
echo "   non-temporal stores, the better (the most a receiver that writes the shards"
echo "   to memory can do for that footprint)"
for kib in 1024 4096 16384; do
	echo "   memcpy $((kib / 1024)) MiB: $(best "cp.$kib") ($(median "cp.$kib")); the sender's" \
		"copy into a ring: $(best "cr.$kib") ($(median "cr.$kib")); two processes through" \
		"it: $(best "cq.$kib") ($(median "cq.$kib"))"
done
# testpmd's best at any frame size (either set-up)
tpany=$(cat "$tmp"/v.tp.* "$tmp"/v.tpz.* 2>/dev/null | sort -n | tail -1)
for len in 1514 9014 32014; do
	tp=$(best "tp.$len")
	tpz=$(best "tpz.$len")
	echo "   $len-byte frames: testpmd $tp ($(median "tp.$len")), zero-copy receiver" \
		"$tpz ($(median "tpz.$len"))"
	[ "$tpz" -le "$tp" ] || tp=$tpz
	# Past 16 KiB frames testpmd slows down: quote the stricter baseline.
	[ "$len" -le 16384 ] || { tp=${tpany:-$tp}; echo "     (% against testpmd's best at any frame size: $tp)"; }
	for kib in 1024 4096 16384; do
		b=$(best "st.$len.$kib")
		z=$(best "stz.$len.$kib")
		echo "     stream  $((kib / 1024)) MiB: $b ($(median "st.$len.$kib")) $(pct "$b" "$tp");" \
			"zero-copy receiver $z ($(median "stz.$len.$kib")) $(pct "$z" "$tp")," \
			"$(pct "$z" "$(best "cp.$kib")") of memcpy, $(pct "$z" "$(best "cq.$kib")") of two" \
			"processes"
	done
	for size in 1048576 4194304 16777216; do
		b=$(best "mb.$len.$size")
		echo "     mpbench $((size / 1048576)) MiB: dpdk $b ($(median "mb.$len.$size")) $(pct "$b" "$tp")," \
			"loop $(best "lp.$len.$size") ($(median "lp.$len.$size"))"
	done
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
for t in tcp dpdk xdp; do
	for i in 1 0; do
		vdev="net_af_packet0,iface=${tag}n$i,framecnt=4096"
		[ $t != xdp ] || vdev="net_af_xdp0,iface=${tag}n$i,start_queue=0,queue_count=1"
		env MP_DPDK_VDEV="$vdev" MP_DPDK_IP="10.79.0.$((i + 1))" \
			ip netns exec "$tag-$i" "$mpbench" --transport=${t/xdp/dpdk} \
			--hostfile="$tmp/hosts.${t/xdp/dpdk}" --rank=$i --run="$tag-$t" "${sizes[@]}" \
			>"$tmp/$t.$i.log" 2>&1 &
	done
	wait
	echo "-- $t (rank 0)"
	grep -v '^mpbench: size\|mp action' "$tmp/$t.0.log"
done
echo "   size  tcp-veth MB/s  af_packet MB/s  af_xdp MB/s  af_packet/tcp  af_xdp/tcp"
join <(rates "$tmp/tcp.0.log") <(rates "$tmp/dpdk.0.log") | join - <(rates "$tmp/xdp.0.log") |
	while read -r size a b c; do
		awk -v s="$size" -v a="$a" -v b="$b" -v c="$c" 'BEGIN { printf "%8d %12d %15d %12d %14.2f %11.2f\n",
			s, a, b, c, (a > 0 ? b / a : 0), (a > 0 ? c / a : 0) }'
	done
