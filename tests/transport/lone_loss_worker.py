"""Run inside a fresh network namespace (``lo`` up, nftables): one data segment of a
connection dropped once at the receiver, then how long until the sender's kernel
hears an acknowledgement, with and without one more segment sent 50 ms later.
Prints one JSON line: a list of trials."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time


def _tcp_info(s: socket.socket):
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    return int.from_bytes(info[24:28], "little"), int.from_bytes(info[56:60], "little")  # unacked, ms since an ack


def trial(follow_up: bool) -> dict:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen()
    port = ls.getsockname()[1]
    a = socket.create_connection(("127.0.0.1", port))
    b, _ = ls.accept()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(5):  # an established, interactive connection with a round-trip estimate
        a.send(b"x" * 40)
        b.recv(100)
        b.send(b"y" * 40)
        a.recv(100)
    time.sleep(0.05)
    # the next data segment to the listener's port is dropped on arrival, once (the quota is one segment)
    rule = (f"table inet lonelost {{\n chain inp {{\n type filter hook input priority 0;\n"
            f" tcp dport {port} meta length > 60 quota until 100 bytes counter drop\n }}\n}}\n")
    subprocess.run(["nft", "-f", "-"], input=rule, text=True, check=True)
    try:
        t0 = time.perf_counter()
        a.send(b"p" * 40)  # a probe: the only segment in flight
        sent2 = None
        while time.perf_counter() - t0 < 1.0:
            now = time.perf_counter() - t0
            unacked, _ = _tcp_info(a)
            if not unacked:
                break
            if follow_up and sent2 is None and now >= 0.05:
                a.send(b"q" * 40)
                sent2 = now
            time.sleep(0.0005)
        acked = time.perf_counter() - t0
        listing = subprocess.run(["nft", "list", "table", "inet", "lonelost"], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["nft", "delete", "table", "inet", "lonelost"], capture_output=True)
        for s in (a, b, ls):
            s.close()
    dropped = int(listing.split("counter packets")[1].split()[0])
    return {"follow_up": follow_up, "acked_ms": acked * 1e3, "follow_up_ms": None if sent2 is None else sent2 * 1e3,
            "dropped": dropped}


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(json.dumps([trial(False) for _ in range(n)] + [trial(True) for _ in range(n)]))
