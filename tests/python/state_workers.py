# SPDX-License-Identifier: BSD-3-Clause
"""Server processes of test_state.py (spawned: importable by name; no torch,
so that they start fast)."""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

import numpy as np


def content(n: int, seed: int) -> np.ndarray:
    """A state of n float32 values with no zero byte (a zero marks "not
    arrived yet" in the joiner's buffer)."""
    v = (np.arange(n, dtype=np.uint32) * np.uint32(2654435761) + np.uint32(seed)) | 0x01010101
    return v.view(np.float32)


def averaging_server(rank: int, n: int, run: str, nvalues: int, versions: list, rates: list,
                     stop: Any, q_addr: Any, q_peers: Any, q_out: Any) -> None:
    """Serve a state of nvalues float32 (version versions[rank], each
    download at most rates[rank] bytes/s, "" unlimited) and, with n > 1,
    average 256 KiB vectors with the others back to back until stop is
    set; report when each average ended."""
    try:
        version = versions[rank]
        if rates[rank]:
            os.environ["MP_STATE_RATE"] = rates[rank]
        import moshpit
        ctx = moshpit.Context(rank=rank, npeers=n, listen="127.0.0.1:0", run_name=run,
                              run_key="state-key", connect_timeout_ms=20000,
                              round_timeout_ms=2000, allreduce_timeout_ms=3000)
        state = ctx.serve_state("127.0.0.1:0")
        ctx.publish_state([content(nvalues, version)], version=version,
                          meta=f"v{version}".encode())
        q_addr.put((rank, (ctx.address, state, os.getpid())))
        ctx.set_peers(q_peers.get(timeout=60))
        x = np.ones(65536, dtype=np.float32)
        ends = []
        deadline = time.monotonic() + 120
        while n > 1 and not stop.is_set() and time.monotonic() < deadline:
            try:
                ctx.average(x)
            except moshpit.Error:
                break  # the others stopped, or one was killed
            ends.append(time.time())
        stop.wait(120)  # keep serving state until the test is done
        q_out.put((rank, (ends, ctx.stats().state_served), None))
        ctx.close()
    except BaseException:  # noqa: BLE001 - reported to the test
        q_out.put((rank, None, traceback.format_exc()))
