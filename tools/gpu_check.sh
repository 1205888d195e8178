#!/bin/bash
# NAME
#     gpu_check.sh - moshpit's GPU checks in one command, for a machine with
#     an NVIDIA GPU and the CUDA toolkit
#
# SYNOPSIS
#     tools/gpu_check.sh [--out DIR] [--build-dir DIR] [--deps DIR]
#                        [--build-only] [--count N] [--peers N]
#                        [--min SIZE] [--max SIZE] [--iters N] [--target PCT]
#
# DESCRIPTION
#     Sized to finish in under 5 minutes on an H100 (most of it the build):
#
#     1. Stops at once, exit 77 (skipped), without a usable GPU: no
#        libcuda.so.1, or no device (python3's ctypes loads the driver as
#        mpbench does; nvidia-smi -L where python3 is missing).
#     2. Checks for the tools and libraries the build needs (cc, g++, meson,
#        ninja, nvcc, pkg-config, python3, libsodium, cmocka) and names every
#        missing one (exit 2). Nothing is installed: the machine may have
#        no network.
#     3. Builds the library with -Dcuda=enabled and without DPDK, RDMA
#        (verbs, ofi) and OpenDHT, in its own build directory (build-gpu),
#        and only what the checks run: mpbench, test_cuda_codecs,
#        test_stage_cuda_real and the CPU codec tests.
#     4. The CPU codec tests (test_codec, test_codec_quant,
#        test_codec_average, test_codec_sparse, test_kernels) as this
#        machine's compiler builds them: the CUDA kernels are judged
#        against these codecs, and a compiler can break them (GCC 13.3 -O3
#        did, see doc/codecs.md);
#        test_cuda_codecs: every CUDA codec kernel against the CPU codecs;
#        test_stage_cuda_real: staging with the caller's CUDA stream
#        (mp_average_start_stream, mp_request_stream_wait), two peers;
#        test_devpath_cuda_real: the device path against the host path,
#        per codec (bit for bit but uniform8), four peers, and the ring;
#        tests/python/cuda_real.py: torch CUDA tensors through the Python
#        package, against CPU tensors (skipped without torch's CUDA).
#     5. test_cuda_codecs --bench: encode and decode-and-accumulate GB/s per
#        codec beside a device-to-device cudaMemcpy of the same bytes, in
#        the same run.
#     6. mpbench, 8 local peers over tcp on loopback, --memory=host, then
#        --memory=cuda on the device path and staged whole
#        (MP_CUDA_STAGE=1), then host and cuda with --codec=blockwise8,
#        sizes 1M to 64M, every result checked (--check=1; with cuda on the
#        device buffers, copied back).
#     7. Prints a summary: per codec encode and decode_acc GB/s; their
#        rate, the bytes one pass must read and write per second (encode:
#        the fp32 values and the payload; decode_acc: the payload and the
#        accumulator read and written) as a percentage of the device copy's
#        bytes read and written per second, and their time against the
#        copy's of the same fp32 values; whether the target (a rate of 80%
#        of the copy's for fp16, bf16, uniform8 and blockwise8) is met; per size,
#        mpbench's cuda time against its host time. Writes DIR/gpu_check.json
#        (everything, the step logs beside it).
#
#     The cuda rows are labelled by the path device memory took: "device"
#     (reduced on the GPU, chunks through a ring of pinned buffers, the
#     default), "staged" (MP_CUDA_STAGE=1: a whole-buffer pinned host copy)
#     and "device-blockwise8" (against host memory with blockwise8 too).
#
# OPTIONS
#     --out DIR        where the logs and gpu_check.json go
#                      (default ./gpu_check-YYYYmmddTHHMMSSZ)
#     --build-dir DIR  the build directory (default build-gpu; a relative one
#                      is taken in the source tree)
#     --deps DIR       .deb files (or a tree they were unpacked into, DIR/root)
#                      of what the machine lacks, e.g. libsodium23,
#                      libsodium-dev, libcmocka0, libcmocka-dev, pkgconf,
#                      pkgconf-bin, libpkgconf3, fetched where apt works with
#                      `apt-get download NAME...`; they are unpacked under
#                      DIR/root and used through PKG_CONFIG_PATH,
#                      PKG_CONFIG_SYSROOT_DIR, PATH and LD_LIBRARY_PATH
#     --build-only     steps 2 and 3 only (no GPU needed)
#     --count N        values per codec in the kernel benchmark (default 64M = 2^26)
#     --peers N        mpbench peers (default 8)
#     --min, --max     mpbench sizes (default 1M and 64M, factor 4)
#     --iters N        mpbench timed iterations per size (default 3; 1 warm-up)
#     --target PCT     the kernels' target, percent of the device copy (default 80)
#
# EXIT STATUS
#     0   every step ran; the CPU codec and kernel tests passed; mpbench found no wrong
#         element (the targets are reported, not enforced)
#     1   a CPU codec or kernel test failed, mpbench reported a wrong element or failed,
#         or a step failed or ran past its timeout
#     2   bad usage, or a missing tool or library (named)
#     77  skipped: no usable NVIDIA GPU (said why)
set -u
set -o pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
out=""
build="build-gpu"
deps=""
build_only=0
count=$((64 << 20))
peers=8
min=1M
max=64M
iters=3
target=80

