#!/bin/sh
# mpbench --peer-stats: every rank's table in the JSON, each peer live and
# measured, the results exact; under MP_BALANCE=measured as well.
#   mpbench_peer_stats.sh MPBENCH
mpbench=$1
json=$(mktemp /tmp/mpbench_pstats.XXXXXX) || exit 1
trap 'rm -f "$json"' EXIT
for balance in configured measured; do
	MP_BALANCE=$balance "$mpbench" --peers=4 --algo=butterfly -b 256K -e 256K -n 3 -w 1 \
		--peer-stats --json="$json" >/dev/null || { echo "FAIL: mpbench exited $? ($balance)"; exit 1; }
	self=$(grep -c '"state": "self"' "$json")
	live=$(grep '"state": "live"' "$json" | grep -vc '"bandwidth_Bps": 0,')
	zero_rtt=$(grep '"state": "live"' "$json" | grep -c '"rtt_s": 0,')
	oob=$(sed -n 's/^ *"out_of_bounds": \([^,}]*\).*/\1/p' "$json")
	if [ "$self" != 4 ] || [ "$live" != 12 ] || [ "$zero_rtt" != 0 ] || [ "$oob" != 0 ]; then
		echo "FAIL ($balance): $self self entries, $live live and measured, $zero_rtt without a round trip, out_of_bounds $oob"
		cat "$json"
		exit 1
	fi
done
echo OK
