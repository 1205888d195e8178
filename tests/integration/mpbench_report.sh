#!/bin/sh
# What mpbench reports, as nccl-tests users read it:
#   mpbench_report.sh MPBENCH [dht]
#  - the sizes asked for are the sizes run: -b 1M -e 1M runs 1M, statically
#    and (with "dht") under --rendezvous=dht, which ran 256K before;
#  - the JSON carries schema_version, timestamp, host, library version and
#    git commit, and the transport's details;
#  - the automatic grid of 8 peers or fewer is one group: the header says
#    Moshpit then runs as one butterfly and how to get a grid (not with
#    --grid);
#  - --minmax adds min_time and max_time (19 columns), time being the max;
#  - multi-host (ranks over MP_PEERS): time is the max over the ranks, their
#    times gathered in uncompressed averages whatever the codec: two ranks
#    with --codec=fp16, three on a partial grid with uniform8, and two with
#    rank 1 an aux peer (MP_MODE=aux, weight 0 in the gather's first pass).
mpbench=$1
dht=$2
tmp=$(mktemp -d /tmp/mpbench_report.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() {
	echo "FAIL: $*"
	fail=1
}
# field FILE KEY: the first value of "KEY": in FILE.
field() {
	sed -n "s/.*\"$2\": \([^,}]*\).*/\1/p" "$1" | head -n 1
}
rows_are() {
	# rows_are JSON BYTES: exactly one result row, of BYTES bytes.
	n=$(grep -c '"bytes":' "$1")
	got=$(field "$1" bytes)
	[ "$n" -eq 1 ] && [ "$got" = "$2" ] || bad "$1: $n row(s) of ${got:-no} bytes, want 1 of $2"
}

# Static, one process per peer: 4 peers, -b 1M -e 1M, --minmax.
"$mpbench" --peers=4 -b 1M -e 1M -n 1 -w 0 --minmax --json="$tmp/s.json" >"$tmp/s" 2>&1 ||
	bad "static run exited $?: $(tail -n 3 "$tmp/s")"
rows_are "$tmp/s.json" 1048576
[ "$(field "$tmp/s.json" schema_version)" = 4 ] || bad "schema_version is not 4"
field "$tmp/s.json" timestamp | grep -qE '^"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z"$' ||
	bad "timestamp $(field "$tmp/s.json" timestamp) is not ISO 8601 UTC"
[ "$(field "$tmp/s.json" host)" = "\"$(hostname)\"" ] || bad "host is $(field "$tmp/s.json" host)"
grep -q '"library": {"version": "[0-9]*\.[0-9]*\.[0-9]*", "git_commit": "[^"]\+"}' \
	"$tmp/s.json" || bad "no library version and git commit: $(grep library "$tmp/s.json")"
grep -q '"transport_detail": {"name": "tcp"}' "$tmp/s.json" || bad "no transport_detail"
[ "$(field "$tmp/s.json" time_is)" = '"max over peers"' ] || bad "time_is $(field "$tmp/s.json" time_is)"
grep -q "^# note: the automatic grid for 4 peers is one group (8 peers or fewer): Moshpit runs as one butterfly all-reduce; --grid=MxN (e.g. --grid=2x2)" "$tmp/s" ||
	bad "no butterfly note for 4 peers on the automatic grid"
hdr=$(grep '^# *size ' "$tmp/s" | wc -w)
row=$(grep '^ *1048576 ' "$tmp/s" | wc -w)
# "#" and 17 columns, plus min_time and max_time.
[ "$hdr" -eq 20 ] && [ "$row" -eq 19 ] || bad "--minmax: header of $hdr words, row of $row, want 20 and 19"
tmin=$(field "$tmp/s.json" time_min_us)
tmax=$(field "$tmp/s.json" time_us)
awk -v a="$tmin" -v b="$tmax" 'BEGIN { exit !(a > 0 && a <= b) }' ||
	bad "time_min_us $tmin, time_us $tmax: want 0 < min <= max"
# One timed iteration: each peer's median is its mean, so the largest
# median is the largest mean, to the digit.
tmed=$(field "$tmp/s.json" time_median_us)
[ "$tmed" = "$tmax" ] || bad "-n 1: time_median_us $tmed, want time_us $tmax"
# Five: the median is some peer's middle iteration, within its run.
"$mpbench" --peers=2 -b 4K -e 4K -n 5 -w 0 --json="$tmp/m.json" >"$tmp/m" 2>&1 ||
	bad "-n 5 run exited $?"
tmed=$(field "$tmp/m.json" time_median_us)
awk -v a="$tmed" 'BEGIN { exit !(a > 0) }' || bad "-n 5: time_median_us $tmed, want > 0"

# A grid given: no note.
"$mpbench" --peers=4 --grid=2x2 -b 4K -e 4K -n 1 -w 0 >"$tmp/g" 2>&1 || bad "--grid=2x2 run exited $?"
grep -q "one butterfly" "$tmp/g" && bad "butterfly note with --grid=2x2"

# Multi-host: ranks over MP_PEERS; rank 0 reports the max over ranks.
# multi NAME NRANKS AUXRANK ARGS...: run NRANKS ranks (AUXRANK, unless -1,
# with MP_MODE=aux), rank 0 with --minmax and --json=$tmp/NAME.json; check
# the header, time_is, time_ranks, and that the fastest and slowest times
# differ (two ranks' times arrived, not rank 0's twice).
# Listening ports under the ephemeral range (32768 and up by default): one
# there can be taken by an outgoing connection of an earlier run (its rank 0
# failed once with "Address already in use" on 34924).
port=$((20000 + $$ % 10000))
multi() {
	name=$1 n=$2 aux=$3
	shift 3
	peers="127.0.0.1:$port"
	r=1
	while [ "$r" -lt "$n" ]; do
		peers="$peers,127.0.0.1:$((port + r))"
		r=$((r + 1))
	done
	port=$((port + n))
	pids=
	r=1
	while [ "$r" -lt "$n" ]; do
		mode=normal
		[ "$r" -eq "$aux" ] && mode=aux
		MP_MODE=$mode MP_PEERS=$peers timeout 120 "$mpbench" --rank=$r "$@" \
			>"$tmp/$name.$r" 2>&1 &
		pids="$pids $!"
		r=$((r + 1))
	done
	MP_PEERS=$peers timeout 120 "$mpbench" --rank=0 "$@" --minmax --json="$tmp/$name.json" \
		>"$tmp/$name.0" 2>&1 || bad "$name: rank 0 exited $?: $(tail -n 3 "$tmp/$name.0")"
	for pid in $pids; do
		wait "$pid" || bad "$name: a rank exited $?: $(tail -n 3 "$tmp/$name".[1-9])"
	done
	grep -q "^# time: the slowest rank's (max over the $n ranks, as nccl-tests)" "$tmp/$name.0" ||
		bad "$name: the header does not say time is the max over the $n ranks"
	grep -q "time is the max over" "$tmp/$name.0" &&
		bad "$name: $(grep "time is the max over" "$tmp/$name.0")"
	[ "$(field "$tmp/$name.json" time_is)" = '"max over ranks"' ] ||
		bad "$name: time_is $(field "$tmp/$name.json" time_is)"
	[ "$(field "$tmp/$name.json" time_ranks)" = "$n" ] ||
		bad "$name: time_ranks $(field "$tmp/$name.json" time_ranks), want $n"
	grep -qF "\"peer_hosts\": \"$peers\"" "$tmp/$name.json" ||
		bad "$name: peer_hosts: $(grep peer_hosts "$tmp/$name.json")"
	tmin=$(field "$tmp/$name.json" time_min_us)
	tmax=$(field "$tmp/$name.json" time_us)
	awk -v a="$tmin" -v b="$tmax" 'BEGIN { exit !(a > 0 && a < b) }' ||
		bad "$name: time_min_us $tmin, time_us $tmax: want 0 < min < max"
	# The ranks' medians travel with their means (fp32, one average); of
	# 2 timed iterations the median is the mean, so they are the same
	# rank's same figure, to fp32 rounding.
	tmed=$(field "$tmp/$name.json" time_median_us)
	awk -v a="$tmed" -v b="$tmax" 'BEGIN { exit !(a > 0 && a >= b * 0.9999 && a <= b * 1.0001) }' ||
		bad "$name: time_median_us $tmed, time_us $tmax: want them equal (-n 2)"
}
multi fp16 2 -1 -b 64K -e 64K -n 2 -w 1 --codec=fp16
multi partial 3 -1 -b 64K -e 64K -n 2 -w 1 --codec=uniform8 --grid=2x2
multi aux 2 1 -b 64K -e 64K -n 2 -w 1 --codec=fp16

# The DHT rendezvous: -b 1M -e 1M runs 1M.
if [ "$dht" = dht ]; then
	"$mpbench" --rendezvous=dht --peers=4 -b 1M -e 1M -n 1 -w 0 --json="$tmp/d.json" \
		>"$tmp/d" 2>&1 || bad "dht run exited $?: $(tail -n 3 "$tmp/d")"
	rows_are "$tmp/d.json" 1048576
	grep -q "^# minBytes 1048576  maxBytes 1048576" "$tmp/d" || bad "dht header: $(grep minBytes "$tmp/d")"
fi
[ "$fail" -eq 0 ] && echo "ok"
exit $fail