usage() {
	sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

die_usage() {
	echo "gpu_check: $*" >&2
	echo "usage: tools/gpu_check.sh [--out DIR] [--build-dir DIR] [--deps DIR] [--build-only] ...; see --help" >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case $1 in
	--out) [ $# -ge 2 ] || die_usage "--out needs a value"; out=$2; shift ;;
	--build-dir) [ $# -ge 2 ] || die_usage "--build-dir needs a value"; build=$2; shift ;;
	--deps) [ $# -ge 2 ] || die_usage "--deps needs a value"; deps=$2; shift ;;
	--count) [ $# -ge 2 ] || die_usage "--count needs a value"; count=$2; shift ;;
	--peers) [ $# -ge 2 ] || die_usage "--peers needs a value"; peers=$2; shift ;;
	--min) [ $# -ge 2 ] || die_usage "--min needs a value"; min=$2; shift ;;
	--max) [ $# -ge 2 ] || die_usage "--max needs a value"; max=$2; shift ;;
	--iters) [ $# -ge 2 ] || die_usage "--iters needs a value"; iters=$2; shift ;;
	--target) [ $# -ge 2 ] || die_usage "--target needs a value"; target=$2; shift ;;
	--build-only) build_only=1 ;;
	-h | --help) usage; exit 0 ;;
	*) die_usage "unknown argument '$1'" ;;
	esac
	shift
done
for v in "$count" "$peers" "$iters" "$target"; do
	case $v in
	'' | *[!0-9]*) die_usage "'$v' is not a positive integer" ;;
	esac
