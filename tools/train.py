#!/usr/bin/env -S /usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Data-parallel training with moshpit against torch DDP, with and without
preemption (doc/training.md).

A small MLP learns scikit-learn's bundled digits (8x8 images, 10 classes),
each peer a process with its own shard. Modes:

  ddp    torch DistributedDataParallel, gloo all-reduce, fp32. A killed peer
         makes every peer restart from the last checkpoint, as torchelastic
         does (the launcher kills the others and starts all N again).
  grad   moshpit gradient mode (moshpit.torch.Optimizer, codec none): every
         step averages the gradients. A killed peer is replaced by a new
         process that downloads the state from the others and joins.
  param  moshpit parameter mode (local SGD) with blockwise8 (8-bit): every
         4 steps the parameters average in the background.
  adacomp  grad with the AdaComp codec (error feedback): to measure its
         compression on these real gradients (the study runs it once).

    tools/train.py study [--peers=4] [--seconds=40] [--preempt=6] [--wan=1gbit] [--out=DIR]
    tools/train.py run --mode=grad [--preempt=SECONDS] [--seconds=40] [--out=DIR]
    tools/train.py plot --out=DIR [--wan=...] [--plot=PNG]   (again, from DIR/study.json)

``--wan=RATE`` (root) puts each peer in its own network namespace of
tools/wan_bed.sh, its uplink shaped with tbf to RATE (``--delay=D`` adds a
one-way delay); each run makes its own bed and removes it, also on failure.

``--preempt=S`` kills a random peer with SIGKILL every S seconds on average
(exponential gaps, seeded). Each run writes one JSON line per evaluation;
the study writes study.json and PNG plots (loss and accuracy against wall
time) into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import Optional

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"


# ---------------------------------------------------------------- the task

def data(rank: int, peers: int):
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(y))
    x = torch.tensor(x[idx] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[idx], dtype=torch.long)
    ntest = 360
    xt, yt, xr, yr = x[:ntest], y[:ntest], x[ntest:], y[ntest:]
    return xr[rank::peers], yr[rank::peers], xt, yt


def model():
    import torch
    torch.manual_seed(0)  # every peer starts from the same weights
    return torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10))


def evaluate(net, xt, yt) -> tuple[float, float]:
    import torch
    with torch.no_grad():
        out = net(xt)
        return (torch.nn.functional.cross_entropy(out, yt).item(),
                (out.argmax(1) == yt).float().mean().item())


BATCH = 32
LR = 0.01
EVAL_EVERY = 10


def batch(xs, ys, step: int):
    n = len(ys)
    i = (step * BATCH) % n
    j = i + BATCH
    if j <= n:
        return xs[i:j], ys[i:j]
    import torch
    return torch.cat([xs[i:], xs[:j - n]]), torch.cat([ys[i:], ys[:j - n]])


# ---------------------------------------------------------------- workers

def worker(a) -> int:
    import torch
    torch.set_num_threads(1)
    xs, ys, xt, yt = data(a.rank, a.peers)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    log = open(a.log, "a", buffering=1)
    hosts = a.hosts.split(",") if a.hosts else ["127.0.0.1"] * a.peers
    step = 0
    extra = {}
    if a.mode == "ddp":
        import datetime
        import torch.distributed as dist
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "wan0" if a.hosts else "lo")
        dist.init_process_group("gloo", init_method=f"tcp://{hosts[0]}:{a.port}", rank=a.rank,
                                world_size=a.peers, timeout=datetime.timedelta(seconds=20))
        ckpt = os.path.join(a.dir, "ckpt.pt")
        if os.path.exists(ckpt):
            st = torch.load(ckpt)
            net.load_state_dict(st["model"])
            opt.load_state_dict(st["opt"])
            step = st["step"]
        ddp = torch.nn.parallel.DistributedDataParallel(net)
        fwd, stepper = ddp, opt
    else:
        import moshpit
        import moshpit.torch as mt
        peers = [f"{hosts[r]}:{a.port + r}" for r in range(a.peers)]
        ctx = moshpit.Context(rank=a.rank, npeers=a.peers, peers=peers, run_name=a.dir,
                              run_key="train",
                              codec={"param": "blockwise8", "adacomp": "adacomp"}.get(a.mode, "none"),
                              connect_timeout_ms=1000, round_timeout_ms=1000,
                              allreduce_timeout_ms=3000, probe_max_ms=2000)
        ctx.serve_state(f"{hosts[a.rank]}:{a.port + 100 + a.rank}")
        if a.join:
            sources = [f"{hosts[r]}:{a.port + 100 + r}" for r in range(a.peers) if r != a.rank]
            step = mt.load_state_from_peers(ctx, net, opt, sources, timeout=30)
        stepper = mt.Optimizer(ctx, optimizer=opt, mode="parameters" if a.mode == "param"
                               else "gradients", every=4)
        fwd = net
        extra["ratio"] = []
    t_end = a.t0 + a.seconds
    failed = 0
    while time.time() < t_end:
        bx, by = batch(xs, ys, step * a.peers + a.rank)
        stepper.zero_grad()
        loss = torch.nn.functional.cross_entropy(fwd(bx), by)
        loss.backward()
        try:
            stepper.step()
        except Exception as e:  # moshpit.Error: a group lost a peer mid-average
            failed += 1
            log.write(json.dumps({"t": time.time() - a.t0, "error": str(e)[:200]}) + "\n")
            continue
        step += 1
        if a.mode != "ddp":
            r = stepper.last_result
            if r and a.mode != "param" and r[0].bytes_sent:
                extra["ratio"].append(4 * r[0].values_sent / r[0].bytes_sent)
            # Gradient mode never averages parameters: a joiner stays as
            # far from the others as its state was old, so there publish
            # every step (a 4 MiB copy); parameter mode resyncs anyway.
            if a.mode != "param" or step % 5 == 0:
                mt.publish_state(ctx, net, opt, step)
        elif a.rank == 0 and step % 20 == 0:
            tmp = os.path.join(a.dir, "ckpt.tmp")
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, os.path.join(a.dir, "ckpt.pt"))
        if step % EVAL_EVERY == 0:
            vl, acc = evaluate(net, xt, yt)
            rec = {"t": time.time() - a.t0, "step": step, "rank": a.rank, "loss": vl, "acc": acc}
            if extra.get("ratio"):
                rec["ratio"] = sum(extra["ratio"]) / len(extra["ratio"])
                extra["ratio"] = []
            log.write(json.dumps(rec) + "\n")
    log.write(json.dumps({"t": time.time() - a.t0, "done": step, "failed": failed}) + "\n")
    return 0


