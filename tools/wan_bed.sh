#!/usr/bin/env bash
# wan_bed.sh: a WAN test bed on one machine (root): N network namespaces on a
# bridge, each peer's uplink shaped with tbf and, optionally, a one-way delay
# from nfq_delay (NFQUEUE; the kernel may have no netem). doc/wan.md.
#
#   wan_bed.sh up [options]           create a bed; prints its ID
#   wan_bed.sh down ID                remove everything bed ID made
#   wan_bed.sh exec ID I CMD...       run CMD in peer I's namespace
#   wan_bed.sh run [options] -- CMD   up, run CMD, down (also on failure,
#                                     SIGINT or SIGTERM); CMD sees WAN_ID,
#                                     WAN_PEERS and WAN_BED (this script)
#   wan_bed.sh list                   beds whose namespaces exist
# Options of up and run:
#   --peers=N (2)        namespaces mpw-ID-0 .. mpw-ID-(N-1), addresses
#                        10.77.0.1 .. 10.77.0.N/24 on interface wan0
#   --rate=R (1gbit)     tbf on each wan0's egress (tc units: kbit, mbit, gbit)
#   --burst=B            tbf burst in bytes (default max(1 ms at R, 128 KiB):
#                        at least one 64 KiB GSO packet, so tbf never splits one)
#   --latency=L (50ms)   tbf queue, as time at R
#   --delay=D (0)        one-way delay added to every packet a peer receives
#   --delay-at=ingress   where: ingress (mangle PREROUTING -i wan0, default)
#                        or egress (mangle POSTROUTING -o wan0; see doc/wan.md:
#                        TCP small queues then cap a stream at bytes/delay)
#   --nfq=PATH           nfq_delay (default: $NFQ_DELAY, build/tools/nfq_delay
#                        beside this script's tree, then PATH)
#   --id=ID              name (default: the pid of the process that runs up)
#
# Every name carries ID (namespaces mpw-ID-I, bridge mpwbID, host-side veths
# mpwIDhI, state in /run/mpw-ID), so beds of different processes cannot
# collide; up refuses an ID that is in use. Nothing else on the host is
# changed: no host interface, address, route, sysctl or iptables rule.
# Inside each namespace: IPv6 off (no stray solicitations in a
# measurement) and TCP buffers up to 32 MiB, as a host tuned for a long fat
# path would have (4 MiB of send buffer holds less than 2 x the 2.5 MB that
# 1 Gbit/s x 20 ms keeps in flight).
# The script can also be sourced: wan_up (sets WAN_ID and a trap that calls
# wan_down), wan_down, wan_exec, wan_ns.

_wan_self=$(readlink -f "${BASH_SOURCE[0]}")
_wan_top=$(cd "$(dirname "$_wan_self")/.." && pwd)

_wan_die() {
	echo "wan_bed: $*" >&2
	return 1
}

wan_ns() { echo "mpw-$1-$2"; }

# "100mbit" -> bits per second (tc's SI units), or fail.
_wan_rate_bps() {
	local r=${1,,} n u
	[[ $r =~ ^([0-9]+)(bit|kbit|mbit|gbit|tbit)?$ ]] || return 1
	n=${BASH_REMATCH[1]}
	u=${BASH_REMATCH[2]:-bit}
	case $u in
	bit) echo "$n" ;;
	kbit) echo $((n * 1000)) ;;
	mbit) echo $((n * 1000000)) ;;
	gbit) echo $((n * 1000000000)) ;;
	tbit) echo $((n * 1000000000000)) ;;
	esac
}

_wan_find_nfq() {
	if [ -n "${1:-}" ]; then
		echo "$1"
	elif [ -n "${NFQ_DELAY:-}" ]; then
		echo "$NFQ_DELAY"
	elif [ -x "$_wan_top/build/tools/nfq_delay" ]; then
		echo "$_wan_top/build/tools/nfq_delay"
	else
		command -v nfq_delay
	fi
}