done
[ -n "$out" ] || out=./gpu_check-$(date -u +%Y%m%dT%H%M%SZ)
case $build in /*) ;; *) build=$here/$build ;; esac

say() { printf '%s\n' "gpu_check: $*"; }

# ---------------------------------------------------------------------------
# 1. A usable GPU, found as mpbench finds it: dlopen libcuda.so.1, cuInit,
#    cuDeviceGetCount. Prints what it found; 1 with the reason when none.
gpu_probe() {
	if command -v python3 >/dev/null 2>&1; then
		timeout 60 python3 - <<'EOF'
import ctypes, sys
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print("no CUDA driver on this machine (%s)" % e)
    sys.exit(1)
n = ctypes.c_int(0)
r = cu.cuInit(0)
if r != 0:
    print("the CUDA driver has no usable device (cuInit returned %d; 100 is CUDA_ERROR_NO_DEVICE)" % r)
    sys.exit(1)
if cu.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value <= 0:
    print("no CUDA device (cuDeviceGetCount: %d)" % n.value)
    sys.exit(1)
name = ctypes.create_string_buffer(128)
dev = ctypes.c_int(0)
cu.cuDeviceGet(ctypes.byref(dev), 0)
cu.cuDeviceGetName(name, 128, dev)
print("%d device(s), device 0: %s" % (n.value, name.value.decode(errors="replace")))
EOF
		return
	fi
	if command -v nvidia-smi >/dev/null 2>&1 && timeout 60 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
		timeout 60 nvidia-smi -L | head -n 1
		return 0
	fi
	echo "no NVIDIA GPU found (no python3 to load libcuda.so.1, and nvidia-smi -L lists none)"
	return 1
}

if [ "$build_only" -eq 0 ]; then
	if ! gpu=$(gpu_probe); then
		say "skipped: $gpu"
		exit 77
	fi
	say "GPU: $gpu"
fi

# ---------------------------------------------------------------------------
# 2. Tools and libraries, every missing one named.
if [ -n "$deps" ]; then
	[ -d "$deps" ] || die_usage "--deps $deps: not a directory"
	deps=$(cd "$deps" && pwd)
	root=$deps/root
	if ls "$deps"/*.deb >/dev/null 2>&1; then
		command -v dpkg-deb >/dev/null 2>&1 || die_usage "--deps: dpkg-deb is needed to unpack $deps/*.deb"
		mkdir -p "$root"
		for f in "$deps"/*.deb; do
			dpkg-deb -x "$f" "$root" || die_usage "--deps: cannot unpack $f"
		done
	fi
	[ -d "$root" ] || die_usage "--deps $deps: neither .deb files nor an unpacked root/"
	# The .pc files of the packages say prefix=/usr: the sysroot puts their
	# -I and -L under $root.
	export PKG_CONFIG_SYSROOT_DIR=$root
	PKG_CONFIG_PATH=$root/usr/lib/x86_64-linux-gnu/pkgconfig:$root/usr/lib/pkgconfig:$root/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
	LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	PATH=$root/usr/bin:$PATH
	export PKG_CONFIG_PATH LD_LIBRARY_PATH PATH
fi

missing=()
cc_bin=${CC:-cc}
command -v "$cc_bin" >/dev/null 2>&1 || missing+=("a C compiler ($cc_bin; set CC)")
# nvcc compiles the host half of a .cu file with gcc in C++ mode (g++'s cc1plus).
command -v g++ >/dev/null 2>&1 || missing+=("g++ (nvcc's host compiler for .cu files)")
meson=(meson)
if ! command -v meson >/dev/null 2>&1; then
	if command -v python3 >/dev/null 2>&1 && python3 -c 'import mesonbuild' 2>/dev/null; then
		meson=(python3 -m mesonbuild.mesonmain)
	else
		missing+=("meson (>= 1.0; pip's meson package will do)")
	fi
fi
command -v ninja >/dev/null 2>&1 || missing+=("ninja")
nvcc=$(command -v nvcc 2>/dev/null || true)
[ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; }
[ -n "$nvcc" ] || missing+=("nvcc (the CUDA toolkit; looked on PATH and in /usr/local/cuda/bin)")
command -v python3 >/dev/null 2>&1 || missing+=("python3 (the summary)")
if ! command -v pkg-config >/dev/null 2>&1; then
	missing+=("pkg-config (Debian/Ubuntu: pkgconf; or give it with --deps)")
else
	pkg-config --exists libsodium || missing+=("libsodium (pkg-config libsodium; Debian/Ubuntu: libsodium-dev and libsodium23, or --deps)")
	pkg-config --exists cmocka || missing+=("cmocka (pkg-config cmocka; Debian/Ubuntu: libcmocka-dev and libcmocka0, or --deps)")
fi
if [ ${#missing[@]} -gt 0 ]; then
	say "missing, nothing was built:"
	for m in "${missing[@]}"; do
		echo "  - $m"
	done
	echo "  (this script installs nothing: the machine may have no network; see --deps)"
	exit 2
fi

mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
steps_file=$out/steps.tsv
: >"$steps_file"
failed=0

# One step: its name, its timeout in seconds, the command. Output goes to
# $out/NAME.log (and the terminal); the status, time and name to steps.tsv.
step() {
	local name=$1 limit=$2 rc t0 t1
	shift 2
	say "step $name (timeout ${limit} s): $*"
	t0=$(date +%s)
	timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log"
	rc=${PIPESTATUS[0]}
	t1=$(date +%s)
	printf '%s\t%d\t%d\n' "$name" "$rc" $((t1 - t0)) >>"$steps_file"
	if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		say "step $name ran past its ${limit} s"
	elif [ "$rc" -ne 0 ]; then
		say "step $name exited $rc"
	fi
	return "$rc"
}

# ---------------------------------------------------------------------------
# 3. Build: the CUDA kernels and staging, no DPDK, RDMA or OpenDHT; only the
#    two programs the checks run.
opts=(-Dcuda=enabled -Ddpdk=disabled -Ddpdk_gpudev=disabled -Dverbs=disabled -Dofi=disabled
	-Ddht=disabled -Dbuildtype=release -Dwerror=false)
if [ -f "$build/build.ninja" ]; then
	setup=("${meson[@]}" setup --reconfigure "$build" "${opts[@]}")
else
	setup=("${meson[@]}" setup "$build" "${opts[@]}")
fi
PATH=$(dirname "$nvcc"):$PATH
export PATH
if ! (cd "$here" && step configure 300 "${setup[@]}"); then
	say "FAILED: meson setup (log: $out/configure.log)"
	exit 1
fi
# The shared library's ninja target is named by the project's version.
version=$(sed -n "s/^ *version: '\([0-9.]*\)'.*/\1/p" "$here/meson.build" | head -1)
cpu_tests=(test_codec test_codec_quant test_codec_average test_codec_sparse test_kernels)
if ! step build 900 nice ninja -C "$build" tools/mpbench tests/unit/test_cuda_codecs \
	tests/unit/test_stage_cuda_real tests/unit/test_devpath_cuda_real "src/libmoshpit.so.$version" \
	"${cpu_tests[@]/#/tests/unit/}"; then
	say "FAILED: the build (log: $out/build.log)"
	exit 1
