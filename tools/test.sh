#!/usr/bin/env bash
# Every test: a warnings-as-errors build, then the same suite under ASan and
# UBSan, then the tests that run threads (meson suite tsan) under
# ThreadSanitizer. Installs what is missing (Debian 12) first. Ends with one
# line "N passed, N failed" over the three builds.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
# tests/python needs numpy, torch and pytest for /usr/bin/python3.
export MP_WITH_PYTHON=1
source tools/setup.sh

passed=0 failed=0 skipped=0 status=0
count() {
	local log=$1/meson-logs/testlog.json
	[ -f "$log" ] || return 0
	passed=$((passed + $(grep -c '"result": "OK"' "$log" || true)))
	failed=$((failed + $(grep -cE '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)))
	skipped=$((skipped + $(grep -c '"result": "SKIP"' "$log" || true)))
}

# run_suite DIR [meson options...] [-- meson test arguments...]
run_suite() {
	local dir=$1 opts=() targs=()
	shift
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		opts+=("$1")
		shift
	done
	[ $# -gt 0 ] && shift
	targs=("$@")
	mp_configure "$dir" "${opts[@]}"
	rm -f "$dir/meson-logs/testlog.json"
	meson test -C "$dir" --print-errorlogs --num-processes 2 "${targs[@]}" || status=1
	count "$dir"
}

echo "== build with -Werror"
run_suite build-test -Dwerror=true -Dbuildtype=debugoptimized
echo "== ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	run_suite build-asan -Dwerror=true -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false
# A data race fails the test (exit code 66). TSan slows these tests 5 to 10
# times, hence the longer timeouts; tests/tsan.supp names the races it hides,
# all in libraries not built with TSan.
echo "== TSan (suite tsan: the tests that run threads)"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$top/tests/tsan.supp" \
	run_suite build-tsan -Dwerror=true -Dbuildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false \
	-- --suite tsan --timeout-multiplier 3

echo "tests: $passed passed, $failed failed, $skipped skipped"
exit $status
