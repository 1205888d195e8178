#!/usr/bin/env bash
# Every test: a warnings-as-errors build, then the same suite under ASan and
# UBSan. Installs what is missing (Debian 12) first. Ends with one line
# "N passed, N failed" over both builds.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
source tools/setup.sh

passed=0 failed=0 skipped=0 status=0
count() {
	local log=$1/meson-logs/testlog.json
	[ -f "$log" ] || return 0
	passed=$((passed + $(grep -c '"result": "OK"' "$log" || true)))
	failed=$((failed + $(grep -cE '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)))
	skipped=$((skipped + $(grep -c '"result": "SKIP"' "$log" || true)))
}

run_suite() {
	local dir=$1
	shift
	mp_configure "$dir" "$@"
	rm -f "$dir/meson-logs/testlog.json"
	meson test -C "$dir" --print-errorlogs --num-processes 2 || status=1
	count "$dir"
}

echo "== build with -Werror"
run_suite build-test -Dwerror=true -Dbuildtype=debugoptimized
echo "== ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	run_suite build-asan -Dwerror=true -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false

echo "tests: $passed passed, $failed failed, $skipped skipped"
exit $status
