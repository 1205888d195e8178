#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Plot tools/bench_wan.sh's results: time against size, one line per system,
one PNG per bed (rate and delay), log-log.

    wan_plot.py RESULTS.json OUTDIR     writes OUTDIR/wan-RATE-DELAY.png
"""

from __future__ import annotations

import json
import os
import sys


def size_label(b: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    with open(argv[0], encoding="utf-8") as f:
        doc = json.load(f)
    for bed in doc["beds"]:
        fig, ax = plt.subplots(figsize=(8, 5.5))
        sizes: set[int] = set()
        for i, s in enumerate(bed["systems"]):
            rows = sorted((r["bytes"], r["time_us"]) for r in s["rows"] if r["time_us"])
            if not rows:
                continue
            sizes.update(b for b, _ in rows)
            # The baselines dashed and thick; 20 distinct colours, as more
            # than the default cycle's 10 systems run.
            base = s["system"] in ("gloo", "openmpi")
            ax.plot([b for b, _ in rows], [t / 1e3 for _, t in rows], "--" if base else "-",
                    marker="o", markersize=3, linewidth=2.2 if base else 1.2,
                    color=plt.cm.tab20(i % 20), label=s["system"])
        ax.set_xscale("log", base=2)
        ticks = sorted(sizes)
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(b) for b in ticks], fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("message size (fp32; K, M: 2^10, 2^20 bytes)")
        ax.set_ylabel("time of one all-reduce (ms)")
        rtt = f", round trip {bed['rtt_ms']:.2f} ms" if bed.get("rtt_ms") is not None else ""
        ax.set_title(f"{bed['peers']} peers, {bed['rate']} uplinks, delay {bed['delay']}{rtt}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = os.path.join(argv[1], f"wan-{bed['rate']}-{bed['delay']}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"wan_plot: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
