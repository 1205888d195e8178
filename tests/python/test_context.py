# SPDX-License-Identifier: BSD-3-Clause
"""moshpit.Context: averages in place, conversions, async handles, errors."""

from __future__ import annotations

import array
import threading
import time

import numpy as np
import pytest
import torch

import moshpit
from conftest import loop_peers, run_threads


def test_numpy_average_in_place_is_exact(peers4):
    xs = [np.arange(1000, dtype=np.float32) * (i + 1) for i in range(4)]
    ptrs = [x.ctypes.data for x in xs]
    res = run_threads([lambda c=c, x=x: c.average(x) for c, x in zip(peers4, xs)])
    want = np.arange(1000, dtype=np.float32) * 2.5  # (1+2+3+4)/4: exact in fp32
    for x, p, r in zip(xs, ptrs, res):
        assert x.ctypes.data == p
        np.testing.assert_array_equal(x, want)
        assert r.peers == 4 and r.failed_peers == 0 and r.codec == "none"
        assert r.bytes_sent > 0


def test_weighted_average(peers4):
    xs = [np.full(17, float(i), dtype=np.float32) for i in range(4)]
    w = [1.0, 0.0, 2.0, 1.0]
    run_threads([lambda c=c, x=x, w=w: c.average(x, weight=w) for c, x, w in zip(peers4, xs, w)])
    for x in xs:  # (0*1 + 1*0 + 2*2 + 3*1) / 4 = 7/4
        np.testing.assert_array_equal(x, np.full(17, 1.75, dtype=np.float32))


def test_torch_tensor_in_place_same_data_ptr(peers4):
    ts = [torch.full((3, 5), float(i)) for i in range(4)]
    ptrs = [t.data_ptr() for t in ts]
    run_threads([lambda c=c, t=t: c.average(t) for c, t in zip(peers4, ts)])
    for t, p in zip(ts, ptrs):
        assert t.data_ptr() == p
        assert torch.equal(t, torch.full((3, 5), 1.5))


