#!/usr/bin/env bash
# The WAN test bed leaves nothing behind (tools/wan_bed.sh, doc/wan.md):
# after `down`; after a run killed with SIGKILL, once `down ID` has run for
# its pid; after a run sent SIGTERM (the trap alone), also while it is still
# making the bed; after a command that fails; after an `up` that fails
# midway. "Nothing" is checked here, not by
# the script's own wan_leftovers: no namespace mpw-ID-*, no link mpwIDh* or
# mpwbID, no qdisc on them, no process that ran in the bed's namespaces
# (the nfq_delay helpers when it is built), no /run/mpw-ID.
#   wan_cleanup.sh WAN_BED_SH [NFQ_DELAY]
# Skips (77) without root or namespaces; without nfq_delay, iptables or
# NFQUEUE the beds have no delay (and so no helpers), and it says so.
set -u
bed=$1
nfq=${2:-}
. "$(dirname "$(readlink -f "$0")")/wan_common.sh"
wan_need_bed
delay=()
if (wan_need_delay "$nfq" >/dev/null); then
	delay=(--delay=5ms --nfq="$nfq")
else
	echo "note: $(wan_need_delay "$nfq") - beds without delay helpers"
fi
rc=0
fail() {
	echo "FAIL: $*"
	rc=1
}
# pids_of ID: every process in bed ID's namespaces.
pids_of() {
	local ns
	for ns in $(ip netns list | awk -v pre="mpw-$1-" 'index($1, pre) == 1 { print $1 }'); do
		ip netns pids "$ns"
	done
}
# present ID: what of bed ID exists, one word per thing.
present() {
	ip netns list | awk -v pre="mpw-$1-" 'index($1, pre) == 1 { print "netns:" $1 }'
	ip -o link show | awk -F': ' -v a="mpw$1h" -v b="mpwb$1" \
		'{ sub(/@.*/, "", $2) } index($2, a) == 1 || $2 == b { print "link:" $2 }'
	tc qdisc show | grep -Eo "dev (mpw$1h[0-9]+|mpwb$1) " | sed 's/^dev /qdisc:/'
	[ -e "/run/mpw-$1" ] && echo "state:/run/mpw-$1"
}
# expect_up ID PEERS: the bed is all there (so that "gone" means something).
expect_up() {
	local n
	n=$(present "$1" | grep -c '^netns:')
	[ "$n" = "$2" ] || fail "bed $1 has $n namespaces, not $2"
	n=$(present "$1" | grep -c '^link:')
	[ "$n" = $(($2 + 1)) ] || fail "bed $1 has $n host links, not $(($2 + 1))"
	for ((i = 0; i < $2; i++)); do
		tc -n "mpw-$1-$i" qdisc show dev wan0 | grep -q '^qdisc tbf' || fail "mpw-$1-$i has no tbf"
	done
	if [ ${#delay[@]} -gt 0 ]; then
		n=$(pids_of "$1" | wc -l)
		[ "$n" -ge "$2" ] || fail "bed $1 has $n helper processes, not $2"
	fi
}
# expect_gone ID PIDS...: nothing of bed ID is left, none of PIDS runs.
expect_gone() {
	local id=$1 p left
	shift
	left=$(present "$id" | tr '\n' ' ')
	for p in $(printf '%s\n' "$@" | sort -u); do
		# A zombie (its parent was killed; init reaps it when it gets to
		# it) holds no namespace and runs nothing.
		s=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f1)
		[ -n "$s" ] && [ "$s" != Z ] && left+="pid:$p($(cat /proc/"$p"/comm 2>/dev/null)) "
	done
	if [ -n "$left" ]; then
		fail "$what: left behind: $left"
	else
		echo "ok: $what: nothing left"
	fi
}
# wait_bed PID PEERS: up to 10 s for bed PID to be complete.
wait_bed() {
	local t
	for ((t = 0; t < 200; t++)); do
		# Complete when the command runs: the bed was made before it
		# (up's own waits are sleeps too, but shorter ones).
		[ -n "$(pgrep -P "$1" -fx 'sleep 30')" ] && return 0
		sleep 0.05
	done
	return 1
}

# 1. up, then down.
what="up then down"
id=$("$bed" up --peers=3 --rate=1gbit "${delay[@]}") || { echo "FAIL: up"; exit 1; }
expect_up "$id" 3
pids=$(pids_of "$id")
"$bed" down "$id" 2>/dev/null || fail "down $id failed"
expect_gone "$id" $pids

# 2. SIGKILL: the trap cannot run; everything stays until `down PID`.
what="SIGKILL, then down"
"$bed" run --peers=2 --rate=100mbit "${delay[@]}" -- sleep 30 &
pid=$!
wait_bed "$pid" 2 || fail "run $pid: no bed after 10 s"
expect_up "$pid" 2
pids="$(pids_of "$pid") $(pgrep -P "$pid")"
kill -KILL "$pid"
wait "$pid" 2>/dev/null
[ -n "$(present "$pid")" ] || fail "SIGKILL: the bed vanished by itself (the test proves nothing)"
"$bed" down "$pid" 2>/dev/null || fail "down $pid failed"
# The run's command (sleep) outlives it too; it is ours to end.
# shellcheck disable=SC2046 # one pid a word
kill $(for p in $pids; do [ "$(cat /proc/"$p"/comm 2>/dev/null)" = sleep ] && echo "$p"; done) 2>/dev/null
expect_gone "$pid" $pids

# 3. SIGTERM: the trap removes everything; the run ends with 143.
what="SIGTERM"
"$bed" run --peers=2 --rate=100mbit "${delay[@]}" -- sleep 30 &
pid=$!
wait_bed "$pid" 2 || fail "run $pid: no bed after 10 s"
expect_up "$pid" 2
pids=$(pids_of "$pid")
t0=$(date +%s%N)
kill -TERM "$pid"
wait "$pid"
st=$?
echo "SIGTERM: run exited $st after $((($(date +%s%N) - t0) / 1000000)) ms"
[ "$st" = 143 ] || fail "SIGTERM: exit status $st, not 143"
expect_gone "$pid" $pids

# 4. SIGTERM while up is still making the bed (after its first namespace).
what="SIGTERM during up"
"$bed" run --peers=6 --rate=100mbit "${delay[@]}" -- sleep 30 &
pid=$!
for ((t = 0; t < 200; t++)); do
	ip netns list | grep -q "^mpw-$pid-0" && break
	sleep 0.02
done
n=$(present "$pid" | grep -c '^netns:')
kill -TERM "$pid"
wait "$pid"
st=$?
echo "SIGTERM during up: with $n of 6 namespaces made, run exited $st"
[ "$n" -ge 1 ] && [ "$n" -lt 6 ] || echo "note: SIGTERM during up: $n of 6 namespaces were made (not midway; still checked)"
[ "$st" = 143 ] || fail "SIGTERM during up: exit status $st, not 143"
expect_gone "$pid" $(pgrep -P "$pid")

# 5. A command that fails: its status, and nothing left.
what="failing command"
"$bed" run --peers=2 --rate=100mbit "${delay[@]}" -- sh -c 'exit 3' &
pid=$!
wait "$pid"
st=$?
[ "$st" = 3 ] || fail "failing command: exit status $st, not 3"
expect_gone "$pid"

# 6. up failing midway (tc refuses the latency after the namespaces exist).
what="up failing midway"
"$bed" up --peers=2 --rate=100mbit --latency=bogus --id=$$ >/dev/null 2>&1 && fail "up with --latency=bogus succeeded"
expect_gone "$$"
exit $rc
