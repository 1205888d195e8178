#!/usr/bin/env -S /usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""State download while peers average: N peer processes average 256 KiB
vectors back to back over tcp on loopback and each serves a state of SIZE
MiB; a joiner downloads the most advanced one. Prints the download's time
and rate, and each peer's averages per second before, during and after it
(the point: servers keep averaging while they serve).

    MOSHPIT_LIB=build/src/libmoshpit.so tools/bench_state.py [--peers=4] [--mib=100]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(top, "python"), os.path.join(top, "tests", "python")]
os.environ.setdefault("MOSHPIT_LIB", os.path.join(top, "build", "src", "libmoshpit.so"))


def main() -> int:
    import numpy as np
    import moshpit
    import state_workers
    from conftest import spawn_peers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds of averaging before")
    a = ap.parse_args()
    nvalues = (a.mib << 20) // 4
    stop = mp.get_context("spawn").Event()
    out: dict = {}

    def during(infos, run):
        try:
            addrs = [s for _, s, _ in infos]
            dest = np.zeros(nvalues, dtype=np.float32)
            with moshpit.Context(transport="loop", npeers=1, rank=0, run_name=run,
                                 run_key="state-key") as j:
                time.sleep(a.settle)
                t0 = time.time()
                got = j.fetch_state(addrs, [dest], timeout=300)
                t1 = time.time()
            time.sleep(a.settle)
            out.update(t0=t0, t1=t1, got=got)
        finally:
            stop.set()

    versions = [100 + r for r in range(a.peers)]
    res = spawn_peers(state_workers.averaging_server, a.peers,
                      (nvalues, versions, [""] * a.peers, stop), during=during, timeout=600)
    t0, t1 = out["t0"], out["t1"]
    d = t1 - t0
    print(f"download: {a.mib} MiB in {d:.3f} s ({a.mib / d:.0f} MiB/s), version "
          f"{out['got'].version} from {out['got'].source}")
    for r, (ends, served) in enumerate(res):
        before = sum(1 for t in ends if t0 - 2.0 <= t < t0) / 2.0
        dur = sum(1 for t in ends if t0 <= t <= t1) / d
        after = sum(1 for t in ends if t1 + 0.5 <= t < t1 + 2.5) / 2.0
        print(f"peer {r}: averages/s before {before:.1f}, during {dur:.1f}, after {after:.1f}"
              f" (state answers {served})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
