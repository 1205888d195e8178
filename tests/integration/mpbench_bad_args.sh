#!/bin/sh
# Bad arguments print the reason and one usage line pointing to --help (not
# the whole help), and exit 2; nothing is started.
mpbench=$1
fail=0
check() {
	"$mpbench" "$@" >/dev/null 2>/tmp/mpbench_bad_args.$$
	rc=$?
	if [ "$rc" -ne 2 ] || ! grep -qx "usage: mpbench \[OPTIONS\]; see mpbench --help" \
		/tmp/mpbench_bad_args.$$; then
		echo "FAIL: mpbench $* exited $rc (want 2 with the usage line)"
		fail=1
	fi
	lines=$(wc -l </tmp/mpbench_bad_args.$$)
	if [ "$lines" -gt 3 ]; then
		echo "FAIL: mpbench $* printed $lines lines (want the reason and one usage line):"
		cat /tmp/mpbench_bad_args.$$
		fail=1
	fi
}
# As check, and the message must contain $1.
check_says() {
	want=$1
	shift
	check "$@"
	if ! grep -qF -- "$want" /tmp/mpbench_bad_args.$$; then
		echo "FAIL: mpbench $* did not say '$want':"
		cat /tmp/mpbench_bad_args.$$
		fail=1
	fi
}
check --bogus
check --peers=0
check --algo=tree
check --codec=zip
check -b 3
check -b 1X
check --transport=smoke
check --grid=2xx2
check -b 1M -e 1K
check_says "--sync" --sync=2
check_says "bad --dead '3,x'" --rank=0 --peers=4 --dead=3,x
check_says "bad --dead '-1'" --rank=0 --peers=4 --dead=-1
check_says "--dead names ranks of a multi-host run" --peers=4 --dead=3
check_says "--keep and --sample are for followed runs" --peers=4 --keep=1
check_says "--keep and --sample are for followed runs" --peers=4 --sample=10
check_says "--keep=4 spares every one of the 4 peers" --peers=4 --churn=0.1 --keep=4
check_says "unknown --memory 'gpu' (host or cuda)" --memory=gpu
check_says "--memory=cuda runs static averages" --memory=cuda --churn=0.1
# Sizes are in the library's grammar (src/common/size.h): a count beyond
# 2^64 - 1 bytes is refused, never wrapped. 18014398509482048K is 2^64 plus
# 64K: wrapped, it would be a valid 64K and the benchmark would run.
check_says "bad size '18014398509482048K' for --minbytes" -b 18014398509482048K -e 64K
check_says "bad size '17179869184G' for --maxbytes" -e 17179869184G
check_says "bad size '99999999999999999999' for --minbytes" -b 99999999999999999999
check_says "bad size '18014398509482048K' for --chunk" --chunk=18014398509482048K -e 64K
check_says "bad size '' for --minbytes" -b ''
check_says "bad size '-64K' for --minbytes" -b -64K
# Parameters out of range name the range; unknown codecs the known ones.
check_says "topk ratio 5 out of range (0, 1]" --codec=topk:5
check_says 'unknown codec "zip" (none, fp16, bf16, uniform8, blockwise8, topk, adacomp or auto)' --codec=zip
# nccl-tests flags mpbench has no choice of: refused with the reason.
check_says "-g 2 (GPUs per thread, from nccl-tests) is not taken" -g 2
check_says "-t 4 (threads per process, from nccl-tests) is not taken" -t 4
check_says "-d half (data type, from nccl-tests) is not taken: libmoshpit averages float (fp32) only" -d half
check_says "-o sum (reduction, from nccl-tests) is not taken: libmoshpit computes the (weighted) mean only" -o sum
check_says "-o max (reduction" --op=max
# A bad MP_* variable is named even with the log silenced.
MP_DEBUG=NONE MP_CODEC=nonsense "$mpbench" >/dev/null 2>/tmp/mpbench_bad_args.$$
rc=$?
if [ "$rc" -ne 2 ] || ! grep -qF 'bad MP_* environment variable: MP_CODEC=nonsense: unknown codec "nonsense"' /tmp/mpbench_bad_args.$$; then
	echo "FAIL: MP_CODEC=nonsense under MP_DEBUG=NONE exited $rc without naming it:"
	cat /tmp/mpbench_bad_args.$$
	fail=1
fi
# The values that describe what mpbench does anyway are accepted.
if ! "$mpbench" --transport=loop --peers=2 -b 4K -e 4K -n 1 -w 0 -g 1 -t 1 -d float -o avg \
	>/tmp/mpbench_bad_args.$$ 2>&1; then
	echo "FAIL: -g 1 -t 1 -d float -o avg refused:"
	cat /tmp/mpbench_bad_args.$$
	fail=1
fi
rm -f /tmp/mpbench_bad_args.$$
exit $fail
