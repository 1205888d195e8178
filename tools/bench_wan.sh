#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench_wan.sh - all-reduce on slow, long links: mpbench against Gloo and
# OpenMPI on the WAN test bed (tools/wan_bed.sh), doc/wan.md.
#
# Usage: tools/bench_wan.sh [options]        (root)
#
#   --peers=N         peers, one network namespace each (default 8)
#   --rate=LIST       comma-separated tbf rates of every peer's uplink, tc
#                     units (default 1gbit)
#   --delay=LIST      comma-separated one-way delays added at each peer's
#                     ingress by nfq_delay (default 0: none)
#   --sizes=MIN:MAX   message sizes in bytes, K/M/G suffixes (default 4K:64M)
#   --factor=F        size step (default 4)
#   --iters=N         timed iterations per size (default 3)
#   --warmup=N        untimed iterations per size (default 1)
#   --systems=LIST    what to run (default all): ring-none, butterfly-CODEC,
#                     moshpit-CODEC (CODEC: none, fp16, blockwise8, topk),
#                     gloo, openmpi
#   --grid=G          Moshpit's grid (default: 2x2x2 for 8 peers, else a
#                     near-cubic exact factorisation of N)
#   --timeout=S       bound of each system's run on one bed, seconds
#                     (default: from the sizes and the rate)
#   --out=DIR         results (default ./bench_wan-DATE); kept
#   --build=DIR       meson build folder with tools/mpbench (default build/)
#   --kill[=MS]       after the measurements of each bed, a fault run per
#                     system: one size (--kill-size, 16M), iterations for
#                     about 4 x (MS + 3 s) at fp32's pace, 5 s timeouts in mpbench and Gloo; MS (1000) after the
#                     run is under way every process of the last peer's
#                     namespace gets SIGKILL; reports what the survivors
#                     did: exit status and when, or a hang until the run's
#                     bound (--kill-timeout; default 10 x (MS + 3 s), 40 s:
#                     2.5 times the fp32 run's length, so that Moshpit's 1.7
#                     times the ring's bytes still end within it)
#
# For each rate and delay the script makes one bed (wan_bed.sh: namespaces
# mpw-ID-I at 10.77.0.(I+1), tbf, nfq_delay), measures the round trip
# between peers 0 and 1, then runs each system with one process per
# namespace: mpbench in multi-host mode (MP_PEERS, --rank), wan_gloo.py
# (torch.distributed, gloo backend, /usr/bin/python3), and OpenMPI's
# MPI_Allreduce (tools/mpi_allreduce_ref.c, built with mpicc into a
# temporary folder) under mpirun, whose launch agent starts each orted in
# its namespace with `ip netns exec` under host name mpwI (its own UTS
# namespace). Systems whose software is missing are skipped with a message
# (apt-get install python3-torch, openmpi-bin libopenmpi-dev).
#
# Prints, per bed and size, a table: system, time (us), ratio (time over
# OpenMPI's, or Gloo's without OpenMPI), wire bytes per peer, fraction of
# line rate (bytes on the busiest uplink x 8 / rate / time). Writes
# DIR/results.json (everything), DIR/raw/ (each tool's own output and log)
# and, when matplotlib imports, DIR/wan-RATE-DELAY.png (time against size).
# Every run is under `timeout`; the bed and the temporary files are removed
# on exit, also on failure, SIGINT or SIGTERM. Exits 1 if a system failed
# or reported a wrong result, 2 on bad usage.
set -u -o pipefail

