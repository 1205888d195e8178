#!/bin/sh
# mpsim from the command line: bad arguments give a message and exit 2;
# the same seed writes byte-identical JSON and CSV; a full grid reaches the
# mean in exactly d rounds; all-reduce under failures never gets there.
mpsim=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

bad() {
	want=$1
	shift
	"$mpsim" "$@" >/dev/null 2>"$tmp/err"
	rc=$?
	if [ "$rc" -ne 2 ] || ! grep -q "^mpsim: .*$want" "$tmp/err"; then
		echo "FAIL: mpsim $* exited $rc (want 2 and a message with '$want'):"
		head -3 "$tmp/err"
		fail=1
	fi
}
bad "bad --grid" --grid=2xx2
bad "bad --grid" --grid=0x4
bad "bad --grid" --grid=32x
bad "for --fail" --fail=1.5
bad "for --fail" --fail=-0.1
bad "for --fail" --fail=0,nan
bad "do not fit grid 32x32" --algo=moshpit --peers=1025 --grid=32x32
bad "do not fit grid 4x4" --algo=random,moshpit --peers=8,17 --grid=4x4
bad "unknown --algo" --algo=tree
bad "unknown --coords" --coords=random
bad "for --peers" --peers=0
bad "for --restarts" --restarts=0
bad "empty value" --peers=16,,32
bad "unknown option" --bogus

# Same seed, same bytes (JSON and CSV); another seed, other numbers.
run() {
	"$mpsim" --algo=all --peers=300,512 --grid=24x24 --fail=0,0.01 --restarts=3 --seed="$1" \
		--length=2 --json="$tmp/$2.json" --csv="$tmp/$2.csv" >"$tmp/$2.out" || {
		echo "FAIL: mpsim --seed=$1 exited $?"
		fail=1
	}
}
run 5 a
run 5 b
run 6 c
cmp "$tmp/a.json" "$tmp/b.json" || { echo "FAIL: JSON differs for one seed"; fail=1; }
cmp "$tmp/a.csv" "$tmp/b.csv" || { echo "FAIL: CSV differs for one seed"; fail=1; }
if cmp -s "$tmp/a.csv" "$tmp/c.csv"; then
	echo "FAIL: seeds 5 and 6 gave the same CSV"
	fail=1
fi
for key in algo peers grid fail restarts mean_rounds std_rounds; do
	n=$(grep -c "^    {.*\"$key\": " "$tmp/a.json")
	if [ "$n" -ne 20 ]; then
		echo "FAIL: \"$key\" in $n of 20 results"
		fail=1
	fi
done
# 5 algorithms x 2 peer counts x 2 failure rates = 20 rows in the table
rows=$(grep -vc '^#' "$tmp/a.out")
[ "$rows" -eq 20 ] || { echo "FAIL: $rows table rows, want 20"; fail=1; }

# A full 4x4x4 grid without failures: exactly 3 rounds, every restart.
"$mpsim" --algo=moshpit --peers=64 --grid=4x4x4 --restarts=5 --json="$tmp/full.json" >/dev/null
grep -q '"mean_rounds": 3, "std_rounds": 0, "capped": 0' "$tmp/full.json" || {
	echo "FAIL: full 4x4x4 grid:"
	cat "$tmp/full.json"
	fail=1
}
# All-reduce with 1000 peers failing at 1%: a round without any failure
# comes with probability 4e-5, so every restart runs to the cap.
"$mpsim" --algo=allreduce --peers=1000 --fail=0.01 --restarts=4 --max-rounds=20 \
	--json="$tmp/ar.json" >/dev/null
grep -q '"mean_rounds": 20, "std_rounds": 0, "capped": 4' "$tmp/ar.json" || {
	echo "FAIL: all-reduce with failures:"
	cat "$tmp/ar.json"
	fail=1
}
# The CSV holds round 0 plus one row per round run.
"$mpsim" --algo=gossip --peers=100 --max-rounds=7 --restarts=2 --csv="$tmp/g.csv" >/dev/null
n=$(grep -c '^gossip,100,,,0,' "$tmp/g.csv")
[ "$n" -eq 16 ] || { echo "FAIL: $n gossip CSV rows, want 16"; fail=1; }
exit $fail
