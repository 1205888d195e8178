# SPDX-License-Identifier: BSD-3-Clause
"""Helpers for the moshpit package's tests: peers as threads of this process
over the loop transport, and a runner that bounds every thread."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
from typing import Any, Callable, Optional, Sequence

import pytest

sys.path.insert(0, os.path.dirname(__file__))

if not os.environ.get("MOSHPIT_LIB"):
    pytest.exit("MOSHPIT_LIB is not set: run through meson test (or set it to "
                "build/src/libmoshpit.so)", returncode=77)

import moshpit  # noqa: E402

_runs = itertools.count()


def loop_peers(n: int, **config: Any) -> list[moshpit.Context]:
    """n contexts of one fresh run on the loop transport, peers set."""
    run = f"py-{os.getpid()}-{next(_runs)}"
    ctxs = [moshpit.Context(transport="loop", run_name=run, listen=f"loop:{run}-{i}",
                            rank=i, npeers=n, **config) for i in range(n)]
    addrs = [c.address for c in ctxs]
    for c in ctxs:
        c.set_peers(addrs)
    return ctxs


def run_threads(fns: Sequence[Callable[[], Any]], timeout: float = 60.0) -> list[Any]:
    """Run each function in its own thread; return their results, or raise
    the first exception. Fails the test if any is still running at timeout."""
    out: list[Any] = [None] * len(fns)
    errs: list[BaseException | None] = [None] * len(fns)

    def body(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errs[i] = e

    ts = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
        assert not t.is_alive(), f"a peer thread still runs after {timeout} s"
    for e in errs:
        if e is not None:
            raise e
    return out


def spawn_peers(target: Callable[..., None], n: int, extra: tuple, timeout: float = 240.0,
                during: Optional[Callable[[list, str], None]] = None,
                dead: Sequence[int] = ()) -> list:
    """Start n peer processes (target(rank, n, run, *extra, q_addr, q_peers,
    q_out)), hand each the list of the addresses they put on q_addr (an
    address, or a tuple that starts with one), run ``during`` with what they
    put there and the run name, then collect what each puts on q_out (but
    the ranks in ``dead``, which ``during`` kills: None for them); kill them
    all at the end, whatever happens."""
    ctx = mp.get_context("spawn")
    q_addr, q_peers, q_out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    run = f"pyproc-{os.getpid()}-{time.monotonic_ns()}"
    procs = [ctx.Process(target=target, args=(r, n, run, *extra, q_addr, q_peers, q_out))
             for r in range(n)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + timeout
        addrs = {}
        while len(addrs) < n:
            try:
                r, a = q_addr.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"peers did not start within {timeout} s (have {sorted(addrs)})")
            addrs[r] = a
        infos = [addrs[r] for r in range(n)]
        for _ in range(n):
            q_peers.put([a[0] if isinstance(a, tuple) else a for a in infos])
        if during is not None:
            during(infos, run)
        out = {}
        while len(out) < n - len(dead):
            try:
                r, value, err = q_out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"peers did not finish within {timeout} s (done: {sorted(out)})")
            assert err is None, f"peer {r}:\n{err}"
            out[r] = value
        return [out.get(r) for r in range(n)]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()



@pytest.fixture
def peers4():
    ctxs = loop_peers(4)
    yield ctxs
    for c in ctxs:
        c.close()