fi
if [ "$build_only" -eq 1 ]; then
	say "built $build/tools/mpbench and $build/tests/unit/test_cuda_codecs (--build-only)"
	exit 0
fi

# ---------------------------------------------------------------------------
# 4-6. The checks. A failure is counted and the next step still runs.
tcc=$build/tests/unit/test_cuda_codecs
mpbench=$build/tools/mpbench

# A shell of its own: step runs its command under timeout, which cannot run a function.
step cpu_codecs 120 bash -c 'rc=0
for t in "${@:2}"; do
	echo "== $t"
	"$1/tests/unit/$t" || { echo "== $t FAILED"; rc=1; }
done
exit $rc' cpu_codecs "$build" "${cpu_tests[@]}" || failed=1
step kernel_tests 240 "$tcc" || failed=1
# Staging with the caller's stream on the real driver: mp_average_start_stream
# and mp_request_stream_wait between two peers (exit 77 would mean no GPU).
step stage_stream 60 "$build/tests/unit/test_stage_cuda_real" || failed=1
# The device path against the host path, per codec, four peers (loop).
step devpath 120 "$build/tests/unit/test_devpath_cuda_real" || failed=1
step kernel_bench 180 "$tcc" --bench "$count" --json "$out/kernels.json" || failed=1
# torch CUDA tensors through the Python package (tests/python/cuda_real.py):
# skipped (77, not a failure) where python3 has no torch with CUDA.
step python_cuda 180 env MOSHPIT_LIB="$build/src/libmoshpit.so" PYTHONPATH="$here/python" \
	python3 "$here/tests/python/cuda_real.py"
rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || failed=1

# cuda: the device path (reduced on the GPU, a ring of pinned chunks);
# cuda_staged: the same buffers staged whole through the host
# (MP_CUDA_STAGE=1); and blockwise8 on host and device, to check the device
# path's codec kernels inside an average.
for run in host cuda cuda_staged host_bw8 cuda_bw8; do
	case $run in
	host*) mem=host ;;
	*) mem=cuda ;;
	esac
	extra=()
	stage=0
	case $run in
	*_bw8) extra=(--codec=blockwise8) ;;
	cuda_staged) stage=1 ;;
	esac
	step "mpbench_$run" 300 env MP_CUDA_STAGE=$stage "$mpbench" --memory=$mem --peers="$peers" \
		--transport=tcp -b "$min" -e "$max" -f 4 -n "$iters" -w 1 --check=1 "${extra[@]}" \
		--json="$out/mpbench_$run.json" || failed=1
done

# ---------------------------------------------------------------------------
# 7. Summary and gpu_check.json.
timeout 120 python3 - "$out" "$target" "$failed" "$gpu" <<'EOF'
import json, os, sys, time

out, target, failed, gpu = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
TARGET_CODECS = ["fp16", "bf16", "uniform8", "blockwise8"]

def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print("gpu_check: %s: %s" % (name, e))
        return None

