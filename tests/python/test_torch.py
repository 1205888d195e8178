# SPDX-License-Identifier: BSD-3-Clause
"""moshpit.torch: gradient mode against full-batch SGD (4 processes over
tcp), parameter mode converging, ParameterAverager under
PostLocalSGDOptimizer, and the DDP hook (2 processes, gloo for DDP itself)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from torch.distributed.optim import PostLocalSGDOptimizer

import moshpit
import moshpit.torch as mt
import workers
from conftest import loop_peers, run_threads, spawn_peers

torch.set_num_threads(1)


def test_gradient_mode_follows_full_batch_sgd_with_4_processes():
    steps = 20
    got = spawn_peers(workers.gradient_worker, 4, (steps,))
    want = workers.sgd_full_batch(steps)
    moved = max((w - p0).abs().max().item()
                for w, p0 in zip(want, workers.Net().parameters()))
    assert moved > 0.05  # the comparison means something: training moved the weights
    for params in got:
        for p, w in zip(params, want):
            torch.testing.assert_close(torch.tensor(p), w, rtol=0, atol=2e-5)


def test_ddp_hook_one_average_per_step():
    store = f"/tmp/moshpit-ddp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        got = spawn_peers(workers.ddp_worker, 2, (store,))
    finally:
        if os.path.exists(store):
            os.unlink(store)
    for errs, buckets, averages in got:
        assert max(errs) < 1e-5, errs
        assert averages == 3  # one per step (one dtype)
        assert buckets > averages  # DDP made several buckets per step


def _regression(seed: int, n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g) + seed  # each peer's shard from its own distribution
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def test_parameter_mode_converges():
    ctxs = loop_peers(4)
    models = []
    for i in range(4):
        torch.manual_seed(10 + i)  # peers start apart
        models.append(torch.nn.Linear(4, 1, bias=False))
    opts = [mt.Optimizer(c, optimizer=torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.5),
                         mode="parameters", every=2) for c, m in zip(ctxs, models)]
    barrier = threading.Barrier(4, timeout=60)

    def train(i):
        x, y = _regression(i)
        for _ in range(150):
            opts[i].zero_grad()
            torch.nn.functional.mse_loss(models[i](x), y).backward()
            opts[i].step()
        opts[i].finish()
        barrier.wait()
        return opts[i].local_step
    try:
        assert run_threads([lambda i=i: train(i) for i in range(4)], timeout=120) == [150] * 4
    finally:
        for c in ctxs:
            c.close()
    ws = torch.stack([m.weight.detach().reshape(-1) for m in models])
    target = torch.tensor([1.0, -2.0, 0.5, 3.0])
    assert (ws - target).abs().max() < 0.05, ws
    assert (ws - ws.mean(0)).abs().max() < 0.02, ws
    # The optimizer state was averaged too: every peer's momentum is there.
    assert all(len(o.state) == 1 for o in opts)


def _steps_with_gradient_i(ctxs: list, ms: list, opts: list, steps: int) -> None:
    """Peer i takes `steps` steps, each with gradient i (lr 0: the weights
    move only by the averages), then applies the last average; the
    contexts are closed."""
    def run(i: int) -> None:
        for _ in range(steps):
            ms[i].weight.grad = torch.full((1, 2), float(i))
            opts[i].step()
        opts[i].finish()
    try:
        run_threads([lambda i=i: run(i) for i in range(len(ctxs))])
    finally:
        for c in ctxs:
            c.close()


def test_parameter_mode_state_is_averaged():
    ctxs = loop_peers(2)
    ms = [torch.nn.Linear(2, 1, bias=False) for _ in range(2)]
    with torch.no_grad():
        ms[0].weight.fill_(1.0)
        ms[1].weight.fill_(3.0)
    opts = [mt.Optimizer(c, optimizer=torch.optim.SGD(m.parameters(), lr=0.0, momentum=0.9),
                         mode="parameters", every=1) for c, m in zip(ctxs, ms)]
    _steps_with_gradient_i(ctxs, ms, opts, 1)
    for m, o in zip(ms, opts):
        assert torch.equal(m.weight.detach(), torch.full((1, 2), 2.0))
        assert torch.equal(o.state[m.weight]["momentum_buffer"], torch.full((1, 2), 0.5))


def test_parameter_mode_late_state():
    """An average that ends a step late moves the momentum as averages that
    ended at once would have. every=1: the average started at step 1 is
    applied at step 2 (waited for there if not done), one momentum step
    after its snapshot. With constant gradients 0 and 1 and momentum 0.5,
    averaging at once each step gives 0.5, then 0.5 * 0.5 + g = 0.25 and
    1.25, averaged 0.75. Replacing the state with the late average gave
    0.5: one step of momentum lost."""
    ctxs = loop_peers(2)
    ms = [torch.nn.Linear(2, 1, bias=False) for _ in range(2)]
    opts = [mt.Optimizer(c, optimizer=torch.optim.SGD(m.parameters(), lr=0.0, momentum=0.5),
                         mode="parameters", every=1) for c, m in zip(ctxs, ms)]
    _steps_with_gradient_i(ctxs, ms, opts, 2)
    for m, o in zip(ms, opts):
        assert torch.equal(o.state[m.weight]["momentum_buffer"], torch.full((1, 2), 0.75))


def test_post_local_sgd_with_parameter_averager():
    ctxs = loop_peers(3)
    models = []
    for i in range(3):
        torch.manual_seed(i)
        models.append(torch.nn.Linear(4, 2))
    opts = [PostLocalSGDOptimizer(optim=torch.optim.SGD(m.parameters(), lr=0.1),
                                  averager=mt.ParameterAverager(c, period=2, warmup_steps=1))
            for c, m in zip(ctxs, models)]
    snaps = [[] for _ in range(3)]

    def train(i):
        x, y = _regression(i, 8)
        for _ in range(6):
            opts[i].zero_grad()
            out = models[i](x)
            torch.nn.functional.mse_loss(out, torch.cat([y, y], 1)).backward()
            opts[i].step()
            snaps[i].append(torch.cat([p.detach().reshape(-1) for p in models[i].parameters()]))
    try:
        run_threads([lambda i=i: train(i) for i in range(3)])
    finally:
        for c in ctxs:
            c.close()
    for step in range(6):
        same = all(torch.equal(snaps[0][step], snaps[i][step]) for i in (1, 2))
        # PeriodicModelAverager's schedule: averages at steps 1, 3, 5 (after warmup 1, period 2)
        assert same == (step in (1, 3, 5)), step


def test_optimizer_argument_errors():
    ctxs = loop_peers(1)
    try:
        m = torch.nn.Linear(2, 1)
        with pytest.raises(moshpit.InvalidArgument, match="mode"):
            mt.Optimizer(ctxs[0], optimizer=torch.optim.SGD(m.parameters(), lr=0.1), mode="x")
        with pytest.raises(moshpit.InvalidArgument, match="every"):
            mt.Optimizer(ctxs[0], optimizer=torch.optim.SGD(m.parameters(), lr=0.1), every=0)
        with pytest.raises(moshpit.InvalidArgument, match="per run"):
            mt.Optimizer(ctxs[0], optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                         codec="blockwise8")
        # hivemind's form: a factory and the parameters
        opt = mt.Optimizer(ctxs[0], m.parameters(),
                           lambda ps: torch.optim.SGD(ps, lr=0.1))
        assert isinstance(opt.optimizer, torch.optim.SGD)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        m(torch.ones(1, 2)).sum().backward()
        opt.step()
        sched.step()
        assert opt.optimizer.param_groups[0]["lr"] == 0.05
    finally:
        ctxs[0].close()
