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
        for s in bed["systems"]:
            rows = sorted((r["bytes"], r["time_us"]) for r in s["rows"] if r["time_us"])
            if not rows:
                continue
            style = "--" if s["system"] in ("gloo", "openmpi") else "-"
            ax.plot([b for b, _ in rows], [t / 1e3 for _, t in rows], style, marker="o",
                    markersize=3, label=s["system"])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes, fp32)")
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
