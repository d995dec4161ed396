"""The reliable channel, sans I/O: a fake wire of several links, a fake clock.

The wire model mirrors the engine: DATA frames go on the active link; when a
link fails, what was on it (either direction) is lost, and every frame not yet
acknowledged is replayed on a surviving link; the receiver applies frames in
seq order exactly once, drops duplicates, and leaves frames from the future
waiting.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linkescape.errors import ProtocolError
from linkescape.protocol.channel import AHEAD, DUPLICATE, NEW, RecvChannel, SendChannel


class FakeWire:
    """Two endpoints, ``nlinks`` links; each link has one FIFO per direction."""

    def __init__(self, nlinks: int) -> None:
        self.up = [True] * nlinks
        self.fwd = [collections.deque() for _ in range(nlinks)]  # sender -> receiver (seq, payload)
        self.back = [collections.deque() for _ in range(nlinks)]  # receiver -> sender (ack)
        self.tx = SendChannel()
        self.rx = RecvChannel()
        self.delivered = []
        self.waiting = {}  # frames that arrived ahead of order, per link head

    def active(self):
        for i, u in enumerate(self.up):
            if u:
                return i
        return None

    def send(self, payload: bytes) -> None:
        frame = self.tx.emit(msg=1, sig=0, offset=0, payload=memoryview(payload), copy=True)
        link = self.active()
        if link is not None:
            self.fwd[link].append((frame.seq, bytes(frame.payload)))

    def fail(self, link: int) -> None:
        self.up[link] = False
        self.fwd[link].clear()
        self.back[link].clear()
        self.replay()

    def repair(self, link: int) -> None:
        self.up[link] = True
        self.replay()

    def replay(self) -> None:
        link = self.active()
        if link is None:
            return
        for frame in list(self.tx.unacked):
            self.fwd[link].append((frame.seq, bytes(frame.payload)))

    def step_forward(self, link: int) -> None:
        """Receiver reads the head frame of ``link`` (if it is not ahead)."""
        q = self.fwd[link]
        if not q:
            return
        seq, payload = q[0]
        cls = self.rx.classify(seq)
        if cls is AHEAD:
            return  # parked: stays in the link until the gap fills
        q.popleft()
        if cls is NEW:
            self.rx.applied(seq)
            self.delivered.append(payload)
        ack = self.rx.cumulative_ack
        self.back[link].append(ack)
        self.rx.ack_sent_upto(ack)

    def step_back(self, link: int) -> None:
        q = self.back[link]
        if q:
            self.tx.on_ack(q.popleft())

    def drain(self) -> None:
        for _ in range(10_000):
            moved = False
            for link in range(len(self.up)):
                if self.fwd[link] and self.rx.classify(self.fwd[link][0][0]) is not AHEAD:
                    self.step_forward(link)
                    moved = True
                if self.back[link]:
                    self.step_back(link)
                    moved = True
            if not moved:
                return


def test_in_order_delivery_and_cumulative_ack():
    w = FakeWire(1)
    for i in range(5):
        w.send(bytes([i]))
    w.drain()
    assert w.delivered == [bytes([i]) for i in range(5)]
    assert w.tx.acked == 5 and not w.tx.unacked


def test_replay_after_failure_loses_and_duplicates_nothing():
    w = FakeWire(2)
    for i in range(4):
        w.send(bytes([i]))
    w.step_forward(0)
    w.step_forward(0)  # two delivered, their acks still on link 0
    w.fail(0)  # acks lost too: everything unacked is replayed on link 1
    w.drain()
    assert w.delivered == [bytes([i]) for i in range(4)]


def test_ack_lost_in_reverse_direction_causes_duplicate_that_is_dropped():
    w = FakeWire(2)
    w.send(b"a")
    w.step_forward(0)
    assert w.rx.classify(1) is DUPLICATE
    w.fail(0)  # the ack for "a" dies with the link
    assert [f.seq for f in w.tx.unacked] == [1]
    w.drain()
    assert w.delivered == [b"a"]


def test_ahead_frames_wait_for_the_gap():
    rx = RecvChannel()
    assert rx.classify(2) is AHEAD
    assert rx.classify(1) is NEW
    rx.applied(1)
    assert rx.classify(2) is NEW
    with pytest.raises(ProtocolError):
        rx.applied(3)


def test_ack_for_unsent_frame_is_a_protocol_error():
    tx = SendChannel()
    tx.emit(1, 0, 0, memoryview(b"x"), copy=True)
    with pytest.raises(ProtocolError):
        tx.on_ack(2)


def test_replay_is_what_the_peer_has_not_acknowledged():
    tx = SendChannel()
    for _ in range(3):
        tx.emit(1, 0, 0, memoryview(b"xy"), copy=True)
    assert tx.unacked_bytes == 6
    tx.on_ack(1)  # a re-opened link's handshake: the peer expects seq 2
    assert [f.seq for f in tx.unacked] == [2, 3] and tx.unacked_bytes == 4


def test_zero_copy_frames_materialize_before_memory_is_reused():
    buf = np.arange(16, dtype=np.uint8)
    tx = SendChannel()
    view = memoryview(buf)
    f1 = tx.emit(1, 0, 0, view[:8], copy=False)
    f2 = tx.emit(1, 0, 8, view[8:], copy=False)
    lo = buf.ctypes.data
    assert tx.materialize(lo + 8, lo + 16) == 8  # only the overlapping frame
    assert f1.zero_copy and not f2.zero_copy
    buf[:] = 0  # the caller overwrites its memory
    assert bytes(f2.payload) == bytes(range(8, 16))
    assert bytes(f1.payload) == bytes(8)  # still a view: would need protection


# ------------------------------------------------------------------ property
actions = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.binary(min_size=1, max_size=4)),
        st.tuples(st.just("fwd"), st.integers(0, 2)),
        st.tuples(st.just("back"), st.integers(0, 2)),
        st.tuples(st.just("fail"), st.integers(0, 2)),
        st.tuples(st.just("repair"), st.integers(0, 2)),
    ),
    max_size=120,
)


@settings(max_examples=400, deadline=None)
@given(actions)
def test_any_failure_schedule_that_leaves_a_path_delivers_exactly_once_in_order(schedule):
    w = FakeWire(3)
    sent = []
    for action, arg in schedule:
        if action == "send":
            sent.append(arg)
            w.send(arg)
        elif action == "fwd":
            w.step_forward(arg)
        elif action == "back":
            w.step_back(arg)
        elif action == "fail":
            # never take down the last path for good: a repair follows below
            w.fail(arg)
        else:
            w.repair(arg)
        # invariant at every step: what was delivered is a prefix of what was sent
        assert w.delivered == sent[: len(w.delivered)]
    if w.active() is None:
        w.repair(0)  # a path comes back
    w.replay()
    w.drain()
    assert w.delivered == sent
    assert not w.tx.unacked
