# SPDX-License-Identifier: BSD-3-Clause
"""CUDA memory from Python, against a FAKE of the CUDA driver and kernels.

meson test python_cuda_fake runs this file with MOSHPIT_LIB set to
libmoshpit_fakecuda.so (tests/python/fakecuda.c): libmoshpit with the fake
of tests/fakes/fake_cuda.c behind its seams. The fake's device memory
faults on any host access outside its own copies, so a Python layer (or a
library) that read or wrote it directly would crash the test. Arrays here
are handed over by ``__cuda_array_interface__``, the protocol of CuPy,
Numba and torch CUDA tensors; torch on this machine has no CUDA, and
tools/gpu_check.sh averages real torch CUDA tensors on a GPU.
"""

from __future__ import annotations

import ctypes
import gc
import os
from typing import Optional

import numpy as np
import pytest

import moshpit
from conftest import loop_peers, run_threads

if not os.environ.get("MOSHPIT_FAKE_CUDA"):
    pytest.skip("runs against libmoshpit_fakecuda.so: meson test python_cuda_fake",
                allow_module_level=True)

_fk = ctypes.CDLL(os.environ["MOSHPIT_LIB"])  # the library moshpit loaded: one fake
_fk.fkpy_mem_init.restype = ctypes.c_void_p
_fk.fkpy_mem_init.argtypes = [ctypes.c_int, ctypes.c_size_t]
_fk.fkpy_mem_fini.argtypes = [ctypes.c_int]
_fk.fkpy_write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
_fk.fkpy_read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
_fk.fkpy_host_peak.restype = ctypes.c_size_t
_fk.fkpy_stream_new.restype = ctypes.c_void_p
_fk.fkpy_stream_new.argtypes = [ctypes.c_int]
_fk.fkpy_stream_sync_free.argtypes = [ctypes.c_void_p, ctypes.c_int]
_fk.fkpy_kernel_write.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                  ctypes.c_size_t, ctypes.c_int]


class FakeCudaArray:
    """Peer ``rank``'s fake device buffer of ``n`` float32, as CuPy would
    hand it over (``typestr`` and ``stream`` may be changed)."""

    def __init__(self, rank: int, n: int, typestr: str = "<f4",
                 stream: Optional[int] = None) -> None:
        self.rank, self.n = rank, n
        self.ptr = _fk.fkpy_mem_init(rank, 4 * n)
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr,
                                         "data": (self.ptr, False), "version": 3,
                                         "strides": None, "stream": stream}

    def write(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=np.float32)
        _fk.fkpy_write(self.rank, a.ctypes.data, a.nbytes)

    def read(self) -> np.ndarray:
        out = np.empty(self.n, dtype=np.float32)
        _fk.fkpy_read(self.rank, out.ctypes.data, out.nbytes)
        return out

    def free(self) -> None:
        _fk.fkpy_mem_fini(self.rank)


def inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [(rng.standard_normal(n) * (i + 1)).astype(np.float32) for i in range(4)]


def host_reference(xs: list[np.ndarray], **config) -> list[np.ndarray]:
    """The same averages of host memory: what the device path must give."""
    ctxs = loop_peers(4, **config)
    try:
        hs = [x.copy() for x in xs]
        run_threads([lambda c=c, h=h: c.average(h) for c, h in zip(ctxs, hs)])
        return hs
    finally:
        for c in ctxs:
            c.close()


@pytest.mark.parametrize("codec", ["none", "blockwise8", "topk"])
def test_cuda_array_averaged_on_the_device(codec):
    n = 200_000  # 800 KB a peer; chunks of 4 KiB
    xs = inputs(n)
    want = host_reference(xs, codec=codec, chunk_bytes=4096)
    _fk.fkpy_reset()
    ctxs = loop_peers(4, codec=codec, chunk_bytes=4096)
    arrs = [FakeCudaArray(r, n) for r in range(4)]
    try:
        for a, x in zip(arrs, xs):
            a.write(x)
        res = run_threads([lambda c=c, a=a: c.average(a) for c, a in zip(ctxs, arrs)])
        for a, w, r in zip(arrs, want, res):
            np.testing.assert_array_equal(a.read(), w)  # bit for bit the host path's
            assert r.peers == 4 and r.failed_peers == 0 and r.codec == codec
        # Reduced on the device (its own allocations), through a ring of
        # chunks: the pinned host memory of all four registrations is less
        # than one buffer.
        assert _fk.fkpy_dev_peak() > 0
        assert _fk.fkpy_host_peak() < 4 * n
        # And it says so: the device path, not GPUDirect over loop.
        path, why = ctxs[0].memory_path(arrs[0])
        assert path == "device" and "no GPUDirect RDMA: transport loop" in why, (path, why)
        assert ctxs[0].memory_path(xs[0]) == ("host", "host memory")
        if codec == "none":
            np.testing.assert_array_equal(arrs[0].read(), (xs[0] + xs[1] + xs[2] + xs[3]) / 4)
    finally:
        for c in ctxs:
            c.close()
        for a in arrs:
            a.free()


