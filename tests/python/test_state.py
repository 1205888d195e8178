# SPDX-License-Identifier: BSD-3-Clause
"""State download from Python: a joiner fetches 100 MB from the most advanced
of 4 peer processes that keep averaging meanwhile; a server killed with
SIGKILL mid-transfer; a stranger; the torch helpers."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

import moshpit
import moshpit.torch as mt
import state_workers
from conftest import spawn_peers


def _joiner(run: str, key: str = "state-key") -> moshpit.Context:
    return moshpit.Context(transport="loop", npeers=1, rank=0, run_name=run, run_key=key,
                           round_timeout_ms=2000, connect_timeout_ms=2000)


def test_joiner_fetches_100mb_while_4_peers_average():
    nvalues = 25 << 20  # 100 MiB of float32
    stop = mp.get_context("spawn").Event()
    out = {}

    def during(infos, run):
        try:
            addrs = [state for _, state, _ in infos]
            dest = np.zeros(nvalues, dtype=np.float32)
            with _joiner(run) as j:
                time.sleep(1.0)  # the peers settle into averaging
                t0 = time.time()
                got = j.fetch_state(addrs, [dest], timeout=120)
                t1 = time.time()
            out.update(got=got, t0=t0, t1=t1, dest=dest, addrs=addrs)
            time.sleep(0.3)
        finally:
            stop.set()

    results = spawn_peers(state_workers.averaging_server, 4,
                          (nvalues, [100, 103, 101, 102], ["", "", "", ""], stop), during=during)
    got = out["got"]
    assert got.version == 103 and got.source == out["addrs"][1]
    assert got.meta == b"v103" and got.tries == 1 and got.resumed == 0
    assert got.bytes == 100 << 20
    np.testing.assert_array_equal(out["dest"].view(np.uint32),
                                  state_workers.content(nvalues, 103).view(np.uint32))
    # Every peer kept averaging while the download ran.
    for ends, _ in results:
        assert any(out["t0"] <= t <= out["t1"] for t in ends), (len(ends), out["t1"] - out["t0"])
    assert results[1][1] >= 2  # its version query and the download


def test_server_killed_mid_transfer_joiner_completes_from_another():
    nvalues = 12 << 20  # 48 MiB
    stop = mp.get_context("spawn").Event()
    out = {}

    def during(infos, run):
        try:
            addrs = [state for _, state, _ in infos]
            dest = np.zeros(nvalues, dtype=np.float32)
            res = {}

            def fetch():
                with _joiner(run) as j:
                    try:
                        res["got"] = j.fetch_state(addrs, [dest], timeout=120)
                    except moshpit.Error as e:
                        res["err"] = e
            t = threading.Thread(target=fetch)
            t.start()
            # Server 0 sends 24 MiB/s: a quarter of the way is ~0.5 s in.
            u = dest.view(np.uint32)
            deadline = time.monotonic() + 60
            while u[nvalues // 4] == 0 and t.is_alive():
                assert time.monotonic() < deadline
                time.sleep(0.002)
            os.kill(infos[0][2], signal.SIGKILL)
            out["killed_at"] = int(np.count_nonzero(u))
            t.join(120)
            assert not t.is_alive()
            out.update(res, dest=dest, addrs=addrs)
        finally:
            stop.set()

    # Two peers with the same state; the first is slow and dies mid-transfer.
    spawn_peers(state_workers.averaging_server, 2, (nvalues, [7, 7], ["24M", ""], stop),
                during=during, dead=[0])
    assert "err" not in out, out.get("err")
    got = out["got"]
    assert got.source == out["addrs"][1] and got.tries == 2
    assert got.resumed >= (nvalues // 4) * 4 and got.resumed < nvalues * 4
    np.testing.assert_array_equal(out["dest"].view(np.uint32),
                                  state_workers.content(nvalues, 7).view(np.uint32))


def test_stranger_gets_nothing():
    with moshpit.Context(transport="loop", npeers=1, rank=0, run_name="st", run_key="a") as srv, \
            moshpit.Context(transport="loop", npeers=1, rank=0, run_name="st", run_key="b") as x:
        addr = srv.serve_state()
        srv.publish_state([np.arange(100, dtype=np.float32)], version=1, meta=b"secret")
        dest = np.zeros(100, dtype=np.float32)
        with pytest.raises(moshpit.PeerFailure) as ei:
            x.fetch_state([addr], [dest], timeout=5)
        assert ei.value.errno == 13 and "refused us" in ei.value.message
        with pytest.raises(moshpit.PeerFailure):
            x.query_state([addr], timeout=5)
        assert not dest.any()
        assert srv.stats().state_refused == 2 and srv.stats().state_served == 0


def test_query_lengths_and_errors():
    with moshpit.Context(transport="loop", npeers=1, rank=0, run_name="sq", run_key="a") as srv, \
            moshpit.Context(transport="loop", npeers=1, rank=0, run_name="sq", run_key="a") as j:
        addr = srv.serve_state()
        with pytest.raises(moshpit.NotFound, match="published nothing"):
            j.query_state([addr], timeout=5)
        srv.publish_state([np.ones(10, dtype=np.float32), b"abc", torch.zeros(2, 3)], version=9,
                          meta=b"m")
        info = j.query_state([addr], timeout=5)
        assert (info.version, info.lens, info.meta, info.source) == (9, [40, 3, 24], b"m", addr)
        with pytest.raises(moshpit.LengthMismatch, match="other lengths"):
            j.fetch_state([addr], [np.zeros(10, dtype=np.float32)], timeout=5)
        a, b, c = np.zeros(10, dtype=np.float32), bytearray(3), torch.ones(2, 3)
        got = j.fetch_state([addr], [a, b, c], timeout=5)
        assert got.version == 9 and (a == 1).all() and b == b"abc" and not c.any()
        with pytest.raises(moshpit.InvalidArgument):
            j.fetch_state([], [a], timeout=5)


def test_load_state_from_peers_restores_model_and_optimizer():
    def net(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                   torch.nn.Linear(8, 2))
    with moshpit.Context(transport="loop", npeers=1, rank=0, run_name="sl", run_key="a") as srv, \
            moshpit.Context(transport="loop", npeers=1, rank=0, run_name="sl", run_key="a") as j:
        addr = srv.serve_state()
        m1, m2 = net(0), net(1)
        o1 = torch.optim.Adam(m1.parameters(), lr=0.01, betas=(0.8, 0.9))
        for _ in range(3):
            o1.zero_grad()
            m1(torch.randn(5, 4)).sum().backward()
            o1.step()
        mt.publish_state(srv, m1, o1, step=17)
        o2 = torch.optim.Adam(m2.parameters(), lr=0.5)
        ptrs = [p.data_ptr() for p in m2.parameters()]
        assert mt.load_state_from_peers(j, m2, o2, [addr]) == 17
        assert [p.data_ptr() for p in m2.parameters()] == ptrs  # in place
        for (k, x), y in zip(m1.state_dict().items(), m2.state_dict().values()):
            assert torch.equal(x, y), k
        s1, s2 = o1.state_dict(), o2.state_dict()
        assert s2["param_groups"] == s1["param_groups"]  # lr 0.01, betas (0.8, 0.9)
        for k in s1["state"]:
            for name in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(s1["state"][k][name], s2["state"][k][name])
        # Another architecture is refused, naming what differs.
        other = torch.nn.Sequential(torch.nn.Linear(4, 9))
        with pytest.raises(moshpit.InvalidArgument, match="0.weight"):
            mt.load_state_from_peers(j, other, None, [addr])
