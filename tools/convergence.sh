#!/usr/bin/env bash
# The convergence study of doc/convergence.md: runs mpsim over every
# configuration, prints the tables (Markdown) on stdout and draws the plots
# into doc/img/ with gnuplot.
#
#   tools/convergence.sh                 # builds build/ (release) first
#   MPSIM=/path/to/mpsim tools/convergence.sh
#
# Everything is seeded (--seed=1): a rerun prints the same tables.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
if [ -z "${MPSIM:-}" ]; then
	MP_WITH_DOCS=1 source tools/setup.sh
	mp_configure build -Dbuildtype=release
	MPSIM=build/tools/mpsim
fi
command -v gnuplot >/dev/null || { echo "convergence.sh: needs gnuplot (apt-get install gnuplot-nox)" >&2; exit 1; }
out=doc/img
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fails=0,0.001,0.005,0.01
# The 32x32 study (the Moshpit paper's setting), every algorithm.
"$MPSIM" --algo=all --peers=512,768,900,1024 --grid=32x32 --fail=$fails --restarts=20 --seed=1 \
	--json="$tmp/flat.json" >"$tmp/flat.out"
# Moshpit with the matchmaker's re-coordination, same runs.
"$MPSIM" --algo=moshpit --coords=matchmaker --peers=512,768,900,1024 --grid=32x32 --fail=$fails \
	--restarts=20 --seed=1 --json="$tmp/mm.json" >"$tmp/mm.out"
# 3-D grids at larger N: about half full and full.
: >"$tmp/cube.rows"
for spec in 16x16x16:2048,4096 32x32x32:16384,32768 47x47x47:50000,100000; do
	"$MPSIM" --algo=all --grid="${spec%%:*}" --peers="${spec#*:}" --fail=0,0.01 --restarts=10 \
		--seed=1 --json="$tmp/cube.json" >"$tmp/cube.out"
	grep '^    {' "$tmp/cube.json" >>"$tmp/cube.rows"
	"$MPSIM" --algo=moshpit --coords=matchmaker --grid="${spec%%:*}" --peers="${spec#*:}" \
		--fail=0,0.01 --restarts=10 --seed=1 --json="$tmp/cube.json" >"$tmp/cube.out"
	grep '^    {' "$tmp/cube.json" | sed 's/"moshpit"/"moshpit-mm"/' >>"$tmp/cube.rows"
done
# Per-round curves: N = 900 on 32x32 at p = 0.01, every round to 30.
"$MPSIM" --algo=all --peers=900 --grid=32x32 --fail=0.01 --restarts=20 --seed=1 --eps=0 \
	--max-rounds=30 --csv="$tmp/curves.csv" --json="$tmp/curves.json" >/dev/null

# JSON results (one per line) -> "algo peers grid fail mean std capped rate theory" rows.
rows() {
	grep '^    {' "$1" | awk '{
		gsub(/[{}",:]/, " ");
		for (i = 1; i < NF; i++) v[$i] = $(i + 1);
		print v["algo"], v["peers"], v["grid"], v["fail"], v["mean_rounds"],
		      v["std_rounds"], v["capped"], v["restarts"], v["rate"], v["theory_rate"]
	}'
}
rows "$tmp/flat.json" >"$tmp/flat.rows"
rows "$tmp/mm.json" | sed 's/^moshpit/moshpit-mm/' >>"$tmp/flat.rows"
rows "$tmp/cube.rows" >"$tmp/cube.dat"

# Markdown: one table per N, algorithms down, failure rates across.
# A cell is mean ± std rounds; "50+" marks runs that hit the cap (k/R of them).
cell() {
	awk -v m="$1" -v s="$2" -v c="$3" -v r="$4" 'BEGIN {
		if (c == r) printf "50+";
		else if (c > 0) printf "%.1f ± %.1f (%d/%d capped)", m, s, c, r;
		else printf "%.1f ± %.1f", m, s }'
}
for n in 512 768 900 1024; do
	echo
	echo "**N = $n on 32x32** (rounds to 1e-9, mean ± std over 20 runs)"
	echo
	echo "| algorithm | p = 0 | p = 0.001 | p = 0.005 | p = 0.01 | measured rate (p = 0) | random-group theory |"
	echo "|---|---|---|---|---|---|---|"
	for a in moshpit moshpit-mm random allreduce gossip pushsum; do
		line="| $a"
		rate=- theory=-
		while read -r algo peers grid fail mean std capped restarts r th; do
			line="$line | $(cell "$mean" "$std" "$capped" "$restarts")"
			if [ "$fail" = 0 ]; then
				rate=$(printf %.3g "$r")
				[ "$th" = null ] || theory=$(printf %.3g "$th")
			fi
		done < <(awk -v a="$a" -v n="$n" '$1 == a && $2 == n' "$tmp/flat.rows")
		echo "$line | $rate | $theory |"
	done
