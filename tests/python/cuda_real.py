# SPDX-License-Identifier: BSD-3-Clause
"""torch CUDA tensors through the Python package on a real GPU (run by
tools/gpu_check.sh; test_cuda_fake.py checks the same against a fake).

Four contexts of one run on the loop transport, in threads of this process,
average float32 CUDA tensors (codec none and blockwise8), an fp16 CUDA
tensor (through a float32 copy on the device), an async average that the
tensor's stream waits for, and topk with a flush; each result must be the
CPU tensors' average bit for bit (fp16: the float32 result rounded once). Exit 0 when all agree,
1 otherwise, 77 when torch has no CUDA device.
"""

from __future__ import annotations

import sys
import threading

import torch

import moshpit

N = 100_003


def peers(**config) -> list[moshpit.Context]:
    run = f"cuda-real-{config.get('codec', 'none')}-{threading.get_ident()}"
    ctxs = [moshpit.Context(transport="loop", run_name=run, listen=f"loop:{run}-{i}", rank=i,
                            npeers=4, **config) for i in range(4)]
    addrs = [c.address for c in ctxs]
    for c in ctxs:
        c.set_peers(addrs)
    return ctxs


def together(fns) -> list:
    out, errs = [None] * len(fns), []

    def body(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 - reported below
            errs.append(e)
    ts = [threading.Thread(target=body, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    if errs:
        raise errs[0]
    return out


def inputs(dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(N, generator=g) * (r + 1)).to(dtype) for r in range(4)]


def check(name: str, got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    ok = all(torch.equal(g.cpu(), w) for g, w in zip(got, want))
    diff = max(float((g.cpu().float() - w.float()).abs().max()) for g, w in zip(got, want))
    print(f"{name}: {'ok' if ok else 'FAILED'} (largest difference from the CPU's {diff:g})")
    return ok


def case(codec: str, dtype: torch.dtype, asynchronous: bool) -> bool:
    xs = inputs(dtype)
    host = [x.clone() for x in xs]
    ctxs = peers(codec=codec)
    try:
        together([lambda c=c, h=h: c.average(h) for c, h in zip(ctxs, host)])
    finally:
        for c in ctxs:
            c.close()
    dev = [x.cuda() for x in xs]
    ctxs = peers(codec=codec)
    try:
        if asynchronous:
            def one(c: moshpit.Context, t: torch.Tensor) -> None:
                h = c.average_async(t)
                h.stream_wait()  # torch's current stream waits on the device
                t.mul_(1.0)      # queued behind the wait: reads the average
                h.wait(60)
            together([lambda c=c, t=t: one(c, t) for c, t in zip(ctxs, dev)])
        else:
            together([lambda c=c, t=t: c.average(t) for c, t in zip(ctxs, dev)])
        torch.cuda.synchronize()
    finally:
        for c in ctxs:
            c.close()
    return check(f"codec {codec}, {dtype}{', async' if asynchronous else ''}", dev, host)


def sparse_flush() -> bool:
    """topk on CUDA tensors: its error feedback on the GPU, an average and a
    flush, against CPU tensors (bit for bit: topk's GPU encoder is the
    CPU's)."""
    xs = inputs()
    host = [x.clone() for x in xs]
    dev = [x.cuda() for x in xs]
    for ts in (host, dev):
        ctxs = peers(codec="topk")
        try:
            for flush in (False, True):
                together([lambda c=c, t=t: c.average(t, flush=flush) for c, t in zip(ctxs, ts)])
            torch.cuda.synchronize()
        finally:
            for c in ctxs:
                c.close()
    return check("codec topk, an average and a flush", dev, host)


def main() -> int:
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        return 77
    ok = True
    ok &= case("none", torch.float32, False)
    ok &= case("blockwise8", torch.float32, False)
    ok &= case("none", torch.float16, False)
    ok &= case("none", torch.float32, True)
    ok &= sparse_flush()
    print("ok: torch CUDA tensors average as CPU tensors do" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