prog=bench_wan.sh
die() {
	echo "$prog: $*" >&2
	exit 1
}
usage() {
	echo "$prog: $*" >&2
	echo "usage: $prog [--peers=N] [--rate=LIST] [--delay=LIST] [--sizes=MIN:MAX] [--iters=N] [--out=DIR] ... (--help)" >&2
	exit 2
}

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
py=/usr/bin/python3
peers=8 rates=1gbit delays=0 sizes=4K:64M factor=4 iters=3 warmup=1
systems=all grid="" tlimit="" out="" build=${BUILD:-$root/build}
kill="" kill_size=16M kill_limit=""
for a in "$@"; do
	case $a in
	--peers=*) peers=${a#*=} ;;
	--rate=*) rates=${a#*=} ;;
	--delay=*) delays=${a#*=} ;;
	--sizes=*) sizes=${a#*=} ;;
	--factor=*) factor=${a#*=} ;;
	--iters=*) iters=${a#*=} ;;
	--warmup=*) warmup=${a#*=} ;;
	--systems=*) systems=${a#*=} ;;
	--grid=*) grid=${a#*=} ;;
	--timeout=*) tlimit=${a#*=} ;;
	--out=*) out=${a#*=} ;;
	--build=*) build=${a#*=} ;;
	--kill) kill=1000 ;;
	--kill=*) kill=${a#*=} ;;
	--kill-size=*) kill_size=${a#*=} ;;
	--kill-timeout=*) kill_limit=${a#*=} ;;
	-h | --help)
		sed -n '4,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) usage "unknown option '$a'" ;;
	esac
done

isnum() { [[ $1 =~ ^[0-9]+$ ]]; }
isnum "$peers" && [ "$peers" -ge 2 ] && [ "$peers" -le 99 ] || usage "--peers must be 2..99"
isnum "$iters" && [ "$iters" -ge 1 ] || usage "--iters must be at least 1"
isnum "$warmup" || usage "--warmup must be a number"
isnum "$factor" && [ "$factor" -ge 2 ] || usage "--factor must be at least 2"
[ -z "$tlimit" ] || isnum "$tlimit" || usage "--timeout must be whole seconds"
[ -z "$kill" ] || isnum "$kill" || usage "--kill=MS: milliseconds"
if [ -z "$kill_limit" ]; then
	# The fault run lasts about 4 x (MS + 3 s) at fp32's pace; Moshpit
	# 2x2x2 sends 1.7 times the ring's bytes: room for 2.5 times that.
	kill_limit=$((10 * (${kill:-1000} / 1000 + 3)))
fi
isnum "$kill_limit" && [ "$kill_limit" -ge 1 ] || usage "--kill-timeout must be whole seconds"

# The size grammar of mpbench (K, M, G: powers of 1024; optional B).
tobytes() {
	local s=${1^^} n
	[[ $s =~ ^([0-9]+)([KMG]?)B?$ ]] || return 1
	n=${BASH_REMATCH[1]}
	case ${BASH_REMATCH[2]} in
	K) n=$((n << 10)) ;;
	M) n=$((n << 20)) ;;
	G) n=$((n << 30)) ;;
	esac
	echo "$n"
}
[[ $sizes == *:* ]] || usage "--sizes is MIN:MAX"
minb=$(tobytes "${sizes%%:*}") && maxb=$(tobytes "${sizes#*:}") || usage "bad --sizes '$sizes'"
[ "$minb" -ge 4 ] && [ $((minb % 4)) -eq 0 ] && [ $((maxb % 4)) -eq 0 ] && [ "$minb" -le "$maxb" ] ||
	usage "--sizes: multiples of 4, MIN <= MAX"
kill_size=$(tobytes "$kill_size") && [ $((kill_size % 4)) -eq 0 ] && [ "$kill_size" -gt 0 ] ||
	usage "bad --kill-size"
size_list=() sum_sizes=0
for ((s = minb; s <= maxb; s *= factor)); do
	size_list+=("$s")
	sum_sizes=$((sum_sizes + s))
done

all_systems="ring-none"
for al in butterfly moshpit; do
	for c in none fp16 blockwise8 topk; do all_systems+=" $al-$c"; done