# ---------------------------------------------------------------- launcher

def launch(mode: str, peers: int, seconds: float, preempt: float, out: str, seed: int,
           wan: str = "", delay: str = "") -> dict:
    """Run one configuration (in a WAN bed of its own with ``wan``)."""
    if not wan:
        return _launch(mode, peers, seconds, preempt, out, seed, None)
    bed = [os.path.join(TOP, "tools", "wan_bed.sh")]
    up = subprocess.run(bed + ["up", f"--peers={peers}", f"--rate={wan}"] +
                        ([f"--delay={delay}"] if delay else []),
                        capture_output=True, text=True, timeout=60)
    if up.returncode:
        raise SystemExit(f"train: wan_bed.sh up failed: {up.stderr.strip()}")
    bed_id = up.stdout.split()[-1]
    try:
        return _launch(mode, peers, seconds, preempt, out, seed, bed_id)
    finally:
        subprocess.run(bed + ["down", bed_id], timeout=60)


def _launch(mode: str, peers: int, seconds: float, preempt: float, out: str, seed: int,
            bed: Optional[str]) -> dict:
    d = os.path.join(out, f"{mode}-{'preempt' if preempt else 'clean'}")
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    rng = random.Random(seed)
    env = dict(os.environ, PYTHONPATH=os.path.join(TOP, "python"), OMP_NUM_THREADS="1")
    env.setdefault("MOSHPIT_LIB", os.path.join(TOP, "build", "src", "libmoshpit.so"))
    port = rng.randrange(20000, 50000, 200)
    t0 = time.time() + (4 if mode == "ddp" else 2)  # imports first: torch takes seconds
    procs: dict[int, subprocess.Popen] = {}
    events = []

    def start(rank: int, join: bool, ddp_port: int) -> None:
        # ip netns exec execs the worker: its pid is the one to kill.
        ns = ["ip", "netns", "exec", f"mpw-{bed}-{rank}"] if bed else []
        args = ns + [PY, os.path.abspath(__file__), "worker", f"--mode={mode}", f"--rank={rank}",
                f"--peers={peers}", f"--port={ddp_port}", f"--dir={d}", f"--t0={t0}",
                f"--seconds={seconds}", f"--log={os.path.join(d, f'rank{rank}.jsonl')}"]
        if join:
            args.append("--join")
        if bed:
            args.append("--hosts=" + ",".join(f"10.77.0.{r + 1}" for r in range(peers)))
        procs[rank] = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                                       stderr=open(os.path.join(d, f"stderr{rank}.txt"), "a"))

    for r in range(peers):
        start(r, False, port)
    next_kill = t0 + rng.expovariate(1 / preempt) if preempt else float("inf")
    restarts = 0
    while time.time() < t0 + seconds:
        time.sleep(0.05)
        now = time.time()
        if now >= next_kill and now < t0 + seconds - 2:
            victim = rng.randrange(peers)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            events.append({"t": now - t0, "killed": victim})
            if mode == "ddp":
                # torchelastic: every worker stops and all restart from the
                # last checkpoint, on a fresh rendezvous.
                for p in procs.values():
                    p.send_signal(signal.SIGKILL)
                    p.wait()
                restarts += 1
                port += 7
                for r in range(peers):
                    start(r, False, port)
            else:
                start(victim, True, port)
            next_kill = now + rng.expovariate(1 / preempt)
    deadline = time.time() + 30
    for p in procs.values():
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    evals = []
    for r in range(peers):
        path = os.path.join(d, f"rank{r}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                evals += [json.loads(line) for line in f if line.strip()]
    return {"mode": mode, "preempt": preempt, "events": events, "restarts": restarts,
            "evals": [e for e in evals if "acc" in e],
            # The last 2 s: peers that end first leave the others alone.
            "errors": sum(1 for e in evals if "error" in e and e["t"] < seconds - 2),
            "steps": [e["done"] for e in evals if "done" in e]}


def summarize(run: dict, target: float) -> dict:
    ev = sorted((e for e in run["evals"] if e["rank"] == 0), key=lambda e: e["t"])
    hit = next((e["t"] for e in ev if e["acc"] >= target), None)
    last = ev[-5:]
    ratios = [e["ratio"] for e in run["evals"] if "ratio" in e]
    return {"mode": run["mode"], "preempt": run["preempt"], "kills": len(run["events"]),
            "time_to_target_s": hit,
            "final_acc": sum(e["acc"] for e in last) / len(last) if last else None,
            "steps_rank0": max((e["step"] for e in ev), default=0),
            "failed_steps": run["errors"],
            "wire_ratio": sum(ratios) / len(ratios) if ratios else None}


def plot(runs: list[dict], out: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in runs:
        if run["mode"] == "adacomp":
            continue
        ev = sorted((e for e in run["evals"] if e["rank"] == 0), key=lambda e: e["t"])
        label = f"{run['mode']}" + (f", preempt {run['preempt']:g} s" if run["preempt"] else "")
        style = "--" if run["preempt"] else "-"
        color = {"ddp": "tab:blue", "grad": "tab:orange", "param": "tab:green"}[run["mode"]]
        axes[0].plot([e["t"] for e in ev], [e["loss"] for e in ev], style, color=color,
                     label=label)
        axes[1].plot([e["t"] for e in ev], [e["acc"] for e in ev], style, color=color,
                     label=label)
        for k in run["events"]:
            axes[1].axvline(k["t"], color="grey", alpha=0.15)
    axes[0].set(xlabel="wall time (s)", ylabel="test loss (rank 0)", yscale="log")
    axes[1].set(xlabel="wall time (s)", ylabel="test accuracy (rank 0)", ylim=(0.5, 1.0))
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["study", "run", "worker", "plot"])
    ap.add_argument("--mode", choices=["ddp", "grad", "param", "adacomp"], default="grad")
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--preempt", type=float, default=0)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="/tmp/moshpit-train")
    ap.add_argument("--plot", default=None, help="study: PNG path (default OUT/training.png)")
    # worker only
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--dir", default="")
    ap.add_argument("--t0", type=float, default=0)
    ap.add_argument("--log", default="")
    ap.add_argument("--join", action="store_true")
    ap.add_argument("--hosts", default="")
    ap.add_argument("--wan", default="", help="shape each peer's uplink to this rate (root)")
    ap.add_argument("--delay", default="", help="with --wan: one-way delay, say 10ms")
    a = ap.parse_args()
    if a.cmd == "worker":
        return worker(a)
    os.makedirs(a.out, exist_ok=True)
    if a.cmd == "plot":  # again, from a study's study.json
        with open(os.path.join(a.out, "study.json")) as f:
            runs = json.load(f)["runs"]
    elif a.cmd == "run":
        runs = [launch(a.mode, a.peers, a.seconds, a.preempt, a.out, a.seed, a.wan, a.delay)]
    else:
        preempt = a.preempt or 6.0
        runs = [launch(m, a.peers, a.seconds, p, a.out, a.seed, a.wan, a.delay)
                for p in (0, preempt) for m in ("ddp", "grad", "param")]
        runs.append(launch("adacomp", a.peers, a.seconds, 0, a.out, a.seed, a.wan, a.delay))
    rows = [summarize(r, a.target) for r in runs]
    if a.cmd != "plot":
        with open(os.path.join(a.out, "study.json"), "w") as f:
            json.dump({"target": a.target, "peers": a.peers, "seconds": a.seconds, "rows": rows,
                       "runs": runs}, f)
    print(f"{'mode':6} {'preempt':>7} {'kills':>5} {'to ' + str(a.target):>8} {'final acc':>9} "
          f"{'steps':>6} {'failed':>6} {'wire x':>7}")
    for r in rows:
        tt = f"{r['time_to_target_s']:.1f}" if r["time_to_target_s"] is not None else "never"
        fa = f"{r['final_acc']:.4f}" if r["final_acc"] is not None else "-"
        wr = f"{r['wire_ratio']:.2f}" if r["wire_ratio"] else "-"
        print(f"{r['mode']:6} {r['preempt']:7g} {r['kills']:5d} {tt:>8} {fa:>9} "
              f"{r['steps_rank0']:6d} {r['failed_steps']:6d} {wr:>7}")
    if a.cmd in ("study", "plot"):
        where = f"each peer's uplink {a.wan}" + (f", {a.delay} delay" if a.delay else "") \
            if a.wan else "loopback"
        plot(runs, a.plot or os.path.join(a.out, "training.png"),
             f"digits MLP, {a.peers} peers on 2 cores, {where} (grey: SIGKILLs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
