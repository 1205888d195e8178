#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# soak.sh - a long churn run that would show slow leaks.
#
# Usage: tools/soak.sh [--out=DIR] [--no-flat] ROUNDS
#
#   ROUNDS     rounds of the run (1000 for the record; at least 20)
#   --out      keep mpbench's output, JSON and logs here (default: a
#              temporary folder, removed when the run passes)
#   --no-flat  print the kept peers' samples but do not judge them (the
#              suite's 100-round run: its rounds are mostly the peers'
#              warm-up, and the growth under churn is an open finding,
#              doc/reliability.md "Soak")
#
# 16 local peers over the DHT on a 4x4 grid, one Moshpit round per call
# with no pause between rounds (--compute-ms=0), 64 KiB each. Peers 0-3
# live through the whole run; each of the 12 others dies with SIGKILL in
# the middle of a round with probability 1/15 per round, 0.8 deaths per
# round on average (5% of 16), and is replaced at once. Every survivor's
# values are checked against the replay of every contribution log (mpbench
# --check=1). Every ROUNDS/10 rounds mpbench samples the resident memory,
# open descriptors and threads of the running initial peers (--sample).
#
# Targets, checked: no wrong element, no log inconsistency, no hang (mpbench
# gives up on a peer silent for its limit, and the whole run has a bound);
# for each of peers 0-3, its RSS and its descriptor count at the last
# sample within 10% of those at the first sample at or after round
# ROUNDS/10 (round 100 of 1000), or 50 if later, and its thread count
# unchanged; and at the end, each of peers 0-3 holds connection state
# (mp_stats peers_held) for at most 32 peers, however many it has known
# (peers_known), judged with --no-flat too. Prints a table; exit status 0
# when every target holds, 1 otherwise, 2 for bad usage.
#
# Environment: MPBENCH (the binary; default BUILD/tools/mpbench, BUILD
# default build/, configured and built when missing), SOAK_TIMEOUT (bound on
# the run in seconds; default 30 + 2 x ROUNDS).
set -u -o pipefail

prog=soak.sh
usage() {
	echo "$prog: $*" >&2
	echo "usage: $prog [--out=DIR] [--no-flat] ROUNDS" >&2
	exit 2
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="" rounds="" flat=1
for a in "$@"; do
	case $a in
	--out=*) out=${a#*=} ;;
	--no-flat) flat=0 ;;
	-h | --help)
		sed -n '4,37p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	-*) usage "unknown option $a" ;;
	*) [ -z "$rounds" ] || usage "one ROUNDS only"; rounds=$a ;;
	esac
done
case $rounds in
'' | *[!0-9]*) usage "ROUNDS must be a whole number" ;;
esac
[ "$rounds" -ge 20 ] || usage "ROUNDS must be at least 20 (the last 6 rounds have no deaths)"

mpbench=${MPBENCH:-}
if [ -z "$mpbench" ]; then
	build=${BUILD:-$root/build}
	if [ ! -x "$build/tools/mpbench" ]; then
		# shellcheck source=tools/setup.sh
		source "$root/tools/setup.sh"
		mp_configure "$build" -Dbuildtype=release
	fi
	mpbench=$build/tools/mpbench
fi
[ -x "$mpbench" ] || usage "no mpbench at $mpbench"

keep_out=1
if [ -z "$out" ]; then
	out=$(mktemp -d /tmp/soak.XXXXXX) || exit 1
	keep_out=0
fi
mkdir -p "$out/logs" || exit 1
every=$((rounds / 10))
# The baseline: round ROUNDS/10 (100 of 1000), but not before round 50: in
# their first tens of rounds the peers' heaps, connection tables and DHT
# nodes grow to their working size (measured: 10 to 17 MB by round 40).
from=$((every > 50 ? every : 50))
[ "$from" -lt "$rounds" ] || from=$every
limit=${SOAK_TIMEOUT:-$((30 + 2 * rounds))}