done
all_systems+=" gloo openmpi"
[ "$systems" = all ] && systems=${all_systems// /,}
sys_list=()
IFS=, read -r -a req <<<"$systems"
for s in "${req[@]}"; do
	[[ " $all_systems " == *" $s "* ]] || usage "unknown system '$s' (one of: $all_systems)"
	sys_list+=("$s")
done

if [ -z "$grid" ]; then
	# An exact grid (every cell a peer), so that Moshpit's mean is exact:
	# N's factors spread over up to 3 dimensions, the largest first.
	grid=$($py - "$peers" <<-'PY'
		import sys
		n = int(sys.argv[1])
		f, p = [], 2
		while n > 1:
		    while n % p == 0:
		        f.append(p)
		        n //= p
		    p += 1
		dims = [1, 1, 1]
		for x in sorted(f, reverse=True):
		    dims.sort()
		    dims[0] *= x
		print("x".join(str(d) for d in sorted((d for d in dims if d > 1), reverse=True)) or "1")
	PY
	)
fi

[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, veths, tc)"
mpbench=${MPBENCH:-$build/tools/mpbench}
[ -x "$mpbench" ] || die "mpbench not found at '$mpbench' (build the project, or --build=DIR or MPBENCH=path)"
. "$root/tools/wan_bed.sh"

[ -n "$out" ] || out=$PWD/bench_wan-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out/raw" || die "cannot make '$out'"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_wan.XXXXXX") || die "mktemp failed"

