"""The reliable channel to one peer, sans I/O.

Rules:
- DATA frames of one direction are numbered 1, 2, 3, ... (``seq``) whatever
  link carries them; links to a peer are interchangeable.
- The sender keeps every frame until it is acknowledged (``ack`` is cumulative).
  Replay after a failover is "resend every frame above the peer's expected".
- The receiver applies frames strictly in seq order, each exactly once:
  below ``expected`` is a duplicate (dropped), above it waits.
- A frame's payload is either a copy owned by the channel, or a zero-copy view
  of the caller's memory. Before that memory is overwritten or handed back to
  the caller, the view must be acknowledged or turned into a copy
  (``materialize``): replay must send the bytes that were sent the first time.

No sockets, threads or clocks here.
"""

from __future__ import annotations

import collections
from typing import Deque

import numpy as np

from ..common.errors import ProtocolError


class OutFrame:
    __slots__ = ("seq", "msg", "offset", "sig", "payload", "lo", "hi", "zero_copy", "arg", "flags")

    def __init__(self, seq: int, msg: int, offset: int, sig: int, payload, zero_copy: bool):
        self.seq = seq
        self.msg = msg
        self.offset = offset
        self.sig = sig
        self.payload = payload
        self.zero_copy = zero_copy
        self.arg = 0  # the whole message's size, carried in every frame
        self.flags = 0
        if zero_copy and len(payload):
            lo = _address(payload)
            self.lo, self.hi = lo, lo + len(payload)
        else:
            self.lo = self.hi = 0

    @property
    def length(self) -> int:
        return len(self.payload)

    def materialize(self) -> int:
        if not self.zero_copy:
            return 0
        self.payload = memoryview(bytes(self.payload))
        self.zero_copy = False
        self.lo = self.hi = 0
        return len(self.payload)


def _address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


def address_range(view: memoryview) -> tuple:
    lo = _address(view) if len(view) else 0
    return lo, lo + len(view)


class SendChannel:
    """Sequence numbers, the unacknowledged store and replay for one direction."""

    def __init__(self) -> None:
        self.next_seq = 1
        self.acked = 0
        self.unacked: Deque[OutFrame] = collections.deque()
        self.copied_bytes = 0  # bytes copied to keep replay possible (a metric)
        #: how many unacknowledged frames still point into caller memory
        self.zc = 0
        #: payload bytes sent and not acknowledged yet
        self.unacked_bytes = 0

    def emit(self, msg: int, sig: int, offset: int, payload: memoryview, copy: bool) -> OutFrame:
        if copy:
            payload = memoryview(bytes(payload))
        frame = OutFrame(self.next_seq, msg, offset, sig, payload, zero_copy=not copy)
        if not copy:
            self.zc += 1
        self.next_seq += 1
        self.unacked.append(frame)
        self.unacked_bytes += len(payload)
        return frame

    @property
    def last_seq(self) -> int:
        return self.next_seq - 1

    def on_ack(self, ack: int) -> int:
        """Apply a cumulative ack; returns how many frames it released."""
        if ack <= self.acked:
            return 0
        if ack > self.last_seq:
            raise ProtocolError(f"ack {ack} for a frame never sent (last {self.last_seq})")
        released = 0
        unacked = self.unacked
        freed = 0
        while unacked and unacked[0].seq <= ack:
            frame = unacked.popleft()
            if frame.zero_copy:
                self.zc -= 1
            freed += len(frame.payload)
            released += 1
        self.unacked_bytes -= freed
        self.acked = ack
        return released

    def materialize(self, lo: int, hi: int) -> int:
        """Copy every zero-copy frame whose payload overlaps [lo, hi)."""
        copied = 0
        if not self.zc:
            return 0
        for frame in self.unacked:
            if frame.zero_copy and frame.lo < hi and lo < frame.hi:
                copied += frame.materialize()
                self.zc -= 1
        self.copied_bytes += copied
        return copied


NEW, DUPLICATE, AHEAD = "new", "duplicate", "ahead"


class RecvChannel:
    """In-order, exactly-once delivery for one direction."""

    def __init__(self) -> None:
        self.expected = 1
        self.ack_sent = 0

    def classify(self, seq: int) -> str:
        if seq == self.expected:
            return NEW
        if seq < self.expected:
            return DUPLICATE
        return AHEAD

    def applied(self, seq: int) -> None:
        if seq != self.expected:
            raise ProtocolError(f"applied seq {seq} while expecting {self.expected}")
        self.expected += 1

    @property
    def cumulative_ack(self) -> int:
        return self.expected - 1

    @property
    def ack_owed(self) -> bool:
        return self.expected - 1 > self.ack_sent

    def ack_sent_upto(self, ack: int) -> None:
        if ack > self.ack_sent:
            self.ack_sent = ack


__all__ = ["OutFrame", "SendChannel", "RecvChannel", "NEW", "DUPLICATE", "AHEAD", "address_range"]