steps = []
with open(os.path.join(out, "steps.tsv")) as f:
    for line in f:
        name, rc, secs = line.rstrip("\n").split("\t")
        steps.append({"step": name, "rc": int(rc), "seconds": int(secs)})
rc_of = {s["step"]: s["rc"] for s in steps}

kernels = load("kernels.json")
host = load("mpbench_host.json")
cuda = load("mpbench_cuda.json")
staged = load("mpbench_cuda_staged.json")
host_bw8 = load("mpbench_host_bw8.json")
cuda_bw8 = load("mpbench_cuda_bw8.json")
problems = []

print()
print("== CPU codecs as this machine's compiler builds them: %s" %
      ("passed" if rc_of.get("cpu_codecs") == 0 else "FAILED (rc %s)" % rc_of.get("cpu_codecs")))
if rc_of.get("cpu_codecs") != 0:
    problems.append("CPU codec tests")
print("== CUDA codec kernels: test_cuda_codecs against the CPU codecs: %s" %
      ("passed" if rc_of.get("kernel_tests") == 0 else "FAILED (rc %s)" % rc_of.get("kernel_tests")))
if rc_of.get("kernel_tests") != 0:
    problems.append("kernel tests")
print("== the device path against the host path (test_devpath_cuda_real): %s" %
      ("passed" if rc_of.get("devpath") == 0 else "FAILED (rc %s)" % rc_of.get("devpath")))
if rc_of.get("devpath") != 0:
    problems.append("device path test")

targets = {}
if kernels:
    n = kernels["count"]
    copy_rw = kernels["d2d_copy_rw_gbs"]
    print("== kernel throughput, %d values; device-to-device copy of the same fp32 bytes: %.1f GB/s"
          " copied, %.1f GB/s read + written" % (n, kernels["d2d_copy_gbs"], copy_rw))
    print("   rate: the bytes one pass must read and write per second (encode: the fp32 values and")
    print("   the payload; decode_acc: the payload and the accumulator twice), as % of the copy's;")
    print("   time: the copy's time over the kernel's. Target: rate >= %g%% for both. A sparse" % target)
    print("   decode touches only its k elements of the accumulator: no rate (n/a).")
    print("%-10s %11s %6s %6s %13s %6s %6s   target" %
          ("codec", "encode GB/s", "rate", "time", "dec_acc GB/s", "rate", "time"))
    for c in kernels["codecs"]:
        if "error" in c:
            print("%-10s encode failed: %d" % (c["codec"], c["error"]))
            if c["codec"] in TARGET_CODECS:
                targets[c["codec"]] = False
            continue
        bpv = c["bytes_per_value"]
        sparse = c["codec"] in ("topk", "adacomp")
        c["encode_traffic_gbs"] = (4.0 + bpv) * n / (c["encode_ms"] / 1e3) / 1e9
        c["encode_pct_of_copy_rate"] = 100.0 * c["encode_traffic_gbs"] / copy_rw
        if not sparse:
            c["decode_acc_traffic_gbs"] = (bpv + 8.0) * n / (c["decode_acc_ms"] / 1e3) / 1e9
            c["decode_acc_pct_of_copy_rate"] = 100.0 * c["decode_acc_traffic_gbs"] / copy_rw
        mark = ""
        if c["codec"] in TARGET_CODECS:
            met = c["encode_pct_of_copy_rate"] >= target and c["decode_acc_pct_of_copy_rate"] >= target
            targets[c["codec"]] = met
            mark = "met" if met else "NOT met"
        drate = "%5.0f%%" % c["decode_acc_pct_of_copy_rate"] if not sparse else "%6s" % "n/a"
        print("%-10s %11.1f %5.0f%% %5.0f%% %13.1f %s %5.0f%%   %s" %
              (c["codec"], c["encode_gbs"], c["encode_pct_of_copy_rate"], c["encode_pct_of_copy"],
               c["decode_acc_gbs"], drate, c["decode_acc_pct_of_copy"], mark))
        if c.get("decode_rejected"):
            problems.append("%s: decode rejected its own payload" % c["codec"])
    print("target: %s (reported, not enforced)" %
          ("met for all of " + ", ".join(TARGET_CODECS) if targets and all(targets.values())
           else "NOT met for " + ", ".join(k for k, v in targets.items() if not v)))
