#!/bin/bash
# NAME
#     fuzz.sh - coverage-guided fuzzing of moshpit's parsers with libFuzzer
#
# SYNOPSIS
#     tools/fuzz.sh SECONDS [TARGET...]
#
# DESCRIPTION
#     Builds the fuzz targets of tests/fuzz/ (all of them, or the TARGETs
#     named: fuzz_frame, fuzz_settings, fuzz_record, fuzz_ctrl, fuzz_config,
#     fuzz_welcome, fuzz_state, fuzz_dpdk_frame, fuzz_dpdk_rel, fuzz_mpbench_opts) with
#     clang and -fsanitize=fuzzer,address,undefined (the library too, for
#     coverage) in their own build directory, build-fuzz (build/ is not
#     touched), then runs each for SECONDS, one after another, on a copy of
#     its seed corpus tests/fuzz/corpus/TARGET/ (the repository's corpus is
#     not changed; what libFuzzer adds stays in the scratch copy).
#
#     Prints a line per target: executions, executions per second, edges
#     covered (libFuzzer's "cov:"), features ("ft:"), corpus size and
#     crashes. A crash, sanitizer report, leak, timeout (10 s on one
#     input) or out-of-memory (2 GiB) stops that target; its input is kept
#     in OUT/TARGET/ (crash-*, leak-*, timeout-*, oom-*): copy it into
#     tests/fuzz/corpus/TARGET/ once the bug is fixed, as a regression the
#     suite replays. A UBSan report counts as a crash (halt_on_error).
#
# ENVIRONMENT
#     FUZZ_OUT     where crash inputs and logs go (default build-fuzz/out)
#     FUZZ_JOBS    ninja's parallel jobs for the build (default 2)
#     FUZZ_FLAGS   more libFuzzer flags for every target (e.g. -runs=N)
#     CC           the compiler (default clang; it must know -fsanitize=fuzzer)
#
# EXIT STATUS
#     0 no crash; 1 a target crashed (or found a leak, timeout, OOM); 2 bad
#     usage or the build failed.
set -euo pipefail

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
	exit 2
}

[ $# -ge 1 ] || usage
case "$1" in
'' | *[!0-9]*) usage ;;
esac
secs=$1
shift
all=(fuzz_frame fuzz_settings fuzz_record fuzz_ctrl fuzz_config fuzz_welcome fuzz_state fuzz_dpdk_frame fuzz_dpdk_rel
	fuzz_mpbench_opts)
if [ $# -gt 0 ]; then
	targets=("$@")
else
	targets=("${all[@]}")
fi
for t in "${targets[@]}"; do
	case " ${all[*]} " in
	*" $t "*) ;;
	*)
		echo "fuzz.sh: unknown target $t (known: ${all[*]})" >&2
		exit 2
		;;
	esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
bdir=$root/build-fuzz
out=${FUZZ_OUT:-$bdir/out}
cc=${CC:-clang}

if [ ! -f "$bdir/build.ninja" ]; then
	# A half-made one (a failed setup) is made again.
	rm -rf "$bdir"
	# No optional transport, no GPU: the targets need none.
	# -fsanitize=fuzzer-no-link gives the library the coverage hooks;
	# the targets add -fsanitize=fuzzer themselves (-Dlibfuzzer=true).
	CC=$cc meson setup "$bdir" "$root" -Dlibfuzzer=true \
		-Ddpdk=disabled -Ddpdk_gpudev=disabled -Dverbs=disabled -Dofi=disabled \
		-Dcuda=disabled -Ddht=disabled -Dbuildtype=debugoptimized \
		-Db_sanitize=address,undefined -Db_lundef=false \
		-Dc_args='-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined' \
		>"$bdir.setup.log" 2>&1 || {
		cat "$bdir.setup.log" >&2
		echo "fuzz.sh: meson setup failed (is $cc a clang with libFuzzer?)" >&2
		exit 2
	}
	mv "$bdir.setup.log" "$bdir/setup.log"
fi
exes=()
for t in "${targets[@]}"; do
	exes+=("tests/fuzz/$t")
done
nice ninja -C "$bdir" -j "${FUZZ_JOBS:-2}" "${exes[@]}" >"$bdir/ninja.log" 2>&1 || {
	tail -40 "$bdir/ninja.log" >&2
	echo "fuzz.sh: build failed (whole log: $bdir/ninja.log)" >&2
	exit 2
}

mkdir -p "$out"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/mp-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}
failed=0
printf '%-16s %12s %9s %7s %7s %7s %8s\n' target executions exec/s edges ft corpus crashes
for t in "${targets[@]}"; do
	mkdir -p "$scratch/$t" "$out/$t"
	cp "$root/tests/fuzz/corpus/$t/"* "$scratch/$t/"
	log=$out/$t/fuzz.log
	before=$(find "$out/$t" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 -name 'leak-*' \
		-o -maxdepth 1 -name 'timeout-*' -o -maxdepth 1 -name 'oom-*' | wc -l)
	# shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags
	nice "$bdir/tests/fuzz/$t" -max_total_time="$secs" -print_final_stats=1 -timeout=10 \
		-rss_limit_mb=2048 -artifact_prefix="$out/$t/" ${FUZZ_FLAGS:-} "$scratch/$t" \
		>"$log" 2>&1 && rc=0 || rc=$?
	after=$(find "$out/$t" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 -name 'leak-*' \
		-o -maxdepth 1 -name 'timeout-*' -o -maxdepth 1 -name 'oom-*' | wc -l)
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
	edges=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
	ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
	corp=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
	crashes=$((after - before))
	if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
		crashes=1 # it died without an artifact: still a failure
	fi
	printf '%-16s %12s %9s %7s %7s %7s %8s\n' "$t" "${execs:-?}" "${rate:-?}" "${edges:-?}" \
		"${ft:-?}" "${corp:-?}" "$crashes"
	if [ "$crashes" -ne 0 ]; then
		failed=1
		echo "  $t crashed (exit $rc); log $log; inputs:" >&2
		find "$out/$t" -maxdepth 1 -newer "$scratch" -type f ! -name fuzz.log | sed 's/^/    /' >&2
		grep -m3 -E 'ERROR|runtime error|SUMMARY' "$log" | sed 's/^/    /' >&2 || true
	fi
done
exit "$failed"
