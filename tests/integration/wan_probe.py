#!/usr/bin/python3
"""Probes for the WAN test bed's tests (wan_shaping.sh, wan_delay.sh), run
inside its namespaces:
  wan_probe.py sink PORT                 TCP: take one stream to EOF, then ack
  wan_probe.py stream HOST PORT SECONDS MAXBYTES IFACE
                                         TCP: send for SECONDS or MAXBYTES,
                                         whichever first; print the rate
  wan_probe.py echo PORT SECONDS         UDP echo, for SECONDS at most
  wan_probe.py ping HOST PORT COUNT      UDP ping-pong; print RTT statistics
Every run is bounded in time; output is key=value on one line."""
import json
import socket
import subprocess
import statistics
import sys
import time


def tx_bytes(iface):
    """Bytes the root qdisc (the bed's tbf) has sent: what it shapes, with
    each segment's headers (the interface's own counter sees a 64 KiB GSO
    packet's headers once)."""
    out = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", iface, "root"],
                         check=True, capture_output=True, text=True).stdout
    return int(json.loads(out)[0]["bytes"])


def sink(port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    ls.settimeout(20)
    print("ready", flush=True)
    c, _ = ls.accept()
    c.settimeout(20)
    n = 0
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        n += len(b)
    # The sender's clock stops at this byte: every byte it sent has arrived.
    c.sendall(b"k")
    c.close()
    print(f"received={n}", flush=True)


def stream(host, port, seconds, maxbytes, iface):
    s = socket.create_connection((host, port), timeout=10)
    buf = b"\0" * (64 << 10)
    sent = 0
    tx0 = tx_bytes(iface)
    t0 = time.monotonic()
    while sent < maxbytes and time.monotonic() - t0 < seconds:
        sent += s.send(buf[: min(len(buf), maxbytes - sent)])
    s.shutdown(socket.SHUT_WR)
    # Wait for the sink's ack after EOF: the data has arrived, not merely
    # left for the socket buffer (4 MiB there would be 0.3 s at 100mbit).
    s.settimeout(20)
    ack = s.recv(1)
    t1 = time.monotonic()
    tx1 = tx_bytes(iface)
    s.close()
    if ack != b"k":
        sys.exit("stream: no ack from the sink")
    dt = t1 - t0
    print(f"bytes={sent} seconds={dt:.3f} goodput_bps={sent * 8 / dt:.0f} "
          f"wire_bytes={tx1 - tx0} wire_bps={(tx1 - tx0) * 8 / dt:.0f}", flush=True)


def echo(port, seconds):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    end = time.monotonic() + seconds
    print("ready", flush=True)
    while time.monotonic() < end:
        s.settimeout(max(0.01, end - time.monotonic()))
        try:
            b, a = s.recvfrom(2048)
        except socket.timeout:
            break
        if b == b"quit":
            break
        s.sendto(b, a)


def ping(host, port, count):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((host, port))
    s.settimeout(1.0)
    rtts = []
    lost = 0
    for i in range(count):
        msg = i.to_bytes(4, "big") + b"\0" * 60
        t0 = time.monotonic()
        s.send(msg)
        while True:
            try:
                b = s.recv(2048)
            except socket.timeout:
                lost += 1
                break
            if b[:4] == msg[:4]:  # a late answer to an earlier probe is not this one
                rtts.append((time.monotonic() - t0) * 1e3)
                break
        time.sleep(0.005)
    s.send(b"quit")
    if not rtts:
        sys.exit("ping: no answers")
    q = statistics.quantiles(rtts, n=10) if len(rtts) >= 2 else [rtts[0]] * 9
    print(f"count={len(rtts)} lost={lost} median_ms={statistics.median(rtts):.3f} "
          f"min_ms={min(rtts):.3f} p10_ms={q[0]:.3f} p90_ms={q[8]:.3f}", flush=True)


def main(a):
    if a[:1] == ["sink"] and len(a) == 2:
        sink(int(a[1]))
    elif a[:1] == ["stream"] and len(a) == 6:
        stream(a[1], int(a[2]), float(a[3]), int(a[4]), a[5])
    elif a[:1] == ["echo"] and len(a) == 3:
        echo(int(a[1]), float(a[2]))
    elif a[:1] == ["ping"] and len(a) == 4:
        ping(a[1], int(a[2]), int(a[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