# wan_up [options]: create a bed; sets WAN_ID and WAN_PEERS. Fails (after
# removing what it made) when any step fails.
wan_up() {
	local peers=2 rate=1gbit burst="" latency=50ms delay=0 at=ingress nfq="" id=$$ a
	for a in "$@"; do
		case $a in
		--peers=*) peers=${a#*=} ;;
		--rate=*) rate=${a#*=} ;;
		--burst=*) burst=${a#*=} ;;
		--latency=*) latency=${a#*=} ;;
		--delay=*) delay=${a#*=} ;;
		--delay-at=*) at=${a#*=} ;;
		--nfq=*) nfq=${a#*=} ;;
		--id=*) id=${a#*=} ;;
		*) _wan_die "unknown option '$a'" || return ;;
		esac
	done
	[ "$(id -u)" -eq 0 ] || { _wan_die "needs root (namespaces, veths, tc)" || return; }
	[[ $id =~ ^[0-9]{1,7}$ ]] || { _wan_die "--id must be 1-7 digits (interface names are 15 bytes)" || return; }
	[[ $peers =~ ^[0-9]+$ ]] && [ "$peers" -ge 1 ] && [ "$peers" -le 99 ] ||
		{ _wan_die "--peers must be 1..99" || return; }
	local bps
	bps=$(_wan_rate_bps "$rate") || { _wan_die "bad --rate '$rate' (e.g. 100mbit, 1gbit)" || return; }
	[ -n "$burst" ] || { burst=$((bps / 8 / 1000)); [ "$burst" -ge 131072 ] || burst=131072; }
	case $at in ingress | egress) ;; *) _wan_die "--delay-at is ingress or egress" || return ;; esac
	local delayed=0
	if [ "$delay" != 0 ] && [ "$delay" != 0ms ]; then
		delayed=1
		nfq=$(_wan_find_nfq "$nfq") && [ -x "$nfq" ] ||
			{ _wan_die "--delay needs nfq_delay (build it: libnetfilter-queue-dev; or --nfq=PATH)" || return; }
		command -v iptables >/dev/null || { _wan_die "--delay needs iptables" || return; }
	fi
	local st=/run/mpw-$id
	# mkdir claims the ID atomically: of two ups with one ID, one fails here.
	if ip link show "mpwb$id" >/dev/null 2>&1 || ip netns list | grep -q "^mpw-$id-" ||
		! mkdir "$st" 2>/dev/null; then
		_wan_die "bed $id is in use or $st cannot be made (run: $_wan_self down $id)" || return
	fi
	WAN_ID=$id
	# The trap path, before anything is made: an up interrupted by SIGINT
	# or SIGTERM removes what it made. Sourced (or run), any exit of the
	# shell removes the bed too; the up subcommand leaves it for down.
	trap '_wan_trap_exit; exit 130' INT
	trap '_wan_trap_exit; exit 143' TERM
	[ "${_wan_no_trap:-0}" = 1 ] || trap '_wan_trap_exit' EXIT
	printf '%s\n' "peers=$peers" "rate=$rate" "burst=$burst" "latency=$latency" "delay=$delay" \
		"delay_at=$at" >"$st/config"
	WAN_PEERS=$peers
	local br=mpwb$id i ns
	if ! {
		ip link add "$br" type bridge &&
			ip link set "$br" up
	}; then
		_wan_abort "$id"
		_wan_die "cannot create bridge $br" || return
	fi
	for ((i = 0; i < peers; i++)); do
		ns=mpw-$id-$i
		if ! {
			ip netns add "$ns" &&
				ip link add "mpw${id}h$i" type veth peer name wan0 netns "$ns" &&
				ip link set "mpw${id}h$i" master "$br" &&
				ip link set "mpw${id}h$i" up &&
				ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
					net.ipv4.tcp_rmem="4096 131072 33554432" \
					net.ipv4.tcp_wmem="4096 16384 33554432" &&
				ip -n "$ns" link set lo up &&
				ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev wan0 &&
				ip -n "$ns" link set wan0 up &&
				tc -n "$ns" qdisc add dev wan0 root tbf rate "$rate" burst "$burst" latency "$latency"
		}; then
			_wan_abort "$id"
			_wan_die "cannot set up $ns" || return
		fi
		if [ "$delayed" = 1 ]; then
			# The helper first, then the rule: a queue nobody has bound
			# drops what reaches it. No --queue-bypass: a dead helper
			# stops the traffic rather than silently dropping the delay.
			ip netns exec "$ns" "$nfq" --queue=0 --delay="$delay" >"$st/nfq.$i.log" 2>&1 &
			echo $! >"$st/nfq.$i.pid"
			local t
			for ((t = 0; t < 100; t++)); do
				grep -q ' bound' "$st/nfq.$i.log" 2>/dev/null && break
				kill -0 "$(cat "$st/nfq.$i.pid")" 2>/dev/null || break
				sleep 0.05
			done
			local rule=(-t mangle -A PREROUTING -i wan0)
			[ "$at" = egress ] && rule=(-t mangle -A POSTROUTING -o wan0)
			if ! grep -q ' bound' "$st/nfq.$i.log" ||
				! ip netns exec "$ns" iptables "${rule[@]}" -j NFQUEUE --queue-num 0; then
				cat "$st/nfq.$i.log" >&2
				_wan_abort "$id"
				_wan_die "cannot start the delay in $ns" || return
			fi
		fi
	done
	if [ "${_wan_no_trap:-0}" = 1 ]; then
		trap - INT TERM
	fi
	return 0
}

# A failed up: remove what it made, and leave the trap nothing to do.
_wan_abort() {
	WAN_ID=""
	wan_down "$1"
}

_wan_trap_exit() {
	if [ -n "${WAN_ID:-}" ]; then
		local id=$WAN_ID
		WAN_ID=""
		[ -n "${_wan_child:-}" ] && kill -TERM "$_wan_child" 2>/dev/null
		wan_down "$id"
	fi
}

# Is pid $1 alive and the program $2 (a reused pid is left alone)?
_wan_is() { [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]; }

