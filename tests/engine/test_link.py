"""Link: control frames that overtake queued data, on a real socket pair."""

from __future__ import annotations

import socket

from linkescape.engine.link import Link, WireItem
from linkescape.protocol.channel import OutFrame
from linkescape.protocol.frames import HEADER_SIZE, Kind, pack_header, unpack_header


def _data(seq: int, n: int = 1000) -> WireItem:
    frame = OutFrame(seq, 1, (seq - 1) * n, 0, memoryview(bytes([seq]) * n), False)
    return WireItem(pack_header(Kind.DATA, seq, 0, 1, frame.offset, n, 0, arg=3 * n), frame)  # (a message of three frames)


def _kinds(sock: socket.socket, total: int):
    got = bytearray()
    while len(got) < total:
        got += sock.recv(total - len(got))
    out, pos = [], 0
    while pos < len(got):
        h = unpack_header(bytes(got[pos:pos + HEADER_SIZE]))
        out.append((Kind(h.kind).name, h.seq, h.arg))
        pos += HEADER_SIZE + (h.length if h.kind == Kind.DATA else 0)
    return out


def test_acks_and_notifications_overtake_queued_data_but_bye_keeps_its_place():
    a, b = socket.socketpair()
    try:
        link = Link(a, peer=1, rail=0, epoch=1, now=0.0)
        for seq in (1, 2, 3):
            link.queue(_data(seq))
        link.out[0].pos = 10  # the first frame is being written: it stays first
        link.queue_control(Kind.NOTIFY_SILENT, 0, arg=1)
        link.queue_control(Kind.ACK, 5)
        link.queue_control(Kind.BYE, 5, arg=3)
        assert link.out_bytes == 3 * (HEADER_SIZE + 1000) + 3 * HEADER_SIZE
        link.out[0].pos = 0
        assert link.flush()
        assert link.out_bytes == 0
        kinds = _kinds(b, 3 * (HEADER_SIZE + 1000) + 3 * HEADER_SIZE)
        assert kinds == [("DATA", 1, 3000), ("NOTIFY_SILENT", 0, 1), ("ACK", 0, 0), ("DATA", 2, 3000),
                         ("DATA", 3, 3000), ("BYE", 0, 3)]
    finally:
        a.close()
        b.close()


def test_a_control_frame_on_an_empty_link_is_simply_queued():
    a, b = socket.socketpair()
    try:
        link = Link(a, peer=1, rail=0, epoch=1, now=0.0)
        link.queue_control(Kind.HEARTBEAT, 0, arg=2)
        link.queue(_data(1))
        link.queue_control(Kind.ACK, 0)
        assert link.flush()
        assert _kinds(b, 3 * HEADER_SIZE + 1000) == [("HEARTBEAT", 0, 2), ("ACK", 0, 0), ("DATA", 1, 3000)]
    finally:
        a.close()
        b.close()


def test_under_frame_macs_one_flush_seals_about_a_frame_of_a_mib_then_lets_the_poll_come_back():
    """A replay of megabytes under frame MACs: hashing is the CPU cost of a write there (~1 ms per
    MiB), and one flush that sealed all of it held the progress thread while the other peers'
    notices waited (cut detection p99 of peers 11-16 ms with MACs). One flush seals at most
    MAC_FLUSH_BUDGET, then returns as if the socket were full; the next goes on, every frame
    arrives once, in order, under its tag; a notice queued in between goes before the frames not
    sealed yet."""
    from linkescape.engine.link import MAC_FLUSH_BUDGET
    from linkescape.protocol.framemac import TAG_SIZE, FrameMac
    from linkescape.protocol.handshake import FrameKeys

    keys = FrameKeys(b"s" * 32, b"r" * 32)
    a, b = socket.socketpair()
    try:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 20)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        a.setblocking(False)
        link = Link(a, peer=1, rail=0, epoch=1, now=0.0, mac_key=keys)
        n = 1 << 20
        for seq in (1, 2, 3):
            link.queue(_data(seq, n))
        assert not link.flush()  # the socket could take more: the budget ended this one
        assert link.mac.sent == 1 and len(link.out) == 2 and MAC_FLUSH_BUDGET <= n + HEADER_SIZE + TAG_SIZE
        link.queue_control(Kind.NOTIFY_DOWN, 0, arg=1)  # goes before frames 2 and 3 (not sealed yet)
        calls = 1
        while True:
            calls += 1
            if link.flush():
                break
            assert calls < 10
        assert calls == 3 and link.mac.sent == 4  # the notice and frame 2, then frame 3
        check = FrameMac(keys.swapped())
        b.setblocking(True)
        got = []
        for _ in range(4):
            hdr = unpack_header(_recv(b, HEADER_SIZE))
            payload = _recv(b, hdr.length if hdr.kind == Kind.DATA else 0)
            tag = _recv(b, TAG_SIZE)
            assert check.check(tag, pack_header(hdr.kind, hdr.seq, hdr.ack, hdr.msg, hdr.offset, hdr.length,
                                                hdr.sig, arg=hdr.arg), payload)
            got.append((Kind(hdr.kind).name, hdr.seq))
        assert got == [("DATA", 1), ("NOTIFY_DOWN", 0), ("DATA", 2), ("DATA", 3)]
    finally:
        a.close()
        b.close()


def _recv(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        got += sock.recv(n - len(got))
    return bytes(got)
