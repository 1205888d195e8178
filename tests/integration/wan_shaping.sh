#!/usr/bin/env bash
# The WAN test bed's shaping (tools/wan_bed.sh, doc/wan.md): one TCP stream
# between two namespaces on a bed shaped to RATE (default 100mbit) moves
# data for 4 s or 50 MB, whichever first, and both rates must be within 10%
# of RATE: the wire rate (bytes the tbf sent, headers included, over the
# time until the receiver had every byte) and the goodput (payload only, at
# most 1448/1514 = 95.6% of the wire rate with 1500-byte frames).
#   wan_shaping.sh WAN_BED_SH [RATE_BPS_EXPECTED] [RATE]
# Skips (77) without root or namespaces.
set -u
bed=$1
expect=${2:-100000000}
rate=${3:-100mbit}
. "$(dirname "$(readlink -f "$0")")/wan_common.sh"
wan_need_bed
. "$bed"
wan_up --peers=2 --rate="$rate" || exit 1
echo "bed $WAN_ID: 2 peers, $rate"
sinklog=$(mktemp /tmp/wan_shaping.XXXXXX)
trap '_wan_trap_exit; rm -f "$sinklog"' EXIT
wan_exec "$WAN_ID" 1 "$probe" sink 5001 >"$sinklog" 2>&1 &
sink_pid=$!
wait_for "$sinklog" ready || exit 1
out=$(timeout 30 ip netns exec "mpw-$WAN_ID-0" "$probe" stream 10.77.0.2 5001 4 50000000 wan0) || {
	echo "FAIL: the stream did not finish: $out"
	exit 1
}
wait "$sink_pid"
echo "$out"
grep -q "received=$(field "$out" bytes)\$" "$sinklog" || { echo "FAIL: sink: $(cat "$sinklog")"; exit 1; }
python3 - "$expect" "$(field "$out" wire_bps)" "$(field "$out" goodput_bps)" <<'PY' || exit 1
import sys
want, wire, good = (float(x) for x in sys.argv[1:])
bad = 0
for name, v in (("wire", wire), ("goodput", good)):
    err = (v - want) / want
    ok = abs(err) <= 0.10
    bad += not ok
    print(f"{'ok' if ok else 'FAIL'}: {name} {v / 1e6:.1f} Mbit/s, {err * 100:+.1f}% of {want / 1e6:.0f} Mbit/s (10% allowed)")
sys.exit(1 if bad else 0)
PY
