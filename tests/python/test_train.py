# SPDX-License-Identifier: BSD-3-Clause
"""tools/train.py end to end, short: 2 peers in gradient mode, one of them
killed with SIGKILL and replaced by a process that downloads the state."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_train_grad_mode_survives_a_kill(tmp_path):
    # Seed 5: one kill, of rank 0 at 5.4 s. Seed 3 killed rank 1 1.8 s after
    # rank 0, before rank 0's replacement had imported torch on a slow day:
    # with 2 peers nobody was left to download the state from.
    pytest.importorskip("sklearn")
    r = subprocess.run(["/usr/bin/python3", os.path.join(TOP, "tools", "train.py"), "run",
                        "--mode=grad", "--peers=2", "--seconds=14", "--preempt=4",
                        "--seed=5", f"--out={tmp_path}"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]
    study = json.load(open(tmp_path / "study.json"))
    run = study["runs"][0]
    assert run["events"], "no peer was killed"
    kill = run["events"][0]
    victim = kill["killed"]
    # The replacement downloaded the state and went on from where the run was.
    after = [e for e in run["evals"] if e["rank"] == victim and e["t"] > kill["t"] + 0.5]
    before = [e for e in run["evals"] if e["rank"] == victim and e["t"] < kill["t"]]
    assert after and before
    assert min(e["step"] for e in after) > max(e["step"] for e in before) - 10
    assert max(e["acc"] for e in run["evals"]) > 0.8