def test_flush_on_the_device():
    """topk on CUDA arrays keeps its error feedback on the (fake) GPU; a
    flush (flush=True, MP_AVG_FLUSH) folds it in there: two averages and a
    flush, bit for bit the host path's, the last one exact."""
    n = 3001
    xs = inputs(n)
    ctxs = loop_peers(4, codec="topk")
    try:
        hs = [x.copy() for x in xs]
        for flush in (False, True):
            run_threads([lambda c=c, h=h: c.average(h, flush=flush) for c, h in zip(ctxs, hs)])
    finally:
        for c in ctxs:
            c.close()
    ctxs = loop_peers(4, codec="topk")
    arrs = [FakeCudaArray(r, n) for r in range(4)]
    try:
        for a, x in zip(arrs, xs):
            a.write(x)
        for flush in (False, True):
            res = run_threads([lambda c=c, a=a: c.average(a, flush=flush)
                               for c, a in zip(ctxs, arrs)])
            assert all(r.codec == ("none" if flush else "topk") for r in res)
        want = np.mean(np.stack(xs).astype(np.float64), axis=0)
        for a, h in zip(arrs, hs):
            got = a.read()
            np.testing.assert_array_equal(got, h)
            np.testing.assert_allclose(got, want, atol=1e-5)
    finally:
        for c in ctxs:
            c.close()
        for a in arrs:
            a.free()


def test_the_interface_stream_is_waited_for():
    """A kernel on the array's stream writes the input 50 ms after the call,
    over stale values: the average is of what the kernel wrote, and a
    stream told to wait (Handle.stream_wait) is accepted."""
    n = 3001
    xs = inputs(n)
    want = host_reference(xs)
    ctxs = loop_peers(4)
    streams = [_fk.fkpy_stream_new(r) for r in range(4)]
    arrs = [FakeCudaArray(r, n, stream=streams[r]) for r in range(4)]
    try:
        for a in arrs:
            a.write(np.full(n, -1000.0, dtype=np.float32))

        def one(r: int) -> moshpit.Result:
            _fk.fkpy_kernel_write(streams[r], r, xs[r].ctypes.data, xs[r].nbytes, 50)
            h = ctxs[r].average_async(arrs[r])
            h.stream_wait(streams[r])  # what the stream runs next sees the average
            return h.wait(30)
        res = run_threads([lambda r=r: one(r) for r in range(4)])
        for a, w, r in zip(arrs, want, res):
            np.testing.assert_array_equal(a.read(), w)
            assert r.peers == 4
        for s in streams:
            assert _fk.fkpy_stream_sync_free(s, 5000) == 0
    finally:
        for c in ctxs:
            c.close()
        for a in arrs:
            a.free()


def test_registration_kept_then_released():
    """One registration per buffer, used again by the next average, and
    released when the array is collected."""
    n = 1000
    ctxs = loop_peers(4)
    arrs = [FakeCudaArray(r, n) for r in range(4)]
    try:
        for a in arrs:
            a.write(np.arange(n, dtype=np.float32) * (a.rank + 1))
        for _ in range(2):
            run_threads([lambda c=c, a=a: c.average(a) for c, a in zip(ctxs, arrs)])
            assert [len(c._mrs) for c in ctxs] == [1, 1, 1, 1]
        np.testing.assert_array_equal(arrs[3].read(), np.arange(n, dtype=np.float32) * 2.5)
        for a in arrs:
            a.free()
        del a
        arrs.clear()
        gc.collect()
        assert [len(c._mrs) for c in ctxs] == [0, 0, 0, 0]
    finally:
        for c in ctxs:
            c.close()
        for a in arrs:
            a.free()


@pytest.mark.parametrize("bad, what", [
    ({"typestr": "<f8"}, "only float32"),
    ({"strides": (8,)}, "contiguous"),
    ({"data": None}, "read-only"),
])
def test_bad_cuda_arrays_are_refused(bad, what):
    ctxs = loop_peers(4)
    a = FakeCudaArray(0, 16)
    try:
        a.write(np.arange(16, dtype=np.float32))
        cai = dict(a.__cuda_array_interface__)
        cai.update(bad)
        if "data" in bad:
            cai["data"] = (a.ptr, True)
        a.__cuda_array_interface__ = cai
        with pytest.raises(moshpit.InvalidArgument, match=what):
            ctxs[0].average(a)
        np.testing.assert_array_equal(a.read(), np.arange(16, dtype=np.float32))
        assert not ctxs[0]._mrs
    finally:
        for c in ctxs:
            c.close()
        a.free()
