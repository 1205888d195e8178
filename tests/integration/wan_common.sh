# shellcheck shell=bash
# Shared by the WAN test bed's tests (sourced): skip checks (exit 77 with a
# reason) and the probe's path.
#   wan_need_bed: root, ip, tc, python3, and a namespace can be made
#   wan_need_delay NFQ_DELAY: the delay helper, iptables and NFQUEUE
probe=$(dirname "$(readlink -f "$0")")/wan_probe.py
wan_need_bed() {
	if [ "$(id -u)" -ne 0 ]; then
		echo "SKIP: needs root (network namespaces, veths, a bridge, tc)"
		exit 77
	fi
	local t
	for t in ip tc /usr/bin/python3; do
		command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
	done
	if ! ip netns add "mpw-probe-$$" 2>/dev/null; then
		echo "SKIP: cannot create a network namespace"
		exit 77
	fi
	ip netns del "mpw-probe-$$"
}
wan_need_delay() {
	local nfq=$1
	if [ -z "$nfq" ] || [ ! -x "$nfq" ]; then
		echo "SKIP: nfq_delay was not built (install libnetfilter-queue-dev, or MP_WITH_WAN=1 tools/setup.sh)"
		exit 77
	fi
	command -v iptables >/dev/null || { echo "SKIP: iptables is not installed (MP_WITH_WAN=1 tools/setup.sh)"; exit 77; }
	ip netns add "mpw-probe-$$" || exit 1
	if ! ip netns exec "mpw-probe-$$" iptables -t mangle -A PREROUTING -j NFQUEUE --queue-num 0 2>/dev/null; then
		ip netns del "mpw-probe-$$"
		echo "SKIP: no NFQUEUE target in this kernel (nfnetlink_queue)"
		exit 77
	fi
	ip netns del "mpw-probe-$$"
}
# wait_for FILE WORD: up to 5 s for WORD to appear in FILE.
wait_for() {
	local t
	for ((t = 0; t < 100; t++)); do
		grep -q "$2" "$1" 2>/dev/null && return 0
		sleep 0.05
	done
	echo "FAIL: '$2' never appeared in $1:"
	cat "$1"
	return 1
}
# field LINE KEY: KEY's value in a key=value line.
field() { printf '%s\n' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
