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
