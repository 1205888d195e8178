#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# Smoke test of codecbench: a tiny run of every codec on both data sets must
# succeed and write one JSON row per (codec, data set) with every key the
# tools downstream read; none must compress by exactly 1 and fp16 by exactly
# 2; bad usage must exit 2. No timing is judged: that is --check's job, by
# hand, on a quiet machine.
#
# Usage: codecbench_smoke.sh PATH/TO/codecbench [CODEC,CODEC,...]
# The optional list (default: all seven codecs) is for partial builds.
# Plain POSIX sh, grep, sed and awk: no python on a fresh Debian.

cb=${1:?usage: codecbench_smoke.sh PATH/TO/codecbench [CODECS]}
codecs=${2:-none,fp16,bf16,uniform8,blockwise8,topk,adacomp}
datasets="gauss heavy"
keys="codec data bytes kernels encode_gbs decode_acc_gbs memcpy_gbs ratio rms_rel_err"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/codecbench_smoke.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

fails=0
fail() {
	echo "FAIL: $*" >&2
	fails=$((fails + 1))
}

# The value of "key" in one JSON row (rows are one object per line).
field() {
	printf '%s\n' "$1" | sed -n "s/.*\"$2\": *\"\{0,1\}\([^\",}]*\).*/\1/p"
}

# --- a small full run ---------------------------------------------------
json=$tmp/out.json
"$cb" --size=1M --chunk=64K --iters=1 --warmup=0 --codec="$codecs" --json="$json" \
	>"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
if [ "$rc" -ne 0 ]; then
	fail "codecbench --codec=$codecs exited $rc"
	cat "$tmp/stderr" >&2
	exit 1
fi
if [ ! -s "$json" ]; then
	fail "no JSON written to $json"
	exit 1
fi
if [ "$(sed -n '1p' "$json")" != "[" ] || [ "$(sed -n '$p' "$json")" != "]" ]; then
	fail "JSON is not a list"
fi

grep '"codec":' "$json" >"$tmp/rows"
ncodecs=$(printf '%s\n' "$codecs" | tr ',' '\n' | grep -c .)
want=$((ncodecs * 2))
got=$(grep -c . "$tmp/rows")
[ "$got" -eq "$want" ] || fail "JSON has $got rows, want $want"

for c in $(printf '%s\n' "$codecs" | tr ',' ' '); do
	for d in $datasets; do
		n=$(grep -c "\"codec\": \"$c\", \"data\": \"$d\"" "$tmp/rows")
		[ "$n" -eq 1 ] || fail "$n rows for codec $c on $d, want 1"
	done
	# A codec missing from the build is skipped with a note, not timed.
	if grep -q "codec $c .*skipped" "$tmp/stderr"; then
		fail "codec $c was skipped (not built)"
	fi
done

# Every row has every key, and the throughputs are positive numbers.
while IFS= read -r row; do
	name="$(field "$row" codec)/$(field "$row" data)"
	for k in $keys; do
		case $row in
		*"\"$k\":"*) ;;
		*) fail "$name: no key $k" ;;
		esac
	done
	for k in encode_gbs decode_acc_gbs memcpy_gbs ratio; do
		v=$(field "$row" "$k")
		if ! awk -v v="$v" 'BEGIN { exit !(v ~ /^[0-9.eE+-]+$/ && v + 0 > 0) }'; then
			fail "$name: $k is '$v', want a positive number"
		fi
	done
	v=$(field "$row" rms_rel_err)
	if ! awk -v v="$v" 'BEGIN { exit !(v ~ /^[0-9.eE+-]+$/ && v + 0 >= 0) }'; then
		fail "$name: rms_rel_err is '$v', want a number"
	fi
done <"$tmp/rows"

# Exact ratios: none is fp32 itself, fp16 is two bytes per float, no header.
check_ratio() {
	for d in $datasets; do
		row=$(grep "\"codec\": \"$1\", \"data\": \"$d\"" "$tmp/rows")
		[ -n "$row" ] || continue
		v=$(field "$row" ratio)
		if ! awk -v v="$v" -v w="$2" \
			'BEGIN { exit !(v ~ /^[0-9.eE+-]+$/ && v + 0 == w + 0) }'; then
			fail "$1/$d: ratio is '$v', want exactly $2"
		fi
		if [ "$1" = none ]; then
			v=$(field "$row" rms_rel_err)
			awk -v v="$v" 'BEGIN { exit !(v ~ /^[0-9.eE+-]+$/ && v + 0 == 0) }' ||
				fail "none/$d: rms_rel_err is '$v', want 0"
		fi
	done
}
case ",$codecs," in *,none,*) check_ratio none 1 ;; esac
case ",$codecs," in *,fp16,*) check_ratio fp16 2 ;; esac

# The table: a header and one row per (codec, data set).
got=$(grep -c -v '^#' "$tmp/stdout")
[ "$got" -eq "$want" ] || fail "table has $got rows, want $want"

# --- bad usage: exit 2 with a message, nothing run ----------------------
bad() {
	"$cb" --size=4K --iters=1 --warmup=0 "$@" >/dev/null 2>"$tmp/bad"
	rc=$?
	if [ "$rc" -ne 2 ]; then
		fail "codecbench $* exited $rc, want 2"
	elif [ ! -s "$tmp/bad" ]; then
		fail "codecbench $* exited 2 without a message"
	fi
}
bad --codec=nope
bad --size=0
bad --kernels=nope
bad --size=6
bad --chunk=0
bad --iters=0
bad --data=uniform
bad --topk=2
bad --bogus
bad extra-argument

"$cb" --help >/dev/null 2>&1 || fail "codecbench --help exited $?"

if [ "$fails" -ne 0 ]; then
	echo "codecbench_smoke: $fails failure(s)" >&2
	exit 1
fi
echo "codecbench_smoke: ok"
exit 0
