#!/bin/sh
# mpbench --memory=cuda:
#   mpbench_memory_cuda.sh MPBENCH [FAKE_DRIVER_DIR]
# Without FAKE_DRIVER_DIR, what this machine has decides what is asserted,
# found as mpbench finds it (dlopen of libcuda.so.1, then cuInit and
# cuDeviceGetCount), here through python3's ctypes:
#  - no libcuda.so.1: mpbench exits 1 at once, before any peer starts, with
#    exactly one line naming the missing file;
#  - a driver but no usable device: exit 1, one line saying so;
#  - a GPU: checked runs over tcp (4 processes) and loop (2 threads), every
#    element of every size within the tolerance (wrong=0), the JSON saying
#    memory "cuda" and the path the library took.
# With FAKE_DRIVER_DIR (holding tests/integration/fake_libcuda.c built as
# libcuda.so.1): the GPU case against that fake, which faults on any touch
# of its "device memory" outside its copies, then its no-device case.
mpbench=$1
fake=$2
tmp=$(mktemp -d /tmp/mpbench_memory_cuda.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0

# What the CUDA driver of this machine offers: "nodriver", "nodevice" or "gpu".
probe() {
	if ! command -v python3 >/dev/null 2>&1; then
		# No python3: the loader's cache (misses LD_LIBRARY_PATH only).
		if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
			echo gpu
		else
			echo nodriver
		fi
		return
	fi
	python3 - <<'EOF'
import ctypes
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError:
    print("nodriver")
    raise SystemExit
n = ctypes.c_int(0)
if cu.cuInit(0) != 0 or cu.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value <= 0:
    print("nodevice")
else:
    print("gpu")
EOF
}

# A checked run that must pass: exit 0, "memory": "cuda", wrong=0 and
# checked > 0 in every row of the JSON, and the path the library took
# ($want_path: mp_mem_path's, in the footer and the JSON).
checked_run() {
	json=$tmp/out.json
	rm -f "$json"
	timeout 120 "$mpbench" --memory=cuda --json="$json" "$@" >"$tmp/out" 2>&1
	rc=$?
	if [ "$rc" -ne 0 ]; then
		echo "FAIL: mpbench --memory=cuda $* exited $rc:"
		cat "$tmp/out"
		fail=1
		return
	fi
	if ! grep -q '^# memory cuda (' "$tmp/out"; then
		echo "FAIL: mpbench --memory=cuda $*: no '# memory cuda' header line"
		fail=1
	fi
	if ! grep -q "^# Memory path : $want_path\$" "$tmp/out"; then
		echo "FAIL: mpbench --memory=cuda $*: no '# Memory path : $want_path' line:"
		grep '^# Memory path' "$tmp/out"
		fail=1
	fi
	if ! grep -q '"memory": "cuda"' "$json" || ! grep -q "\"memory_path\": \"$want_path\"" "$json"; then
		echo "FAIL: mpbench --memory=cuda $*: the JSON does not say memory cuda, $want_path"
		fail=1
	fi
	rows=$(grep -c '"bytes":' "$json")
	good=$(grep '"bytes":' "$json" | grep '"wrong": 0,' | grep -vc '"checked": 0,')
	if [ "$rows" -eq 0 ] || [ "$rows" -ne "$good" ]; then
		echo "FAIL: mpbench --memory=cuda $*: $good of $rows rows checked with wrong=0:"
		grep '"bytes":' "$json"
		fail=1
	else
		echo "ok: mpbench --memory=cuda $*: $rows sizes checked, wrong=0"
	fi
}

# A run that must fail at once: exit 1, nothing on stdout, exactly the
# line $1 on stderr.
refused() {
	want=$1
	start=$(date +%s)
	timeout 30 "$mpbench" --memory=cuda --peers=2 -b 4K -e 4K -n 1 -w 0 \
		>"$tmp/out" 2>"$tmp/err"
	rc=$?
	end=$(date +%s)
	got=$(cat "$tmp/err")
	if [ "$rc" -ne 1 ] || [ -s "$tmp/out" ] || [ "$got" != "$want" ]; then
		echo "FAIL: without a usable GPU, mpbench --memory=cuda exited $rc with"
		echo "  stderr: $got"
		echo "  want exit 1 and exactly: $want"
		[ -s "$tmp/out" ] && echo "  and stdout was not empty: $(head -n 3 "$tmp/out")"
		fail=1
	elif [ $((end - start)) -gt 5 ]; then
		echo "FAIL: the refusal took $((end - start)) s (want it at once)"
		fail=1
	else
		echo "ok: exit 1 at once: $got"
	fi
}

gpu_runs() {
	checked_run --peers=4 -b 64K -e 1M -f 4 -n 1 -w 1
	checked_run --transport=loop --peers=2 -b 4K -e 256K -f 8 -n 1 -w 0
	# A lossy codec: values checked within its bound on device buffers too.
	checked_run --peers=4 --codec=fp16 -b 64K -e 64K -n 1 -w 0
	# A sparse codec: checked after a flush of the device buffer (MP_AVG_FLUSH).
	checked_run --peers=4 --codec=topk -b 64K -e 64K -n 2 -w 0
}

if [ -n "$fake" ]; then
	LD_LIBRARY_PATH=$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	export LD_LIBRARY_PATH
	FAKE_CUDA_DEVICES=2
	export FAKE_CUDA_DEVICES
	# The fake driver runs no kernels: the buffer is staged whole.
	want_path=staged
	gpu_runs
	FAKE_CUDA_DEVICES=0
	refused "mpbench: --memory=cuda: no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)"
	exit $fail
fi

case $(probe) in
nodriver)
	refused "mpbench: --memory=cuda: libcuda.so.1: cannot open shared object file: No such file or directory (no CUDA driver on this machine)"
	;;
nodevice)
	# The driver names its own error: the line's start is what is fixed.
	timeout 30 "$mpbench" --memory=cuda --peers=2 -b 4K -e 4K -n 1 -w 0 \
		>"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" -ne 1 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] ||
		! grep -Eq '^mpbench: --memory=cuda: (no CUDA device|the CUDA driver refuses to start)' "$tmp/err"; then
		echo "FAIL: a driver without a usable device: exit $rc, stderr:"
		cat "$tmp/err"
		fail=1
	else
		echo "ok: exit 1: $(cat "$tmp/err")"
	fi
	;;
gpu)
	# Over tcp: the device path where the kernels run on this GPU, else
	# staged (a grep pattern).
	want_path='\(device\|staged\)'
	gpu_runs
	;;
esac
exit $fail
