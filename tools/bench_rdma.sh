#!/usr/bin/env bash
# ofi (the clear-to-send RDMA protocol over libfabric, tcp;ofi_rxm) against
# tcp on loopback, 1 KiB to 64 MiB, in the same run; prints both tables and
# the ofi/tcp bus-bandwidth ratio per size. Bounded (a timeout per run); a
# benchmark, not a test.
#   tools/bench_rdma.sh [BUILD_DIR] [PEERS]
set -euo pipefail
build=${1:-build}
peers=${2:-2}
mpbench=$build/tools/mpbench
args=(--peers="$peers" -b 1K -e 64M -f 4 -n 5 -w 2)
tmp=$(mktemp -d /tmp/bench_rdma.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for t in tcp ofi; do
	echo "## $mpbench --transport=$t ${args[*]}"
	timeout 300 "$mpbench" --transport="$t" "${args[@]}" | tee "$tmp/$t.txt"
done
echo "## ratio ofi/tcp (bus bandwidth)"
printf '%12s %10s %10s %8s\n' size tcp_GB/s ofi_GB/s ratio
awk 'FNR == NR && /^ +[0-9]/ {tcp[$1] = $10; next}
     /^ +[0-9]/ {printf "%12d %10.3f %10.3f %8.2f\n", $1, tcp[$1], $10,
		 (tcp[$1] > 0 ? $10 / tcp[$1] : 0)}' "$tmp/tcp.txt" "$tmp/ofi.txt"
