#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Gather tools/bench_wan.sh's raw outputs into one JSON file and a table.

    wan_report.py OUTDIR COMMAND

OUTDIR/raw/BED/ holds, per bed (a rate and a delay): bed.txt (key=value:
rate, rate_bps, delay, rtt_ms, peers, grid), status (one line per system:
"SYSTEM rc=N seconds=S tbf_before=B0,B1,.. tbf_after=A0,A1,.."), each
mpbench system's JSON (SYSTEM.json), gloo.json (tools/wan_gloo.py) and
openmpi.txt (tools/mpi_allreduce_ref: "bytes time_us median_us" lines).
Writes OUTDIR/results.json and prints, per bed and size, one row per
system: time (the median over the timed iterations: the slowest rank's for
mpbench and OpenMPI, of the per-iteration slowest rank for Gloo; the mean
is kept in the JSON as mean_us),
ratio to OpenMPI's time (to Gloo's without OpenMPI), wire bytes per peer
and the fraction of line rate. Exits 1 if a system failed, lacks a size,
or reported wrong elements.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any


def read_kv(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                out[k] = v
    return out


def read_status(path: str) -> dict[str, dict[str, Any]]:
    """SYSTEM -> rc, seconds and bytes each peer's tbf sent during its run."""
    out: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            words = line.split()
            if not words:
                continue
            kv = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            before = [int(x) for x in kv.get("tbf_before", "").split(",") if x]
            after = [int(x) for x in kv.get("tbf_after", "").split(",") if x]
            sent = [a - b for a, b in zip(after, before)] if len(after) == len(before) else []
            ends = []
            for e in kv.get("ends", "").split(","):
                if e.count(":") == 2:
                    i, rc, ms = e.split(":")
                    ends.append({"proc": int(i), "rc": int(rc), "end_ms": int(ms)})
            out[words[0]] = {
                "rc": int(kv.get("rc", "1")),
                "seconds": float(kv.get("seconds", "0") or 0),
                "tbf_sent_bytes": sent,
                "kill_ms": int(kv["kill_ms"]) if kv.get("kill_ms") else None,
                "ends": sorted(ends, key=lambda e: e["proc"]),
            }
    return out


def json_results(path: str) -> list[dict[str, Any]]:
    """The "results" list of a system's JSON file; empty when it wrote none."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)["results"]


def load_rows(bed_dir: str, system: str, peers: int) -> list[dict[str, Any]]:
    """One row per size that SYSTEM's output has."""
    fp32_wire = 2 * (peers - 1) / peers
    rows: list[dict[str, Any]] = []
    if system == "gloo":
        for r in json_results(os.path.join(bed_dir, "gloo.json")):
            rows.append(
                {
                    "bytes": r["bytes"],
                    "time_us": r["time_us"],
                    "time_is": "median over iterations of the slowest rank",
                    "mean_us": r["mean_us"],
                    "wire_bytes": fp32_wire * r["bytes"],
                    "wire_is": "2(N-1)/N x size",
                    "wrong": r["wrong"],
                }
            )
    elif system == "openmpi":
        path = os.path.join(bed_dir, "openmpi.txt")
        if not os.path.exists(path):
            return rows
        with open(path, encoding="utf-8") as f:
            for line in f:
                w = line.split()
                if len(w) < 2 or line.startswith("#"):
                    continue
                b = int(w[0])
                # Older references printed the mean alone.
                med = float(w[2]) if len(w) > 2 else None
                rows.append(
                    {
                        "bytes": b,
                        "time_us": med if med is not None else float(w[1]),
                        "time_is": ("the slowest rank's median over iterations" if med is not None
                                    else "mean of the iterations, slowest rank"),
                        "mean_us": float(w[1]),
                        "wire_bytes": fp32_wire * b,
                        "wire_is": "2(N-1)/N x size",
                        # mpi_allreduce_ref does not check its results.
                        "wrong": None,
                    }
                )
    else:
        for r in json_results(os.path.join(bed_dir, system + ".json")):
            rows.append(
                {
                    "bytes": r["bytes"],
                    "time_us": (r["time_median_us"] if r.get("time_median_us") is not None
                                else r["time_us"]),
                    "time_is": ("the slowest rank's median over iterations"
                                if r.get("time_median_us") is not None
                                else "mean of the iterations, slowest rank"),
                    "mean_us": r["time_us"],
                    "wire_bytes": r["wire_bytes"],
                    "wire_is": "mpbench wire_bytes (frames with headers)",
                    "ratio_on_wire": r.get("ratio"),
                    "max_err": r.get("max_err"),
                    "wrong": r.get("wrong"),
                    "time_ranks": r.get("time_ranks"),
                }
            )
    return rows


def last_line(path: str, first: bool = False) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            # Not a rule of dashes (OpenMPI frames its messages in them).
            lines = [ln.strip() for ln in f if ln.strip().strip("-=*")]
    except OSError:
        return None
    return lines[0 if first else -1][:200] if lines else None


SURVIVORS_RE = re.compile(
    r"survivors' check, (\d+) B, last iteration: (\d+) live peers \(down: ([^)]*)\), "
    r"(-?\d+) contributions reached the result, wrong (-?\d+) of (\d+), max_err (\S+)")


def survivors_check(path: str) -> dict[str, Any] | None:
    """An mpbench rank's check against the mean of the peers it counts as live."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            found = [m for m in map(SURVIVORS_RE.search, f) if m]
    except OSError:
        return None
    if not found:
        return None
    m = found[-1]
    return {
        "bytes": int(m[1]),
        "live": int(m[2]),
        "down": m[3],
        "contributions": int(m[4]),
        "wrong": int(m[5]),
        "checked": int(m[6]),
        "max_err": float(m[7]),
    }


def faults(bed_dir: str, peers: int) -> list[dict[str, Any]]:
    """What the survivors of each system's fault run did (bench_wan.sh --kill)."""
    path = os.path.join(bed_dir, "fault", "status")
    if not os.path.exists(path):
        return []
    out = []
    for system, st in read_status(path).items():
        kill_ms = st["kill_ms"]
        procs = []
        for e in st["ends"]:
            i = e["proc"]
            if system == "openmpi":
                log, who = os.path.join(bed_dir, "fault", "openmpi.log"), "mpirun"
            else:
                log = os.path.join(bed_dir, "fault", f"{system}.{i}.log")
                who = f"rank {i}" + (" (killed)" if i == peers - 1 else "")
            after = (e["end_ms"] - kill_ms) / 1e3 if kill_ms is not None else None
            procs.append(
                {
                    "who": who,
                    "rc": e["rc"],
                    # timeout(1) exits 124 when the bound ended the run.
                    "running_at_bound": e["rc"] == 124,
                    "ended_s_after_kill": after,
                    # mpirun's first line names the failure; a rank's last.
                    "last_line": last_line(log, first=system == "openmpi"),
                    # mpbench: the last result against the survivors' mean.
                    "survivors_check": None if system in ("gloo", "openmpi")
                    else survivors_check(log),
                }
            )
        rows = []
        if system not in ("gloo", "openmpi"):
            rows = load_rows(os.path.join(bed_dir, "fault"), system, peers)
        out.append({"system": system, "kill_ms": kill_ms, "procs": procs, "mpbench_rows": rows})
    return out


def fmt_bytes(b: float) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{int(b // div)}{unit}"
    return f"{b:.0f}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, command = argv
    raw = os.path.join(out, "raw")
    beds = []
    bad = 0
    for name in sorted(os.listdir(raw)):
        bed_dir = os.path.join(raw, name)
        if not os.path.exists(os.path.join(bed_dir, "bed.txt")):
            continue
        cfg = read_kv(os.path.join(bed_dir, "bed.txt"))
        peers = int(cfg["peers"])
        bps = float(cfg["rate_bps"])
        status = read_status(os.path.join(bed_dir, "status"))
        systems = []
        for system, st in status.items():
            rows = load_rows(bed_dir, system, peers)
            systems.append({"system": system, **st, "rows": rows})
        by = {s["system"]: {r["bytes"]: r for r in s["rows"]} for s in systems}
        base = "openmpi" if by.get("openmpi") else ("gloo" if by.get("gloo") else None)
        sizes = sorted({b for rows in by.values() for b in rows})
        for s in systems:
            for r in s["rows"]:
                t = r["time_us"]
                # The algorithms are symmetric: every peer's uplink carries
                # the wire bytes of one peer, so it is the busiest link.
                r["busiest_link_bytes"] = r["wire_bytes"]
                r["line_rate_fraction"] = (
                    r["wire_bytes"] * 8 / bps / (t / 1e6) if t and t > 0 else None
                )
                b0 = by.get(base, {}).get(r["bytes"]) if base else None
                r["ratio_to"] = base
                r["ratio"] = t / b0["time_us"] if b0 and b0["time_us"] else None
            got = {r["bytes"] for r in s["rows"]}
            wrong = sum(r["wrong"] or 0 for r in s["rows"])
            missing = [b for b in sizes if b not in got]
            s["ok"] = s["rc"] == 0 and not wrong and not missing and bool(s["rows"])
            if not s["ok"]:
                bad += 1
                print(
                    f"wan_report: {name}: {s['system']}: exit status {s['rc']}, "
                    f"{wrong} wrong elements, {len(missing)} sizes missing",
                    file=sys.stderr,
                )
        fault_list = faults(bed_dir, peers)
        beds.append(
            {
                "name": name,
                "rate": cfg["rate"],
                "rate_bps": bps,
                "delay": cfg["delay"],
                "rtt_ms": float(cfg["rtt_ms"]) if cfg.get("rtt_ms") else None,
                "peers": peers,
                "grid": cfg.get("grid"),
                "baseline": base,
                "systems": systems,
                "faults": fault_list,
            }
        )
        print(f"\n# {peers} peers, {cfg['rate']}, delay {cfg['delay']}, round trip "
              f"{cfg.get('rtt_ms') or '?'} ms; time = median over the timed iterations; "
              f"ratio = time / {base or '-'}'s time")
        print(f"# {'size':>6} {'system':<22} {'time (us)':>12} {'ratio':>7} "
              f"{'wire B/peer':>12} {'line rate':>9}")
        for b in sizes:
            for s in systems:
                r = by[s["system"]].get(b)
                if r is None:
                    print(f"  {fmt_bytes(b):>6} {s['system']:<22} {'failed':>12}")
                    continue
                ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
                frac = (f"{r['line_rate_fraction'] * 100:.0f}%"
                        if r["line_rate_fraction"] is not None else "-")
                print(f"  {fmt_bytes(b):>6} {s['system']:<22} {r['time_us']:>12.1f} {ratio:>7} "
                      f"{r['wire_bytes']:>12.0f} {frac:>9}")
        for f in fault_list:
            if f["kill_ms"] is None:
                print(f"# fault, {f['system']}: no kill (the run ended, or never got under way, first)")
                continue
            print(f"# fault, {f['system']}: peer {peers - 1} killed {f['kill_ms'] / 1e3:.1f} s "
                  "after the launch")
            for p in f["procs"]:
                if p["who"].endswith("(killed)"):
                    continue
                what = ("still running at the run's bound (timeout)" if p["running_at_bound"]
                        else f"exit {p['rc']}")
                print(f"#   {p['who']:<8} {what}, {p['ended_s_after_kill']:.1f} s after the kill: "
                      f"{p['last_line'] or '-'}")
                c = p.get("survivors_check")
                if c:
                    print(f"#            survivors' mean ({c['live']} live, down {c['down']}): "
                          f"wrong {c['wrong']} of {c['checked']}, max_err {c['max_err']:.3g}, "
                          f"{c['contributions']} contributions")
            for r in f["mpbench_rows"]:
                print(f"#   rank 0's JSON: {r['bytes']} B, time {r['time_us']:.0f} us, "
                      f"wrong {r['wrong']}, max_err {r.get('max_err')}")
    doc = {
        "schema": 1,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
        "host": os.uname().nodename,
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "beds": beds,
    }
    tmp = os.path.join(out, "results.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, os.path.join(out, "results.json"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
