#!/bin/sh
# On a machine without an RDMA device, mpbench --transport=verbs must fail
# within 10 s, exit non-zero and say what it looked for:
#   mpbench_verbs_nodev.sh MPBENCH
# Skips (77) where a device exists.
mpbench=$1
if [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
	echo "SKIP: this machine has an RDMA device ($(ls /sys/class/infiniband | tr '\n' ' '))"
	exit 77
fi
out=$(mktemp /tmp/mpbench_verbs.XXXXXX) || exit 1
trap 'rm -f "$out"' EXIT
start=$(date +%s)
timeout 10 "$mpbench" --transport=verbs --peers=2 -b 4K -e 4K -n 1 -w 0 >"$out" 2>&1
rc=$?
end=$(date +%s)
cat "$out"
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
	echo "FAIL: mpbench --transport=verbs exited $rc (want a prompt failure)"
	exit 1
fi
if ! grep -qi "rdma device" "$out" || ! grep -q "looked for" "$out"; then
	echo "FAIL: no message naming what was looked for"
	exit 1
fi
# The advice must survive to the last line, the one a user reads first: not
# be followed by a bare "initialisation failed: No such device".
last=$(grep -v '^#' "$out" | tail -n 1)
case $last in
*"looked for"*) ;;
*)
	echo "FAIL: the last line lost the advice: $last"
	exit 1
	;;
esac
echo "ok: exit $rc after $((end - start)) s with the reason"
