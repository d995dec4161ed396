"""Small traffic probes between testbed hosts: TCP reachability and throughput.

Each probe runs a tiny Python server inside one host namespace and a client
inside another (``ip netns exec``), so it exercises the real kernel path over
the chosen rail's bridge. Used by the testbed tests and handy for debugging a
testbed by hand.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING, Tuple, Union

if TYPE_CHECKING:  # pragma: no cover
    from .netns import Testbed

_SERVER = r"""
import socket, sys, time
host, timeout, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
s.settimeout(timeout)
try:
    c, _ = s.accept()
except socket.timeout:
    print("timeout", flush=True)
    sys.exit(2)
c.settimeout(timeout)
if mode == "echo":
    c.sendall(c.recv(64))
    print("ok", flush=True)
else:
    n, first, last = 0, None, None
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        last = time.monotonic()
        if first is None:
            first = last
        n += len(b)
    print(n, (last - first) if first is not None else 0.0, flush=True)
"""

_CLIENT = r"""
import socket, sys, time
dst, port, src, timeout, mode, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5], float(sys.argv[6])
s = socket.socket()
s.settimeout(timeout)
s.bind((src, 0))
try:
    s.connect((dst, port))
    if mode == "echo":
        s.sendall(b"ping")
        if s.recv(64) != b"ping":
            sys.exit(3)
    else:
        buf = b"x" * 65536
        end = time.monotonic() + secs
        while time.monotonic() < end:
            s.sendall(buf)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
except OSError as e:
    print("fail", e, flush=True)
    sys.exit(1)
print("ok", flush=True)
"""


def _start_server(tb: "Testbed", host: int, addr: str, timeout: float, mode: str) -> Tuple[subprocess.Popen, int]:
    srv = tb.popen(host, [sys.executable, "-c", _SERVER, addr, str(timeout), mode],
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = srv.stdout.readline().strip()
    if not line.isdigit():
        srv.kill()
        raise RuntimeError(f"probe server in host {host} failed: {line} {srv.stderr.read()}")
    return srv, int(line)


def tcp_check(tb: "Testbed", src: int, dst: int, rail: Union[int, str] = 0, timeout: float = 1.0) -> bool:
    """True if host ``src`` can open a TCP connection to ``dst`` over ``rail``
    (an int or ``"mgmt"``) and exchange a few bytes within ``timeout`` seconds."""
    srv, port = _start_server(tb, dst, tb.addr(dst, rail), timeout + 1.0, "echo")
    try:
        cli = tb.exec(src, [sys.executable, "-c", _CLIENT, tb.addr(dst, rail), str(port), tb.addr(src, rail),
                            str(timeout), "echo", "0"], capture_output=True, text=True, timeout=timeout + 10)
        return cli.returncode == 0
    finally:
        srv.kill()
        srv.communicate()


def tcp_throughput(tb: "Testbed", src: int, dst: int, rail: Union[int, str] = 0, seconds: float = 2.0) -> float:
    """Send from ``src`` to ``dst`` over ``rail`` for ``seconds``; return bits/s seen by the receiver."""
    srv, port = _start_server(tb, dst, tb.addr(dst, rail), seconds + 10.0, "sink")
    try:
        cli = tb.exec(src, [sys.executable, "-c", _CLIENT, tb.addr(dst, rail), str(port), tb.addr(src, rail),
                            str(seconds + 10.0), "sink", str(seconds)],
                      capture_output=True, text=True, timeout=seconds + 20)
        out, err = srv.communicate(timeout=10)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    if cli.returncode != 0:
        raise RuntimeError(f"throughput client failed: {cli.stdout} {cli.stderr}")
    nbytes, elapsed = out.split()
    return int(nbytes) * 8 / max(float(elapsed), 1e-9)


__all__ = ["tcp_check", "tcp_throughput"]