# wan_down ID: remove the bed's namespaces (and every process in them), its
# bridge and veths (their qdiscs go with them) and state. Prints the
# helpers' exit counters. Fails if anything is left.
wan_down() {
	local id=$1 st=/run/mpw-$1 ns p f t left
	[[ $id =~ ^[0-9]{1,7}$ ]] || { _wan_die "down: bad ID '$id'" || return; }
	# Helpers first, with SIGTERM, so that they print their counters.
	for f in "$st"/nfq.*.pid; do
		[ -f "$f" ] || continue
		p=$(cat "$f")
		_wan_is "$p" nfq_delay && kill -TERM "$p" 2>/dev/null
	done
	local nss
	nss=$(ip netns list 2>/dev/null | awk -v pre="mpw-$id-" 'index($1, pre) == 1 { print $1 }')
	for ns in $nss; do
		for p in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$p" 2>/dev/null; done
	done
	for ((t = 0; t < 40; t++)); do
		left=""
		for ns in $nss; do left+=$(ip netns pids "$ns" 2>/dev/null); done
		[ -z "$left" ] && break
		sleep 0.05
	done
	for ns in $nss; do
		for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
	done
	for f in "$st"/nfq.*.log; do
		[ -f "$f" ] && grep -h 'nfq_delay: queue=' "$f" | sed "s/^/wan_bed $id peer ${f##*/nfq.}: /; s/\.log: / /" >&2
	done
	for ns in $nss; do ip netns del "$ns" 2>/dev/null; done
	# A veth goes with its namespace; one left (a namespace still pinned)
	# is deleted here, and so is the bridge.
	for ((t = 0; t < 40; t++)); do
		left=$(ip -o link show 2>/dev/null | awk -F': ' -v pre="mpw${id}h" '{ sub(/@.*/, "", $2) } index($2, pre) == 1 { print $2 }')
		[ -z "$left" ] && break
		for f in $left; do ip link del "$f" 2>/dev/null; done
		sleep 0.05
	done
	ip link del "mpwb$id" 2>/dev/null
	rm -rf "$st"
	left=$(wan_leftovers "$id")
	if [ -n "$left" ]; then
		_wan_die "down $id: left behind: $left"
		return 1
	fi
	return 0
}

# wan_leftovers ID: what of bed ID still exists (namespaces, links, qdiscs,
# helper processes, state); empty when nothing.
wan_leftovers() {
	local id=$1 out="" p
	out+=$(ip netns list 2>/dev/null | awk -v pre="mpw-$id-" 'index($1, pre) == 1 { printf "netns:%s ", $1 }')
	out+=$(ip -o link show 2>/dev/null | awk -F': ' -v a="mpw${id}h" -v b="mpwb$id" \
		'{ sub(/@.*/, "", $2) } index($2, a) == 1 || $2 == b { printf "link:%s ", $2 }')
	out+=$(tc qdisc show 2>/dev/null | awk -v a="mpw${id}h" -v b="mpwb$id" \
		'{ for (i = 1; i < NF; i++) if ($i == "dev" && (index($(i+1), a) == 1 || $(i+1) == b)) printf "qdisc:%s ", $(i+1) }')
	for p in $(pgrep -x nfq_delay 2>/dev/null); do
		# A helper of this bed: it runs in one of its namespaces (gone or
		# not), so look at its state file and its command line.
		if grep -qx "$p" /run/mpw-"$id"/nfq.*.pid 2>/dev/null; then
			out+="nfq_delay:$p "
		fi
	done
	[ -e "/run/mpw-$id" ] && out+="state:/run/mpw-$id "
	printf '%s' "$out"
}

wan_exec() {
	local id=$1 i=$2
	shift 2
	ip netns exec "mpw-$id-$i" "$@"
}

# Executed rather than sourced: subcommands.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -u
	cmd=${1:-}
	[ $# -gt 0 ] && shift
	case $cmd in
	up)
		_wan_no_trap=1 wan_up "$@" || exit 1
		echo "$WAN_ID"
		;;
	down)
		[ $# -eq 1 ] || { echo "usage: wan_bed.sh down ID" >&2; exit 2; }
		wan_down "$1"
		;;
	exec)
		[ $# -ge 3 ] || { echo "usage: wan_bed.sh exec ID I CMD..." >&2; exit 2; }
		wan_exec "$@"
		;;
	run)
		opts=()
		while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
		[ $# -gt 1 ] || { echo "usage: wan_bed.sh run [options] -- CMD..." >&2; exit 2; }
		shift
		wan_up "${opts[@]}" || exit 1
		export WAN_ID WAN_PEERS WAN_BED=$_wan_self
		# In the background and waited for: a trapped signal interrupts
		# wait at once (it would wait for a foreground child to end).
		"$@" &
		_wan_child=$!
		wait "$_wan_child"
		rc=$?
		_wan_child=""
		exit "$rc"
		;;
	list)
		ip netns list | sed -n 's/^mpw-\([0-9]*\)-.*/\1/p' | sort -u
		;;
	*)
		sed -n '2,/^$/s/^# \{0,1\}//p' "$_wan_self" >&2
		exit 2
		;;
	esac
fi