done
echo
echo "**3-D grids** (rounds to 1e-9, mean ± std over 10 runs; random groups of one side)"
echo
echo "| grid | N | p | moshpit | moshpit-mm | random | allreduce | gossip | pushsum |"
echo "|---|---|---|---|---|---|---|---|---|"
awk '$1 == "moshpit" { print $3, $2, $4 }' "$tmp/cube.dat" | sort -u -k2,2n -k3,3 |
while read -r grid n p; do
	line="| $grid | $n | $p"
	for a in moshpit moshpit-mm random allreduce gossip pushsum; do
		read -r mean std capped restarts < <(awk -v a="$a" -v n="$n" -v p="$p" \
			'$1 == a && $2 == n && $4 == p { print $5, $6, $7, $8 }' "$tmp/cube.dat")
		line="$line | $(cell "$mean" "$std" "$capped" "$restarts")"
	done
	echo "$line |"
done

# Plots. 1: rounds against the failure rate, one panel per N.
for n in 512 768 900 1024; do
	for a in moshpit moshpit-mm random allreduce gossip pushsum; do
		awk -v a="$a" -v n="$n" '$1 == a && $2 == n { print $4, $5, $6 }' "$tmp/flat.rows" \
			>"$tmp/p_${n}_$a.dat"
	done
done
gnuplot <<EOF
set terminal pngcairo size 1100,800 font ",10"
set output "$out/convergence_32x32.png"
set multiplot layout 2,2 title "Rounds until the mean squared distance to the mean < 1e-9 (32x32 grid, 20 runs, cap 50)"
set logscale xy
set xrange [0.0005:0.02]
set yrange [0.8:80]
set ytics (1, 2, 3, 5, 10, 20, 50)
set xlabel "failure probability per peer and round (p = 0 drawn at 0.0007)"
set ylabel "rounds"
set key below horizontal maxrows 1 font ",9"
do for [n in "512 768 900 1024"] {
  set title "N = ".n
  plot for [a in "moshpit moshpit-mm random allreduce gossip pushsum"] \
    "$tmp/p_".n."_".a.".dat" using (\$1 > 0 ? \$1 : 0.0007):2:3 with yerrorlines title a
}
unset multiplot
EOF

# 2: the error round by round (geometric mean over runs; exact zeros drawn at 1e-20).
awk -F, 'NR > 1 {
	e = $8 > 1e-20 ? $8 : 1e-20
	k = $1 " " $7; s[k] += log(e); c[k]++
} END { for (k in s) print k, exp(s[k] / c[k]) }' "$tmp/curves.csv" | sort -k1,1 -k2,2n >"$tmp/curves.dat"
theory=$(grep '"algo": "random"' "$tmp/curves.json" | sed 's/.*"theory_rate": \([^,}]*\).*/\1/')
e0=$(awk '$1 == "random" && $2 == 0 { print $3 }' "$tmp/curves.dat")
gnuplot <<EOF
set terminal pngcairo size 900,600 font ",10"
set output "$out/convergence_curves.png"
set title "Error round by round: N = 900 on 32x32, p = 0.01 (geometric mean of 20 runs)"
set logscale y
set format y "1e%T"
set yrange [1e-20:10]
set xlabel "round"
set ylabel "mean squared distance to the mean"
set key bottom left
plot for [a in "moshpit random allreduce gossip pushsum"] \
    "< awk '\$1 == \"".a."\"' $tmp/curves.dat" using 2:3 with linespoints title a, \
  $e0 * $theory**x with lines dashtype 2 lc rgb "black" title "random groups, theory (p = 0)", \
  1e-9 with lines dashtype 3 lc rgb "gray" title "eps = 1e-9"
EOF

# 3: 3-D grids, rounds against N.
for a in moshpit moshpit-mm random allreduce gossip pushsum; do
	for p in 0 0.01; do
		awk -v a="$a" -v p="$p" '$1 == a && $4 == p { print $2, $5, $6 }' "$tmp/cube.dat" \
			| sort -n >"$tmp/c_${a}_$p.dat"
	done
done
gnuplot <<EOF
set terminal pngcairo size 1100,520 font ",10"
set output "$out/convergence_3d.png"
set multiplot layout 1,2 title "3-D grids (16^3, 32^3, 47^3; half full and full): rounds to 1e-9, 10 runs, cap 50"
set logscale xy
set xrange [1500:140000]
set xlabel "peers"
set ylabel "rounds"
set yrange [0.8:80]
set ytics (1, 2, 3, 5, 10, 20, 50)
set key below horizontal maxrows 2 font ",9"
algos = "moshpit moshpit-mm random allreduce pushsum gossip"
do for [p in "0 0.01"] {
  set title "p = ".p
  plot for [i=1:words(algos)] "$tmp/c_".word(algos, i)."_".p.".dat" using 1:2:3 \\
    with yerrorlines lc i pt i title word(algos, i)
}
unset multiplot
EOF
echo
echo "plots: $out/convergence_32x32.png $out/convergence_curves.png $out/convergence_3d.png" >&2