else:
    problems.append("no kernel benchmark")

def rows(j):
    return {r["bytes"]: r for r in j["results"]} if j else {}

def wrong(j, mem):
    if not j:
        problems.append("mpbench --memory=%s: no results" % mem)
        return
    bad = [r for r in j["results"] if r.get("wrong") != 0 or not r.get("checked")]
    if bad:
        problems.append("mpbench --memory=%s: wrong elements (or none checked) at %s" %
                        (mem, ", ".join(str(r["bytes"]) for r in bad)))
    if rc_of.get("mpbench_" + mem) != 0:
        problems.append("mpbench --memory=%s exited %s" % (mem, rc_of.get("mpbench_" + mem)))

wrong(host, "host")
wrong(cuda, "cuda")
wrong(staged, "cuda_staged")
wrong(host_bw8, "host_bw8")
wrong(cuda_bw8, "cuda_bw8")
# The path each run took, as the library says it (mp_mem_path): a run meant
# for the device path that was staged whole measured the wrong thing.
for run, want, name in ((cuda, "device", "cuda"), (staged, "staged", "cuda_staged"),
                        (cuda_bw8, "device", "cuda_bw8")):
    got = run and run["settings"].get("memory_path")
    if run and got != want:
        problems.append("mpbench_%s: the library took the %s path, not %s (its INFO line "
                        "says why: MP_DEBUG=INFO)" % (name, got, want))
# mpbench --memory=cuda by the path device memory takes: the device path
# (the default where the kernels run) and a whole-buffer pinned host copy
# (MP_CUDA_STAGE=1), each against host memory with the same codec.
cuda_runs = {"device": (host, cuda), "staged": (host, staged),
             "device-blockwise8": (host_bw8, cuda_bw8)}
ratios = []
print()
print("== mpbench, %s peers over tcp on loopback, checked: cuda against host (time = the slowest peer's mean)"
      % (host or cuda or {"settings": {"peers": "?"}})["settings"]["peers"])
print("%12s %12s %14s %8s %18s" % ("bytes", "host us", "cuda us", "ratio", "cuda path"))
for b in sorted(set(rows(host)).union(*(rows(j[1]) for j in cuda_runs.values()))):
    for path, (hrun, run) in cuda_runs.items():
        h = rows(hrun).get(b)
        c = rows(run).get(b)
        ratio = c["time_us"] / h["time_us"] if h and c and h["time_us"] else None
        ratios.append({"bytes": b, "host_us": h["time_us"] if h else None,
                       "cuda_us": c["time_us"] if c else None, "cuda_path": path,
                       "ratio": ratio, "host_wrong": h["wrong"] if h else None,
                       "cuda_wrong": c["wrong"] if c else None})
        print("%12d %12s %14s %8s %18s" % (b, "%.0f" % h["time_us"] if h else "-",
              "%.0f" % c["time_us"] if c else "-", "%.2f" % ratio if ratio else "-", path))

ok = not problems and not failed
doc = {
    "tool": "tools/gpu_check.sh",
    "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "gpu": gpu,
    "steps": steps,
    "cpu_codec_tests_passed": rc_of.get("cpu_codecs") == 0,
    "kernel_tests_passed": rc_of.get("kernel_tests") == 0,
    "devpath_test_passed": rc_of.get("devpath") == 0,
    # 77: python3 has no torch with CUDA there (skipped, not failed)
    "python_cuda": {0: "passed", 77: "skipped"}.get(rc_of.get("python_cuda"), "FAILED"),
    "kernels": kernels,
    "target_pct_of_copy": target,
    "target_codecs": TARGET_CODECS,
    "targets_met": targets,
    "mpbench": {"host": host, "host_blockwise8": host_bw8,
                "cuda": {k: v[1] for k, v in cuda_runs.items()}, "cuda_vs_host": ratios},
    "problems": problems,
    "passed": ok,
}
with open(os.path.join(out, "gpu_check.json"), "w") as f:
    json.dump(doc, f, indent=1)
print()
for p in problems:
    print("gpu_check: FAILED: " + p)
print("gpu_check: %s; everything is in %s/gpu_check.json" % ("passed" if ok else "FAILED", out))
sys.exit(0 if ok else 1)
EOF
exit $?
