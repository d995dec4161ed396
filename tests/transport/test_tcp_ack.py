"""``tcp.ack_now``: a lone segment's acknowledgement the kernel holds back (delayed ACK) goes out
when the reader asks. The silence check counts a held-back ack as silence: on the failover
testbed, idle links whose probe's ack was missing for 204-212 ms went down with no fault."""

from __future__ import annotations

import socket
import statistics
import time

from linkescape.transport import tcp


def _unacked(s: socket.socket) -> int:
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    return int.from_bytes(info[24:28], "little")


def _probe_ack_ms(a: socket.socket, b: socket.socket, read_after: float) -> float:
    # a few request/response rounds make the connection look interactive (delayed acks)
    for _ in range(5):
        a.send(b"x" * 40)
        b.recv(100)
        b.send(b"y" * 40)
        a.recv(100)
    time.sleep(0.02)
    t0 = time.perf_counter()
    a.send(b"p" * 40)  # the probe
    time.sleep(read_after)
    b.recv(100)  # the engine reads it (a timer round, a wake-up) ...
    t_read = time.perf_counter()
    tcp.ack_now(b)  # ... and acks it now
    while _unacked(a) and time.perf_counter() - t0 < 1.0:
        time.sleep(0.0002)
    return (time.perf_counter() - t_read) * 1000  # from the read (a loaded host may oversleep the 5 ms)


def test_a_read_probe_is_acknowledged_at_once_not_after_the_delayed_ack():
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen()
    a = socket.create_connection(ls.getsockname())
    b, _ = ls.accept()
    try:
        for s in (a, b):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        delays = [_probe_ack_ms(a, b, 0.005) for _ in range(9)]
        # a delayed ack comes TCP_DELACK_MIN (40 ms) or more after the probe, ~35 ms after a read 5 ms
        # in; asked for at the read, it is out at once
        assert statistics.median(delays) < 20, delays
    finally:
        for s in (a, b, ls):
            s.close()


def test_a_socket_that_is_not_tcp_is_left_alone():
    x, y = socket.socketpair()
    try:
        tcp.ack_now(x)  # no error
    finally:
        x.close()
        y.close()
