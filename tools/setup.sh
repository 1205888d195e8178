#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: installs the Debian packages the
# build needs when they are missing, then configures and builds into $1.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
need=(gcc g++ meson ninja-build pkg-config libcmocka-dev libsodium-dev libopendht-dev libopendht-c-dev libunistring-dev libdpdk-dev libfabric-dev libibverbs-dev)
# OpenMPI is the reference in tools/bench_vs_mpi.sh; tests do not need it.
[ "${MP_WITH_MPI:-0}" = 1 ] && need+=(openmpi-bin libopenmpi-dev)
# The WAN test bed's delay (tools/nfq_delay.c, tools/wan_bed.sh): its tests
# skip without them.
[ "${MP_WITH_WAN:-0}" = 1 ] && need+=(iptables libnetfilter-queue-dev)
# The Python package's tests (tests/python, run by test.sh): Debian's numpy,
# torch and pytest for /usr/bin/python3. The suite skips them without.
[ "${MP_WITH_PYTHON:-0}" = 1 ] && need+=(python3-numpy python3-torch python3-pytest python3-sklearn)
# tools/train.sh: the digits data set and the plots.
[ "${MP_WITH_TRAIN:-0}" = 1 ] && need+=(python3-numpy python3-torch python3-sklearn python3-matplotlib)
# gnuplot draws the plots of tools/convergence.sh; tests do not need it.
[ "${MP_WITH_DOCS:-0}" = 1 ] && need+=(gnuplot-nox)

missing=()
for p in "${need[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup: installing ${missing[*]}" >&2
	sudo=""
	[ "$(id -u)" -ne 0 ] && sudo="sudo"
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq >&2 || true
	$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# configure DIR [meson options...]: set up once, reconfigure when options change.
mp_configure() {
	local dir=$1
	shift
	if [ -f "$dir/build.ninja" ]; then
		meson configure "$dir" "$@" >/dev/null
	else
		meson setup "$dir" "$top" "$@" >/dev/null
	fi
	ninja -C "$dir" >&2
}
