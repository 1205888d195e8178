# SPDX-License-Identifier: BSD-3-Clause
"""Bodies of the peer processes of test_torch.py (spawned: importable by name)."""

from __future__ import annotations

import os
import traceback
from typing import Any

import torch


def make_data(n: int = 64, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x @ torch.linspace(-1, 1, 8)).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 1)
        self.unused = torch.nn.Parameter(torch.ones(3))  # never gets a gradient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def sgd_full_batch(steps: int) -> list[torch.Tensor]:
    """The single-process reference of the gradient-mode test."""
    x, y = make_data()
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def _context(rank: int, n: int, run: str, q_addr: Any, q_peers: Any) -> Any:
    import moshpit
    ctx = moshpit.Context(rank=rank, npeers=n, listen="127.0.0.1:0", run_name=run,
                          run_key="test-key", connect_timeout_ms=20000)
    q_addr.put((rank, ctx.address))
    ctx.set_peers(q_peers.get(timeout=60))
    return ctx


def gradient_worker(rank: int, n: int, run: str, steps: int, q_addr: Any, q_peers: Any,
                    q_out: Any) -> None:
    try:
        torch.set_num_threads(1)
        import moshpit.torch as mt
        ctx = _context(rank, n, run, q_addr, q_peers)
        x, y = make_data()
        xs, ys = x[rank::n], y[rank::n]  # equal shards
        net = Net()
        opt = mt.Optimizer(ctx, optimizer=torch.optim.SGD(net.parameters(), lr=0.05,
                                                          momentum=0.9), mode="gradients")
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(xs), ys).backward()
            opt.step()
        # Plain lists: a tensor would travel as shared memory that dies with this process.
        q_out.put((rank, [p.detach().tolist() for p in net.parameters()], None))
        ctx.close()
    except BaseException:  # noqa: BLE001 - reported to the test
        q_out.put((rank, None, traceback.format_exc()))


class Wide(torch.nn.Module):
    """Big enough that DDP makes several buckets (its first holds 1 MiB)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 600)
        self.b = torch.nn.Linear(600, 600)
        self.c = torch.nn.Linear(600, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def ddp_worker(rank: int, n: int, run: str, store: str, q_addr: Any, q_peers: Any,
               q_out: Any) -> None:
    try:
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch.distributed as dist
        import moshpit.torch as mt
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n)
        ctx = _context(rank, n, run, q_addr, q_peers)
        model = torch.nn.parallel.DistributedDataParallel(Wide(), bucket_cap_mb=0.5)
        state = mt.DDPHookState(ctx)
        model.register_comm_hook(state, mt.ddp_comm_hook)
        ref = Wide()
        errs = []
        for step in range(3):
            batches = [make_data(16, seed=100 * step + r) for r in range(n)]
            model.zero_grad()
            torch.nn.functional.mse_loss(model(batches[rank][0]), batches[rank][1]).backward()
            # The reference: every peer's gradient, averaged here.
            ref.load_state_dict(model.module.state_dict())
            want = [torch.zeros_like(p) for p in ref.parameters()]
            for bx, by in batches:
                ref.zero_grad()
                torch.nn.functional.mse_loss(ref(bx), by).backward()
                for w, p in zip(want, ref.parameters()):
                    w += p.grad / n
            errs.append(max((p.grad - w).abs().max().item()
                            for p, w in zip(model.module.parameters(), want)))
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
        q_out.put((rank, (errs, state.buckets, state.averages), None))
        ctx.close()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the test
        q_out.put((rank, None, traceback.format_exc()))
