"""MPTCP, the peer to beat: a plain MPTCP bulk transfer on the testbed, and what a cut does to it.

``python -m linkescape.bench.failover.mptcp server --port P`` accepts MPTCP connections
(``socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP=262)``) on 0.0.0.0 and discards
what arrives; ``python -m linkescape.bench.failover.mptcp client --connect ADDR:PORT``
sends as fast as the path takes until ``--duration`` passes or ``--stop-file``
appears. :func:`setup_mptcp` enables MPTCP in two testbed hosts with the
in-kernel path manager: the server signals its backup-rail address, the client
has a ``subflow fullmesh backup`` endpoint on its backup rail, so the
connection starts on rail 0 and keeps an idle backup subflow on rail 1.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

IPPROTO_MPTCP = 262


def mptcp_socket(cc: Optional[str] = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
    if cc:
        # Per socket (MPTCP passes it on to every subflow): a namespace's default may
        # only be set to one of the root namespace's tcp_allowed_congestion_control.
        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_CONGESTION", 13), cc.encode())
    return sock


def congestion_of(sock: socket.socket) -> str:
    raw = sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_CONGESTION", 13), 16)
    return raw.split(b"\0", 1)[0].decode()


def _sink(conn: socket.socket) -> None:
    buf = bytearray(1 << 20)
    try:
        while conn.recv_into(buf):
            pass
    except OSError:
        pass
    finally:
        conn.close()


def serve(port: int, cc: Optional[str] = None) -> None:
    lsock = mptcp_socket(cc)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("0.0.0.0", port))
    lsock.listen(16)
    print("listening", flush=True)
    while True:
        conn, _ = lsock.accept()
        threading.Thread(target=_sink, args=(conn,), daemon=True).start()


def send(addr: str, port: int, duration: float, stop_file: Optional[str], cc: Optional[str] = None) -> int:
    sock = mptcp_socket(cc)
    sock.connect((addr, port))
    print(f"connected cc={congestion_of(sock)}", flush=True)
    data = memoryview(bytearray(1 << 20))
    end = time.monotonic() + duration
    sent = 0
    sock.settimeout(0.5)
    while time.monotonic() < end and not (stop_file and os.path.exists(stop_file)):
        try:
            sent += sock.send(data)
        except socket.timeout:
            continue
    sock.close()
    print(f"sent {sent}", flush=True)
    return 0


# ----------------------------------------------------------------- testbed side
def setup_mptcp(tb, server: int = 0, client: int = 1, backup_rail: int = 1) -> Dict[str, List[str]]:
    """Enable MPTCP in both hosts; returns the commands run (for the record)."""
    cmds: List[List[str]] = []
    for h in (server, client):
        cmds.append(tb.cmd(h, ["sysctl", "-qw", "net.mptcp.enabled=1"]))
        cmds.append(["ip", "-n", tb.netns(h), "mptcp", "endpoint", "flush"])
        cmds.append(["ip", "-n", tb.netns(h), "mptcp", "limits", "set", "subflows", "2", "add_addr_accepted", "2"])
    cmds.append(["ip", "-n", tb.netns(server), "mptcp", "endpoint", "add", tb.host_addr(server, backup_rail),
                 "dev", tb.nic(backup_rail), "signal"])
    cmds.append(["ip", "-n", tb.netns(client), "mptcp", "endpoint", "add", tb.host_addr(client, backup_rail),
                 "dev", tb.nic(backup_rail), "subflow", "fullmesh", "backup"])
    for argv in cmds:
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return {"commands": [" ".join(a) for a in cmds]}


def subflows(tb, host: int) -> str:
    """``ss -tniM`` inside a host: the MPTCP subflows and their state (diagnostics)."""
    proc = tb.exec(host, ["ss", "-tniH", "state", "established"], capture_output=True, text=True)
    return proc.stdout


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, default=5201)
    s.add_argument("--cc", default=None, help="TCP congestion control (default: the namespace's)")
    c = sub.add_parser("client")
    c.add_argument("--connect", required=True, help="ADDR:PORT")
    c.add_argument("--duration", type=float, default=60.0)
    c.add_argument("--stop-file", default=None)
    c.add_argument("--cc", default=None, help="TCP congestion control (default: the namespace's)")
    args = p.parse_args(argv)
    if args.cmd == "server":
        serve(args.port, args.cc)
        return 0
    addr, port = args.connect.rsplit(":", 1)
    return send(addr, int(port), args.duration, args.stop_file, args.cc)


if __name__ == "__main__":
    sys.exit(main())