# Cleanup on any exit: our children, then the bed (wan_down also kills
# every process left in its namespaces), then the temporary files.
kids=()
cleanup() {
	local p
	for p in "${kids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	_wan_trap_exit
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

has() { [[ " ${sys_list[*]} " == *" $1 "* ]]; }
if has gloo && ! timeout 60 "$py" -c 'import torch.distributed' 2>/dev/null; then
	echo "$prog: skipping gloo: /usr/bin/python3 cannot import torch.distributed (apt-get install python3-torch)" >&2
	sys_list=("${sys_list[@]/gloo/}")
fi
mpi_ref=""
if has openmpi; then
	if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
		echo "$prog: skipping openmpi: no mpirun/mpicc (MP_WITH_MPI=1 tools/setup.sh, or apt-get install openmpi-bin libopenmpi-dev)" >&2
		sys_list=("${sys_list[@]/openmpi/}")
	elif ! mpicc -std=c11 -O2 -I"$root/src/common" -o "$tmp/mpi_allreduce_ref" \
		"$root/tools/mpi_allreduce_ref.c" 2>"$tmp/mpicc.log"; then
		cat "$tmp/mpicc.log" >&2
		echo "$prog: skipping openmpi: mpicc failed on tools/mpi_allreduce_ref.c" >&2
		sys_list=("${sys_list[@]/openmpi/}")
	else
		mpi_ref=$tmp/mpi_allreduce_ref
	fi
fi

sizes_csv=$(IFS=,; echo "${size_list[*]}")
failed=0
port=30000

# reap ID: kill whatever is left in the bed's namespaces, so that a hung
# or failed system cannot disturb the next one.
reap() {
	local i p
	for ((i = 0; i < peers; i++)); do
		for p in $(ip netns pids "mpw-$1-$i" 2>/dev/null); do
			_wan_is "$p" nfq_delay || kill -KILL "$p" 2>/dev/null
		done
	done
}

# tbf_sent ID: bytes each peer's tbf has sent so far, comma-separated.
tbf_sent() {
	local i v s=""
	for ((i = 0; i < peers; i++)); do
		v=$(tc -n "mpw-$1-$i" -s qdisc show dev wan0 root 2>/dev/null | sed -n 's/^ *Sent \([0-9]*\) bytes.*/\1/p')
		s+=${s:+,}${v:-0}
	done
	echo "$s"
}

# wait_all [KILL_NS KILL_AFTER_MS MARK_FILE MARK]: wait for every pid in
# kids, polling, and write "I rc=N end_ms=T" per kid (T since the launch)
# to $wait_log. With KILL_NS: once MARK appears in MARK_FILE (the run is
# under way) and KILL_AFTER_MS more have passed, SIGKILL every process in
# that namespace (kill_ms: when, since the launch). Returns the first
# non-zero status, else 0.
wait_all() {
	local kns=${1:-} kat=${2:-0} mfile=${3:-} mark=${4:-} mark_ms="" t0 now i r rc=0
	local n=${#kids[@]} done_n=0
	local -a fin=()
	t0=$(date +%s%N)
	kill_ms=""
	: >"${wait_log:=/dev/null}"
	while [ "$done_n" -lt "$n" ]; do
		now=$((($(date +%s%N) - t0) / 1000000))
		if [ -n "$kns" ] && [ -z "$kill_ms" ]; then
			[ -z "$mark_ms" ] && grep -q -- "$mark" "$mfile" 2>/dev/null && mark_ms=$now
			if [ -n "$mark_ms" ] && [ "$now" -ge $((mark_ms + kat)) ]; then
				for r in $(ip netns pids "$kns" 2>/dev/null); do
					_wan_is "$r" nfq_delay || kill -KILL "$r" 2>/dev/null
				done
				kill_ms=$now
			fi
		fi
		for ((i = 0; i < n; i++)); do
			[ -z "${fin[i]:-}" ] || continue
			kill -0 "${kids[i]}" 2>/dev/null && continue
			wait "${kids[i]}"
			r=$?
			fin[i]=1
			done_n=$((done_n + 1))
			echo "$i rc=$r end_ms=$now" >>"$wait_log"
			[ $rc -ne 0 ] || rc=$r
		done
		[ "$done_n" -lt "$n" ] && sleep 0.05
	done
	kids=()
	return $rc
}

# run_system ID DIR SYSTEM LIMIT: one system on bed ID over the sizes
# r_minb..r_maxb (r_sizes: the list) with r_iters and r_warmup, mpbench's
# timeouts r_ms; with r_kill_ns (a namespace), SIGKILL that peer r_kill_ms
# after the run is under way (see wait_all).
# Its output in DIR/SYSTEM.*, a status line in DIR/status.
run_system() {
	local id=$1 dir=$2 sys=$3 limit=$4 i rc t0 t1 before after dead
	port=$((port + 1))
	before=$(tbf_sent "$id")
	wait_log=$dir/$sys.ends
	t0=$(date +%s%N)
	case $sys in
	ring-* | butterfly-* | moshpit-*)
		local algo=${sys%%-*} codec=${sys#*-} list="" gridopt=()
		for ((i = 0; i < peers; i++)); do list+=${list:+,}10.77.0.$((i + 1)):$port; done
		[ "$algo" = moshpit ] && gridopt=(--grid="$grid")
		for ((i = 0; i < peers; i++)); do
			# A fault run: the survivors also check their last result
			# against the mean of the others, also those that never
			# met the dead peer.
			dead=()
			[ -n "$r_kill_ns" ] && [ "$i" -ne $((peers - 1)) ] && dead=(--dead=$((peers - 1)))
			MP_PEERS=$list timeout -k 2 "$limit" ip netns exec "mpw-$id-$i" "$mpbench" --rank="$i" \
				--algo="$algo" --codec="$codec" "${gridopt[@]}" "${dead[@]}" -b "$r_minb" -e "$r_maxb" -f "$factor" \
				-n "$r_iters" -w "$r_warmup" --run="bench-wan-$$" --timeout="$r_ms" \
				--json="$dir/$sys.json" >"$dir/$sys.$i.log" 2>&1 &
			kids+=($!)
		done
		wait_all "$r_kill_ns" "$r_kill_ms" "$dir/$sys.0.log" "mpbench: size"
		rc=$?
		;;
	gloo)
		for ((i = 0; i < peers; i++)); do
			timeout -k 2 "$((limit + 60))" ip netns exec "mpw-$id-$i" "$py" "$root/tools/wan_gloo.py" \
				--rank="$i" --world="$peers" --master="10.77.0.1:$port" --sizes="$r_sizes" \
				--iters="$r_iters" --warmup="$r_warmup" --timeout="$((r_ms / 1000))" \
				--json="$dir/gloo.json" >"$dir/gloo.$i.log" 2>&1 &
			kids+=($!)
		done
		wait_all "$r_kill_ns" "$r_kill_ms" "$dir/gloo.0.log" "connected"
		rc=$?
		;;
	openmpi)
		# mpirun in peer 0's namespace as host mpw0; the agent starts
		# the orted of host mpwI in namespace I as host mpwI (a UTS
		# namespace of its own: OpenMPI tells nodes apart by name).
		local agent=$tmp/mpi_agent.sh hosts=$tmp/mpi_hosts
		cat >"$agent" <<-EOF
			#!/bin/sh
			# mpirun's launch agent (in place of ssh): HOST COMMAND...
			host=\$1
			shift
			case \$host in
			mpw[0-9]*) i=\${host#mpw} ;;
			*) echo "mpi_agent: unknown host '\$host'" >&2; exit 1 ;;
			esac
			exec ip netns exec "mpw-$id-\$i" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' "\$host" "\$*"
		EOF
		chmod +x "$agent"
		for ((i = 0; i < peers; i++)); do echo "mpw$i slots=1"; done >"$hosts"
		timeout -k 2 "$limit" ip netns exec "mpw-$id-0" unshare --uts sh -c 'hostname mpw0 && exec "$@"' sh \
			mpirun --allow-run-as-root -np "$peers" --hostfile "$hosts" --map-by node \
			--mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 \
			--mca mpi_yield_when_idle 1 --mca oob_tcp_if_include wan0 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include wan0 \
			"$mpi_ref" -b "$r_minb" -e "$r_maxb" -f "$factor" -n "$r_iters" -w "$r_warmup" \
			>"$dir/openmpi.txt" 2>"$dir/openmpi.log" &
		kids+=($!)
		wait_all "$r_kill_ns" "$r_kill_ms" "$dir/openmpi.txt" "^# mpi_allreduce_ref"
		rc=$?
		;;
	esac
	t1=$(date +%s%N)
	local ms_took=$(((t1 - t0) / 1000000)) took
	took=$(printf "%d.%03d" $((ms_took / 1000)) $((ms_took % 1000)))
	after=$(tbf_sent "$id")
	reap "$id"
	echo "$sys rc=$rc seconds=$took tbf_before=$before tbf_after=$after kill_ms=${kill_ms:-}" \
		"ends=$(sed 's/ rc=/:/; s/ end_ms=/:/' "$wait_log" | paste -sd,)" >>"$dir/status"
	[ -z "$r_kill_ns" ] || return 0
	if [ "$rc" -ne 0 ]; then
		failed=1
		echo "$prog: $sys failed (exit status $rc$([ "$rc" -eq 124 ] && echo ", timed out after ${limit}s")); its log:" >&2
		tail -n 5 "$dir/$sys".*log >&2 2>/dev/null || tail -n 5 "$dir/$sys.log" >&2
	else
		echo "$prog: $sys done in $took s" >&2
	fi
}

