# SPDX-License-Identifier: BSD-3-Clause
"""Helpers for the moshpit package's tests: peers as threads of this process
over the loop transport, and a runner that bounds every thread."""

from __future__ import annotations

import itertools
import os
import sys
import threading
from typing import Any, Callable, Sequence

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


@pytest.fixture
def peers4():
    ctxs = loop_peers(4)
    yield ctxs
    for c in ctxs:
        c.close()