def test_parameter_with_grad_is_averaged_in_place(peers4):
    ps = [torch.nn.Parameter(torch.full((8,), float(i))) for i in range(4)]
    run_threads([lambda c=c, p=p: c.average(p) for c, p in zip(peers4, ps)])
    for p in ps:
        assert p.requires_grad and torch.equal(p.detach(), torch.full((8,), 1.5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_tensors_through_a_copy(peers4, dtype):
    ts = [torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=dtype) * (i + 1) for i in range(4)]
    ptrs = [t.data_ptr() for t in ts]
    run_threads([lambda c=c, t=t: c.average(t) for c, t in zip(peers4, ts)])
    for t, p in zip(ts, ptrs):
        assert t.dtype == dtype and t.data_ptr() == p
        assert torch.equal(t, torch.tensor([2.5, 5.0, 7.5, 10.0], dtype=dtype))


def test_numpy_float16_and_strided_views(peers4):
    bases = [np.zeros(10, dtype=np.float32) + 100 for _ in range(4)]
    views = [b[::2] for b in bases]
    for i, v in enumerate(views):
        v[:] = i
    halves = [np.full(6, i, dtype=np.float16) for i in range(4)]
    run_threads([lambda c=c, v=v, h=h: (c.average(v), c.average(h))
                 for c, v, h in zip(peers4, views, halves)])
    for b, h in zip(bases, halves):
        np.testing.assert_array_equal(b[::2], np.full(5, 1.5, dtype=np.float32))
        np.testing.assert_array_equal(b[1::2], np.full(5, 100, dtype=np.float32))  # untouched
        np.testing.assert_array_equal(h, np.full(6, 1.5, dtype=np.float16))


def test_noncontiguous_tensor_written_back(peers4):
    ms = [torch.full((4, 6), float(i)) for i in range(4)]
    cols = [m[:, 1] for m in ms]  # stride 6
    run_threads([lambda c=c, t=t: c.average(t) for c, t in zip(peers4, cols)])
    for m in ms:
        assert torch.equal(m[:, 1], torch.full((4,), 1.5))
        assert torch.equal(m[:, 0], m[:, 2])  # neighbours unchanged


def test_array_module_buffer(peers4):
    arrs = [array.array("f", [float(i)] * 9) for i in range(4)]
    run_threads([lambda c=c, a=a: c.average(a) for c, a in zip(peers4, arrs)])
    for a in arrs:
        assert list(a) == [1.5] * 9


@pytest.mark.parametrize("bad, what", [
    (np.zeros(4, dtype=np.float64), "float64"),
    (np.zeros(4, dtype=np.int32), "int32"),
    (np.zeros(0, dtype=np.float32), "empty"),
    (torch.zeros(4, dtype=torch.float64), "float64"),
    (torch.zeros(0), "empty"),
    (array.array("d", [1.0]), "format"),
    (memoryview(bytearray(8)).toreadonly().cast("f"), "writable"),
    ([1.0, 2.0], "list"),
])
def test_refused_buffers_change_nothing(peers4, bad, what):
    with pytest.raises(moshpit.InvalidArgument) as ei:
        peers4[0].average(bad)
    assert what in str(ei.value)
    assert ei.value.errno == 22 and isinstance(ei.value, ValueError)


def test_read_only_array_is_refused(peers4):
    a = np.ones(4, dtype=np.float32)
    a.flags.writeable = False
    with pytest.raises(moshpit.InvalidArgument, match="read-only"):
        peers4[0].average(a)


def test_bad_weight_raises_before_sending(peers4):
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(moshpit.InvalidArgument, match="weight"):
        peers4[0].average(x, weight=-1.0)
    with pytest.raises(moshpit.InvalidArgument, match="weight"):
        peers4[0].average(x, weight="1")
    assert np.all(x == 1)


def test_length_mismatch_names_both_counts():
    a, b = loop_peers(2)
    try:
        xa, xb = np.ones(10, dtype=np.float32), np.full(12, 3.0, dtype=np.float32)
        with pytest.raises(moshpit.LengthMismatch) as ei:
            run_threads([lambda: a.average(xa), lambda: b.average(xb)])
        assert ei.value.errno == 90 and "10" in ei.value.message and "12" in ei.value.message
        assert np.all(xa == 1) and np.all(xb == 3)  # nothing applied
    finally:
        a.close()
        b.close()


def test_settings_mismatch_names_the_setting():
    run = f"py-codec-{time.monotonic_ns()}"
    a = moshpit.Context(transport="loop", run_name=run, listen=f"loop:{run}-0", rank=0, npeers=2)
    b = moshpit.Context(transport="loop", run_name=run, listen=f"loop:{run}-1", rank=1, npeers=2,
                        codec="fp16")
    try:
        for c in (a, b):
            c.set_peers([a.address, b.address])
        x = np.ones(64, dtype=np.float32)
        y = np.ones(64, dtype=np.float32)
        errs = []

        def go(c, v):
            try:
                c.average(v)
            except moshpit.Error as e:
                errs.append(e)
        run_threads([lambda: go(a, x), lambda: go(b, y)])
        assert errs and all(isinstance(e, moshpit.SettingsMismatch) for e in errs)
        assert any("codec" in e.message for e in errs)
    finally:
        a.close()
        b.close()


def test_config_errors():
    with pytest.raises(moshpit.InvalidArgument, match=r"topk ratio 5 out of range"):
        moshpit.Context(transport="loop", codec="topk:5")
    with pytest.raises(TypeError, match="unknown setting 'nodes'"):
        moshpit.Context(transport="loop", nodes=3)
    with pytest.raises(moshpit.InvalidArgument, match="algo 'tree'"):
        moshpit.Context(transport="loop", algo="tree")
    with pytest.raises(moshpit.InvalidArgument, match="out of range"):
        moshpit.Context(transport="loop", window=1 << 40)
    with pytest.raises(moshpit.Error) as ei:
        moshpit.Context(transport="no-such-transport", npeers=1, rank=0)
    assert ei.value.errno == 2 and "no-such-transport" in str(ei.value)


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("MP_CODEC", "blockwise8:1024")
    with moshpit.Context(transport="loop", npeers=1, rank=0) as c:
        assert c.codec == "blockwise8"
    with moshpit.Context(transport="loop", npeers=1, rank=0, codec="fp16") as c:  # a keyword wins
        assert c.codec == "fp16"
    monkeypatch.setenv("MP_CODEC", "bogus")
    with pytest.raises(moshpit.InvalidArgument, match="MP_CODEC=bogus"):
        moshpit.Context(transport="loop", npeers=1, rank=0)


def test_list_and_tuple_settings():
    with moshpit.Context(transport="loop", grid=(2, 2), npeers=4, rank=0,
                         peers=[f"loop:lt-{i}" for i in range(4)], bandwidths=[1, 2, 3, 4]) as c:
        assert c.rank == 0 and c.npeers == 4
        assert [p.addr for p in c.peers()] == [f"loop:lt-{i}" for i in range(4)]
        assert [p.weight for p in c.peers()] == [1.0, 2.0, 3.0, 4.0]
        assert c.peers()[0].state == "self"


def test_async_handles_done_and_wait(peers4):
    xs = [np.full(4096, float(i), dtype=np.float32) for i in range(4)]
    h0 = peers4[0].average_async(xs[0])
    # Peers 1-3 have not started: a short wait runs out, and the average goes on.
    with pytest.raises(moshpit.Timeout) as ei:
        h0.wait(timeout=0.05)
    assert isinstance(ei.value, TimeoutError)
    assert not h0.done()
    hs = [h0] + [c.average_async(x) for c, x in zip(peers4[1:], xs[1:])]
    deadline = time.monotonic() + 30
    while not all(h.done() for h in hs):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    for h, x in zip(hs, xs):
        r = h.wait()
        assert r.peers == 4
        assert h.wait() is r  # a finished handle keeps its result
        np.testing.assert_array_equal(x, np.full(4096, 1.5, dtype=np.float32))


def test_async_keeps_the_buffer_alive(peers4):
    hs = [c.average_async(np.full(1000, float(i), dtype=np.float32)) for i, c in enumerate(peers4)]
    import gc
    gc.collect()
    for h in hs:
        assert h.wait(30).peers == 4


def test_gil_is_released_while_averaging(peers4):
    ticks = 0
    stop = threading.Event()

    def spin():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    xs = [np.full(8, float(i), dtype=np.float32) for i in range(4)]
    t = threading.Thread(target=spin)
    t.start()
    try:
        before = []

        def late(i):
            time.sleep(0.3)  # peer 0 blocks in average() meanwhile
            before.append(ticks)
            return peers4[i].average(xs[i])
        run_threads([lambda: peers4[0].average(xs[0])] +
                    [lambda i=i: late(i) for i in range(1, 4)])
    finally:
        stop.set()
        t.join()
    assert min(before) > 50  # the spinner ran while peer 0 waited in C
    np.testing.assert_array_equal(xs[0], np.full(8, 1.5, dtype=np.float32))


def test_close_cancels_in_flight_and_refuses_more():
    a, b = loop_peers(2)
    x = np.ones(100, dtype=np.float32)
    h = a.average_async(x)
    a.close()
    with pytest.raises(moshpit.Closed):
        h.wait(5)
    assert h.done()
    with pytest.raises(moshpit.Closed, match="closed"):
        a.average(x)
    a.close()  # twice is fine
    b.close()


def test_stats_and_peers_after_an_average(peers4):
    xs = [np.ones(64, dtype=np.float32) for _ in range(4)]
    run_threads([lambda c=c, x=x: c.average(x) for c, x in zip(peers4, xs)])
    s = peers4[0].stats()
    assert s.peers_known == 4 and s.frames_rejected == 0
    info = peers4[0].peers()
    assert len(info) == 4 and [p.state for p in info] == ["self", "live", "live", "live"]
    assert sum(p.bytes_sent for p in info) > 0


def test_uncompressed_flag_is_exact_under_a_lossy_codec():
    ctxs = loop_peers(2, codec="uniform8")
    try:
        xs = [np.linspace(0, 1, 500, dtype=np.float32) + i for i in range(2)]
        want = (xs[0] + xs[1]) / 2
        rs = run_threads([lambda c=c, x=x: c.average(x, uncompressed=True)
                          for c, x in zip(ctxs, xs)])
        assert all(r.codec == "none" for r in rs)
        for x in xs:
            np.testing.assert_array_equal(x, want)
    finally:
        for c in ctxs:
            c.close()


def test_flush_delivers_what_topk_held_back():
    """topk keeps most values back (error feedback): after one average the
    peers are far from the mean; a flush of the same buffers, async on half
    of them, delivers the rest: every peer then holds the exact mean."""
    ctxs = loop_peers(4, codec="topk:0.05")
    try:
        rng = np.random.default_rng(5)
        xs = [rng.standard_normal(2000).astype(np.float32) for _ in range(4)]
        want = np.mean(np.stack(xs).astype(np.float64), axis=0)
        rs = run_threads([lambda c=c, x=x: c.average(x) for c, x in zip(ctxs, xs)])
        assert all(r.codec == "topk" for r in rs)
        assert np.max(np.abs(xs[0] - want)) > 0.1
        rs = run_threads([(lambda c=c, x=x: c.average(x, flush=True)) if i % 2 else
                          (lambda c=c, x=x: c.average_async(x, flush=True).wait(30))
                          for i, (c, x) in enumerate(zip(ctxs, xs))])
        assert all(r.codec == "none" for r in rs)
        for x in xs:
            np.testing.assert_allclose(x, want, atol=1e-5)
    finally:
        for c in ctxs:
            c.close()


def test_tensor_on_another_device_is_refused_clearly(peers4):
    t = torch.zeros(4, device="meta")  # neither CPU nor CUDA (test_cuda_fake.py: CUDA)
    with pytest.raises(moshpit.Unsupported, match="CPU and CUDA tensors"):
        peers4[0].average(t)
