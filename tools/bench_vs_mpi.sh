#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench_vs_mpi.sh - time mpbench against OpenMPI's MPI_Allreduce on this host.
#
# Usage: tools/bench_vs_mpi.sh [BUILD_DIR] [MPBENCH_ARGS...]
#
#   BUILD_DIR     meson build folder holding mpbench (default: $BUILD or build/
#                 at the top of the source tree); mpi_allreduce_ref is compiled
#                 there with mpicc when missing or older than its source.
#   MPBENCH_ARGS  extra mpbench options, after the defaults so they win,
#                 e.g. --algo=butterfly or --transport=loop.
#
# Environment: NP (peers and MPI ranks, default 8), MINBYTES (1K), MAXBYTES
# (64M), STEP (4), ITERS (5), WARMUP (2) apply to both programs; MPBENCH and
# MPI_REF name the binaries to use instead of the ones in BUILD_DIR; MPIRUN_ARGS
# adds options to mpirun.
#
# Runs mpbench --algo=ring --peers=NP and mpirun -np NP mpi_allreduce_ref over
# the same sizes, then prints size, both times and their ratio (mpbench/MPI).
# Exits non-zero if either program fails or mpbench finds wrong values.
set -u -o pipefail

prog=bench_vs_mpi.sh
die() {
	echo "$prog: $*" >&2
	exit 1
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

build=${BUILD:-$root/build}
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
	build=$1
	shift
fi
case ${1:-} in
-h | --help)
	sed -n '4,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
	exit 0
	;;
esac

np=${NP:-8}
minb=${MINBYTES:-1K}
maxb=${MAXBYTES:-64M}
step=${STEP:-4}
iters=${ITERS:-5}
warmup=${WARMUP:-2}
case $np in
'' | *[!0-9]*) die "NP must be a positive number, not '$np'" ;;
esac
[ "$np" -ge 1 ] || die "NP must be a positive number, not '$np'"

command -v mpirun >/dev/null 2>&1 ||
	die "mpirun not found in PATH (install OpenMPI, e.g. apt-get install openmpi-bin libopenmpi-dev)"
[ -d "$build" ] || die "build folder '$build' not found (build the project first: meson setup build && ninja -C build)"

mpbench=${MPBENCH:-}
if [ -z "$mpbench" ]; then
	for c in "$build/tools/mpbench" "$build/mpbench"; do
		if [ -x "$c" ]; then
			mpbench=$c
			break
		fi
	done
fi
if [ -z "$mpbench" ] || [ ! -x "$mpbench" ]; then
	die "mpbench not found in '$build' (build the project first, or set MPBENCH=path)"
fi

ref=${MPI_REF:-}
if [ -z "$ref" ]; then
	ref=$build/mpi_allreduce_ref
	src=$root/tools/mpi_allreduce_ref.c
	hdr=$root/src/common/size.h
	if [ ! -x "$ref" ] || [ "$src" -nt "$ref" ] || [ "$hdr" -nt "$ref" ]; then
		command -v mpicc >/dev/null 2>&1 ||
			die "mpicc not found in PATH (install libopenmpi-dev) to build $ref"
		echo "$prog: compiling $ref" >&2
		mpicc -std=c11 -O2 -I"$root/src/common" -o "$ref" "$src" || die "mpicc failed on $src"
	fi
fi
[ -x "$ref" ] || die "MPI reference '$ref' is not executable"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_vs_mpi.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT

sizes=(-b "$minb" -e "$maxb" -f "$step" -n "$iters" -w "$warmup")

echo "$prog: mpbench, $np peers" >&2
"$mpbench" --algo=ring --peers="$np" "${sizes[@]}" --json="$tmp/mpbench.json" "$@"
mp_rc=$?
[ -s "$tmp/mpbench.json" ] || die "mpbench failed (exit status $mp_rc)"

echo "$prog: MPI_Allreduce, $np ranks" >&2
# shellcheck disable=SC2086 # MPIRUN_ARGS is split on purpose
mpirun --oversubscribe --allow-run-as-root -np "$np" --mca btl tcp,self ${MPIRUN_ARGS:-} \
	"$ref" "${sizes[@]}" >"$tmp/mpi.txt"
mpi_rc=$?
cat "$tmp/mpi.txt"
[ $mpi_rc -eq 0 ] || die "mpirun $ref failed (exit status $mpi_rc)"

echo
# mpbench writes one result object per line; the reference writes "bytes time_us".
awk '
function field(line, name,    v) {
	if (!match(line, "\"" name "\": *[-+0-9.eE]+"))
		return ""
	v = substr(line, RSTART, RLENGTH)
	sub(/^[^:]*: */, "", v)
	return v
}
FNR == NR {
	if ($0 ~ /"algo": *"/ && algo == "") {
		algo = $0
		sub(/^.*"algo": *"/, "", algo)
		sub(/".*$/, "", algo)
	}
	b = field($0, "bytes")
	t = field($0, "time_us")
	if (b != "" && t != "") {
		mp[b] = t
		order[++n] = b
	}
	next
}
/^#/ { next }
NF >= 2 { mpi[$1] = $2 }
END {
	printf("# mpbench (--algo=%s) vs MPI_Allreduce\n", algo)
	printf("# %12s %14s %14s %10s\n", "size (B)", "mpbench (us)", "MPI (us)", "ratio")
	for (i = 1; i <= n; i++) {
		b = order[i]
		if (b in mpi && mpi[b] + 0 > 0)
			printf("  %12s %14.1f %14.1f %10.2f\n", b, mp[b], mpi[b], mp[b] / mpi[b])
		else
			printf("  %12s %14.1f %14s %10s\n", b, mp[b], "-", "-")
	}
}' "$tmp/mpbench.json" "$tmp/mpi.txt"

if [ $mp_rc -ne 0 ]; then
	echo "$prog: mpbench exited with status $mp_rc (see above)" >&2
	exit "$mp_rc"
fi
exit 0
