#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Time Gloo's all-reduce through torch.distributed, one process per peer.

Run by tools/bench_wan.sh, one process in each namespace of a WAN bed:

    wan_gloo.py --rank=I --world=N --master=10.77.0.1:29400 \\
        --sizes=4096,16384 --iters=3 --warmup=1 --json=out.json

Every rank all-reduces (SUM) an fp32 tensor of each size: --warmup untimed
calls, then --iters timed ones, each after a barrier so that every rank
starts it together. Per iteration the slowest rank's time counts (a MAX
all-reduce of the times, after the timed loop); rank 0 writes the median
and the mean of those, in microseconds, as JSON. The input of rank r is
r + 1 everywhere, so the sum is N(N+1)/2 exactly in fp32; every rank counts
the elements that differ after its last call and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", required=True, help="host:port of rank 0's store")
    p.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0, help="Gloo timeout, seconds")
    p.add_argument("--json", help="rank 0 writes the results here")
    args = p.parse_args(argv)
    if args.world < 1 or not 0 <= args.rank < args.world:
        p.error("need 0 <= rank < world")
    if args.iters < 1 or args.warmup < 0:
        p.error("need iters >= 1 and warmup >= 0")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if any(s <= 0 or s % 4 for s in sizes):
        print("wan_gloo: sizes must be positive multiples of 4", file=sys.stderr)
        return 2
    t_import = time.monotonic()
    import torch  # noqa: E402 - timed: the import alone takes seconds
    import torch.distributed as dist

    t_import = time.monotonic() - t_import
    # Gloo would otherwise bind to the address the host name resolves to,
    # which in a namespace of the bed is not wan0's.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "wan0")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}",
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    # bench_wan.sh --kill waits for this line before it kills a peer.
    print(f"wan_gloo: rank {args.rank}: connected", file=sys.stderr, flush=True)
    want = args.world * (args.world + 1) / 2
    rows = []
    bad_total = 0
    for size in sizes:
        count = size // 4
        src = torch.full((count,), float(args.rank + 1), dtype=torch.float32)
        buf = torch.empty_like(src)
        times = []
        for it in range(args.warmup + args.iters):
            buf.copy_(src)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            dt = time.perf_counter() - t0
            if it >= args.warmup:
                times.append(dt)
        wrong = int((buf != want).sum().item())
        bad_total += wrong
        worst = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        wrong_all = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(wrong_all, op=dist.ReduceOp.SUM)
        per_iter = [t * 1e6 for t in worst.tolist()]
        rows.append(
            {
                "bytes": size,
                "time_us": statistics.median(per_iter),
                "mean_us": statistics.fmean(per_iter),
                "iter_us": per_iter,
                "wrong": int(wrong_all.item()),
            }
        )
        if args.rank == 0:
            print(f"wan_gloo: {size} B median {rows[-1]['time_us']:.1f} us", file=sys.stderr)
    dist.destroy_process_group()
    if args.rank == 0 and args.json:
        doc = {
            "system": "gloo",
            "torch": torch.__version__,
            "world": args.world,
            "iters": args.iters,
            "warmup": args.warmup,
            "time_is": "median over iterations of the slowest rank's time",
            "import_s": t_import,
            "results": rows,
        }
        tmp = args.json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.json)
    if bad_total:
        print(f"wan_gloo: rank {args.rank}: {bad_total} wrong elements", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
