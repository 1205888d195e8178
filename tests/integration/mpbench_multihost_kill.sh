#!/bin/sh
# Multi-host mpbench (one process per rank over MP_PEERS, as bench_wan.sh
# --kill runs it) after a peer dies: every survivor's last result is checked
# against the exact weighted mean of the peers it still counts as live.
#   mpbench_multihost_kill.sh MPBENCH
# 4 ranks, butterfly, rank 3 killed by MP_FAULT in the scatter of round 20
# of 40 (--sync=0: one round per iteration), once at 1M and once at 4K (the
# direct exchange). Every survivor must print its survivors' check: 3 live
# peers, rank 3 down, 3 contributions, no wrong element; and (as before)
# fail the all-4 check, since rank 3's values are missing from the result.
mpbench=$1
tmp=$(mktemp -d /tmp/mpbench_mhkill.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
# Fixed ports, below the kernel's ephemeral range (32768 and up here): a
# base up to 39999 collided now and then with the local port of a
# connection (rank 1: "Address already in use", ASan suite). 12 are used.
lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "$lo" -gt 20100 ] 2>/dev/null || lo=32768
base=$((20000 + $$ % (lo - 20000 - 12)))

run() { # run TAG SIZE
	list="" i=0
	while [ $i -lt 4 ]; do
		list="$list${list:+,}127.0.0.1:$((base + i))"
		i=$((i + 1))
	done
	base=$((base + 4))
	i=0
	while [ $i -lt 4 ]; do
		fault=""
		[ $i -eq 3 ] && fault=kill:round=20:phase=scatter
		MP_FAULT=$fault MP_PEERS=$list timeout 60 "$mpbench" --rank=$i --algo=butterfly \
			-b "$2" -e "$2" -n 40 -w 0 --sync=0 --timeout=3000 --run="mhkill-$1-$$" \
			>"$tmp/$1.$i" 2>&1 &
		i=$((i + 1))
	done
	wait
	for i in 0 1 2; do
		line=$(grep "survivors' check" "$tmp/$1.$i")
		want="mpbench: rank $i: survivors' check, $(($(echo "$2" | sed 's/K/*1024/;s/M/*1048576/'))) B, last iteration: 3 live peers (down: 3), 3 contributions reached the result, wrong 0 of"
		case $line in
		"$want"*) ;;
		*) echo "FAIL: $1, rank $i: want \"$want ...\", got \"$line\""; tail -n 5 "$tmp/$1.$i"; fail=1 ;;
		esac
		grep -q "value(s) out of bounds" "$tmp/$1.$i" ||
			{ echo "FAIL: $1, rank $i: the all-4 check did not miss rank 3's values"; fail=1; }
	done
	grep -q "survivors' check" "$tmp/$1.3" && { echo "FAIL: $1: rank 3 lived to check"; fail=1; }
}
# --dead: a rank that will die is left out of the check even where no
# survivor saw it fail. Nothing is killed here, so the 3 ranks' results
# are the all-4 mean and miss the survivors' mean of ranks 0-2.
list=127.0.0.1:$base,127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2)),127.0.0.1:$((base + 3))
MP_PEERS=$list timeout 20 "$mpbench" --rank=3 --dead=3 -b 64K -e 64K >"$tmp/self" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "rank 3: --dead=3: rank 3 is this process" "$tmp/self" ||
	{ echo "FAIL: rank 3 --dead=3 exited $rc: $(tail -n 2 "$tmp/self")"; fail=1; }
for i in 0 1 2 3; do
	dead=--dead=3
	[ $i -eq 3 ] && dead=
	MP_PEERS=$list timeout 60 "$mpbench" --rank=$i --algo=butterfly -b 64K -e 64K -n 2 -w 0 \
		$dead --run="mhkill-dead-$$" >"$tmp/dead.$i" 2>&1 &
done
wait
for i in 0 1 2; do
	grep -q "mpbench: rank $i: survivors' check, 65536 B, last iteration: 3 live peers (down: 3), [0-9]* contributions reached the result, wrong [1-9]" "$tmp/dead.$i" ||
		{ echo "FAIL: --dead=3, rank $i: $(grep "survivors'" "$tmp/dead.$i" || tail -n 3 "$tmp/dead.$i")"; fail=1; }
done
run big 1M
run small 4K
[ $fail -eq 0 ] && echo "PASS: survivors hold the exact mean of the live peers (1M, 4K)"
exit $fail