IFS=, read -r -a rate_list <<<"$rates"
IFS=, read -r -a delay_list <<<"$delays"
for rate in "${rate_list[@]}"; do
	bps=$(_wan_rate_bps "$rate") || usage "bad --rate '$rate'"
	for delay in "${delay_list[@]}"; do
		name=$rate-$delay
		dir=$out/raw/$name
		mkdir -p "$dir" && : >"$dir/status"
		echo "$prog: bed of $peers peers, $rate, delay $delay" >&2
		_wan_no_trap=1 wan_up --peers="$peers" --rate="$rate" --delay="$delay" || die "cannot make the bed"
		# wan_up cleared the INT/TERM traps it had set while making it.
		trap 'exit 130' INT
		trap 'exit 143' TERM
		id=$WAN_ID
		# Round trip between peers 0 and 1 (UDP ping-pong, 20 probes).
		rtt=""
		if [ -x "$root/tests/integration/wan_probe.py" ]; then
			timeout 10 ip netns exec "mpw-$id-1" "$root/tests/integration/wan_probe.py" echo 5999 8 \
				>"$dir/echo.log" 2>&1 &
			kids+=($!)
			for ((t = 0; t < 50; t++)); do grep -q ready "$dir/echo.log" && break; sleep 0.1; done
			rtt=$(timeout 8 ip netns exec "mpw-$id-0" "$root/tests/integration/wan_probe.py" ping \
				10.77.0.2 5999 20 2>/dev/null | sed -n 's/.*median_ms=\([0-9.]*\).*/\1/p')
			kill "${kids[@]}" 2>/dev/null
			wait_log=/dev/null wait_all
		fi
		printf 'rate=%s\nrate_bps=%s\ndelay=%s\nrtt_ms=%s\npeers=%s\ngrid=%s\n' \
			"$rate" "$bps" "$delay" "$rtt" "$peers" "$grid" >"$dir/bed.txt"
		echo "$prog: round trip peer 0 - peer 1: ${rtt:-unknown} ms" >&2
		if [ -n "$tlimit" ]; then
			limit=$tlimit
		else
			# 20 s, plus 10x the time every size's warmup and timed
			# iterations need at the rate for 2 x size on one uplink,
			# plus 100 round trips per size.
			limit=$($py -c "import sys; b, s, n, k, r = map(float, sys.argv[1:6]); \
print(int(20 + 10 * n * 2 * s * 8 / b + 100 * k * r / 1000))" \
				"$bps" "$sum_sizes" "$((iters + warmup))" "${#size_list[@]}" "${rtt:-0}")
		fi
		r_minb=$minb r_maxb=$maxb r_sizes=$sizes_csv r_iters=$iters r_warmup=$warmup
		r_ms=$(((limit < 60 ? limit : 60) * 1000)) r_kill_ns="" r_kill_ms=""
		for sys in "${sys_list[@]}"; do
			[ -n "$sys" ] || continue
			echo "$prog: $name: $sys (at most ${limit}s)" >&2
			run_system "$id" "$dir" "$sys" "$limit"
		done
		if [ -n "$kill" ]; then
			# The fault run: one size, iterations enough to outlast the
			# kill, 5 s timeouts in mpbench and Gloo; the last peer dies.
			mkdir -p "$dir/fault" && : >"$dir/fault/status"
			# Iterations: 4 x (the kill's time + 3 s) at fp32's pace on
			# the rate, so that even a 4x codec still runs at the kill,
			# and an fp32 run without the kill ends well within the bound.
			r_iters=$($py -c "import sys; k, s, b = map(float, sys.argv[1:4]); \
print(max(5, int(4 * (k / 1000 + 3) / (2 * s * 8 / b))))" "$kill" "$kill_size" "$bps")
			r_minb=$kill_size r_maxb=$kill_size r_sizes=$kill_size r_warmup=0
			r_ms=5000 r_kill_ns=mpw-$id-$((peers - 1)) r_kill_ms=$kill
			for sys in "${sys_list[@]}"; do
				[ -n "$sys" ] || continue
				echo "$prog: $name: $sys, peer $((peers - 1)) killed ${kill} ms into the run (at most ${kill_limit}s)" >&2
				run_system "$id" "$dir/fault" "$sys" "$kill_limit"
			done
		fi
		wan_down "$id" 2>"$dir/down.log" || { cat "$dir/down.log" >&2; die "bed $id was not removed"; }
		WAN_ID=""
	done
done

cmdline="$prog $*"
$py "$root/tools/wan_report.py" "$out" "$cmdline" || failed=1
if $py -c 'import matplotlib' 2>/dev/null; then
	$py "$root/tools/wan_plot.py" "$out/results.json" "$out" || echo "$prog: plotting failed" >&2
else
	echo "$prog: no plots: /usr/bin/python3 cannot import matplotlib (apt-get install python3-matplotlib)" >&2
fi
echo "$prog: results in $out" >&2
exit $failed
