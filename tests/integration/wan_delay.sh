#!/usr/bin/env bash
# The WAN test bed's delay (tools/nfq_delay.c through tools/wan_bed.sh,
# doc/wan.md): the median of 40 UDP ping-pongs between two namespaces, on a
# bed without delay and on one with --delay=DELAY_MS at each peer's ingress.
# The difference must be 2 x DELAY_MS, from -0.5 ms (the delay is never
# shorter than asked; the slack covers the undelayed median's noise) to
# +3 ms (two late wake-ups of the helper on a loaded machine). The helpers'
# counters must show every probe held and none dropped.
#   wan_delay.sh WAN_BED_SH NFQ_DELAY [DELAY_MS]
# Skips (77) without root, namespaces, nfq_delay, iptables or NFQUEUE.
set -u
bed=$1
nfq=${2:-}
d=${3:-10}
. "$(dirname "$(readlink -f "$0")")/wan_common.sh"
wan_need_bed
wan_need_delay "$nfq"
. "$bed"
log=$(mktemp /tmp/wan_delay.XXXXXX)
trap '_wan_trap_exit; rm -f "$log" "$log.down"' EXIT
# rtt DELAY: the ping statistics line on a fresh bed with that delay.
rtt() {
	wan_up --peers=2 --rate=1gbit --delay="$1" --nfq="$nfq" || return 1
	local id=$WAN_ID out
	wan_exec "$id" 1 "$probe" echo 5002 20 >"$log" 2>&1 &
	local echo_pid=$!
	wait_for "$log" ready || return 1
	out=$(timeout 30 ip netns exec "mpw-$id-0" "$probe" ping 10.77.0.2 5002 40) || return 1
	# Only the echo server: the bed's helpers are this shell's children too.
	wait "$echo_pid"
	WAN_ID=""
	wan_down "$id" 2>"$log.down" || { cat "$log.down"; return 1; }
	cat "$log.down" >&2
	echo "$out"
}
base=$(rtt 0) || { echo "FAIL: no undelayed measurement"; exit 1; }
echo "no delay:      $base"
slow=$(rtt "${d}ms" 2>"$log.counters") || { echo "FAIL: no delayed measurement"; cat "$log.counters"; exit 1; }
echo "${d} ms a side: $slow"
cat "$log.counters"
rc=0
for peer in 0 1; do
	c=$(grep "peer $peer nfq_delay:" "$log.counters")
	if [ -z "$c" ] || [ "$(field "$c" accepted)" -lt 40 ] || [ "$(field "$c" dropped_full)" != 0 ]; then
		echo "FAIL: peer $peer's helper did not hold every probe: $c"
		rc=1
	fi
done
rm -f "$log.counters"
python3 - "$d" "$(field "$base" median_ms)" "$(field "$slow" median_ms)" <<'PY' || rc=1
import sys
d, base, slow = (float(x) for x in sys.argv[1:])
added = slow - base
ok = 2 * d - 0.5 <= added <= 2 * d + 3
print(f"{'ok' if ok else 'FAIL'}: median RTT {base:.3f} -> {slow:.3f} ms: +{added:.3f} ms "
      f"for 2 x {d:g} ms (allowed {2 * d - 0.5:g} to {2 * d + 3:g})")
sys.exit(0 if ok else 1)
PY
exit $rc
