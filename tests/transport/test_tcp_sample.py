"""``tcp.tcp_sample``: the kernel counters the grey-failure detector reads, from TCP_INFO, checked
against the fields read at their offsets in ``struct tcp_info``; a shorter struct (an older kernel)
reads 0 for what it lacks."""

from __future__ import annotations

import socket

from linkescape.transport import tcp

# (offset, size) of each field in Linux's struct tcp_info
FIELDS = {"retrans_segs": (100, 4), "acked": (120, 8), "data_segs": (156, 4), "busy_us": (168, 8),
          "rwnd_us": (176, 8), "sent": (200, 8), "retrans": (208, 8)}


def _field(info: bytes, name: str) -> int:
    off, size = FIELDS[name]
    return int.from_bytes(info[off:off + size], "little") if len(info) >= off + size else 0


class _Info:
    """A socket whose TCP_INFO is given (another kernel's length)."""

    def __init__(self, info: bytes) -> None:
        self.info = info

    def getsockopt(self, level, name, size):
        return self.info[:size]


def test_the_sample_reads_the_fields_of_tcp_info():
    server = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(server.getsockname())
    b, _ = server.accept()
    try:
        payload = b"x" * 300_000
        a.sendall(payload)
        got = 0
        while got < len(payload):
            got += len(b.recv(1 << 20))
        s = tcp.tcp_sample(a, 7.5)
        info = a.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
        assert s.now == 7.5
        for name in FIELDS:
            assert getattr(s, name) == _field(info, name), name
        assert s.sent >= len(payload) and s.acked >= len(payload) and s.data_segs > 0
    finally:
        for sock in (a, b, server):
            sock.close()


def test_a_shorter_tcp_info_reads_zero_for_what_it_lacks():
    full = bytes(range(256)) * 2
    for length in (0, 102, 104, 124, 160, 192, 204, 215, 216, 232):
        info = full[:length]
        s = tcp.tcp_sample(_Info(info), 1.0)
        for name in FIELDS:
            assert getattr(s, name) == _field(info, name), (length, name)
    assert tcp.tcp_sample(_Info(b""), 1.0).sent == 0