echo "$prog: 16 peers, 4 kept, 0.8 deaths per round, $rounds rounds, sampled every $every (at most ${limit}s)"
t0=$(date +%s)
# The control plane's timeouts of the suite's churn tests (tests/integration
# /meson.build): a dead groupmate costs a round about a second, not 10.
env MP_MATCHMAKING_MS=3000 MP_REQUEST_TIMEOUT_MS=1000 MP_RECORD_TTL_MS=3000 \
	MP_JOIN_TIMEOUT_MS=20000 MP_CHUNK_TIMEOUT_MS=1000 MP_CONNECT_TIMEOUT_MS=2000 \
	MP_ALLREDUCE_TIMEOUT_MS=10000 MP_DEBUG=NONE MP_DHT_REWELCOME=1 \
	timeout -k 10 "$limit" "$mpbench" --churn=0.0667 --churn-catchup=1 --keep=4 --peers=16 --grid=4x4 \
	--rounds="$rounds" --sample="$every" -e 64K -n 1 -w 0 --compute-ms=0 \
	--logs="$out/logs" --json="$out/soak.json" >"$out/mpbench.out" 2>"$out/mpbench.err"
rc=$?
t1=$(date +%s)

fail=0
bad() {
	echo "FAIL: $*"
	fail=1
}
case $rc in
0) ;;
124 | 137) bad "the run did not end within ${limit}s (a hang)" ;;
*) bad "mpbench exited $rc: $(tail -n 3 "$out/mpbench.err")" ;;
esac
wrong=$(sed -n 's/^# Out of bounds values : \([0-9]*\).*/\1/p' "$out/mpbench.out")
incons=$(sed -n 's/^# Log inconsistencies : \([0-9]*\).*/\1/p' "$out/mpbench.out")
[ "${wrong:-x}" = 0 ] || bad "wrong elements: ${wrong:-not reported}"
[ "${incons:-x}" = 0 ] || bad "log inconsistencies: ${incons:-not reported}"
lost=$(sed -n 's/.*"peers_lost": \([0-9]*\).*/\1/p' "$out/soak.json" | head -n 1)
joined=$(sed -n 's/.*"peers_joined": \([0-9]*\).*/\1/p' "$out/soak.json" | head -n 1)

# The kept peers' first sample at or after round ROUNDS/10 against their last.
awk -v from="$from" -v judge="$flat" '
/^# sample round / {
	r = $4 + 0; p = $6 + 0
	if (p > 3) next
	if (!(p in r0) && r >= from) { r0[p] = r; m0[p] = $10; f0[p] = $12; t0[p] = $14 }
	r1[p] = r; m1[p] = $10; f1[p] = $12; t1[p] = $14
}
END {
	printf "%-5s %-13s %-22s %-18s %-12s\n", "peer", "rounds", "rss_kb", "fds", "threads"
	bad = 0
	for (p = 0; p < 4; p++) {
		if (!(p in r0) || r1[p] <= r0[p]) {
			printf "%-5d no samples to compare\n", p; bad = 1; continue
		}
		dm = (m1[p] - m0[p]) / m0[p]; df = (f1[p] - f0[p]) / f0[p]
		ok = (dm <= 0.10 && dm >= -0.10 && df <= 0.10 && df >= -0.10 && t1[p] == t0[p])
		printf "%-5d %5d-%-7d %7d -> %7d %+5.1f%%  %4d -> %4d %+5.1f%%  %3d -> %3d  %s\n",
			p, r0[p], r1[p], m0[p], m1[p], 100 * dm, f0[p], f1[p], 100 * df, t0[p], t1[p],
			ok ? "flat" : "GROWS"
		if (!ok && judge) bad = 1
	}
	exit bad
}' "$out/mpbench.out" || bad "a kept peer's memory, descriptors or threads are not flat (table above)"

# Connection state for peers that left (judged in every run, --no-flat
# too): at the end a kept peer may hold state only for the peers of the
# run (16 live at once; replacements whose predecessors' records have not
# expired yet may double that), not for the hundreds it has known.
held_max=32
awk -v max="$held_max" '
/^# state peer / {
	p = $4 + 0; if (p > 3) next
	seen[p] = 1; known = $9 + 0; held = $11 + 0
	printf "peer %d at the end: peers known %d, connection state held for %d\n", p, known, held
	if (held > max) bad = 1
}
END {
	for (p = 0; p < 4; p++) if (!(p in seen)) { printf "peer %d: no end state reported\n", p; bad = 1 }
	exit bad
}' "$out/mpbench.out" || bad "a kept peer holds connection state for peers that left (more than $held_max)"

echo "$prog: $rounds rounds in $((t1 - t0)) s; peers lost ${lost:-?}, joined ${joined:-?}; wrong ${wrong:-?}, log inconsistencies ${incons:-?}"
if [ $fail -eq 0 ]; then
	echo "PASS"
	[ $keep_out = 1 ] || rm -rf "$out"
else
	echo "$prog: output kept in $out"
fi
exit $fail
