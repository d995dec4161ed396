"""Rail state as level state, and the channel with lossy control frames, sans I/O.

Two endpoints exchange DATA both ways over several links. Every frame
carries its sender's cumulative ack and rail word. At random: links fail and
come back (what was on them is lost), NICs lose and regain carrier (the rail
word changes; the link on that rail fails), and control frames — ACKs,
heartbeats, notifications — are lost in either direction, while frames on
different links overtake each other. Whatever happened, once one frame gets
through each way, each end knows the other's rails exactly, and every DATA
frame was applied once, in order.
"""

from __future__ import annotations

import collections

from hypothesis import given, settings
from hypothesis import strategies as st

from linkescape.protocol.channel import AHEAD, NEW, RecvChannel, SendChannel
from linkescape.protocol.railstate import PeerRails, RailWord

NLINKS = 3


def test_a_newer_word_applies_an_older_one_is_ignored():
    mine, seen = RailWord(), PeerRails()
    assert mine.set(1, True)
    w1 = mine.word
    assert mine.set(1, False)
    w2 = mine.word
    assert seen.apply(w2) == ([], [])  # rail 1 went down and up again: nothing to do
    assert seen.apply(w1) == ([], [])  # the older word, overtaken, is ignored
    assert not seen.is_down(1)
    mine.set(2, True)
    assert seen.apply(mine.word) == ([2], [])
    mine.set(2, False)
    assert seen.apply(mine.word) == ([], [2])


def test_the_generation_wraps():
    mine, seen = RailWord(), PeerRails()
    for i in range(600):
        mine.set(0, i % 2 == 0)
        seen.apply(mine.word)
        assert seen.is_down(0) == mine.is_down(0)


def test_rails_beyond_the_header_bits_are_not_carried():
    mine = RailWord()
    assert not mine.set(8, True)
    assert mine.word == 0


class End:
    def __init__(self) -> None:
        self.tx = SendChannel()
        self.rx = RecvChannel()
        self.rails = RailWord()
        self.peer = PeerRails()
        self.delivered = []


class Wire:
    """Both directions: ``q[d][link]`` holds frames from end d to end 1-d."""

    def __init__(self) -> None:
        self.ends = (End(), End())
        self.up = [True] * NLINKS
        self.q = [[collections.deque() for _ in range(NLINKS)] for _ in range(2)]

    def usable(self, link: int) -> bool:
        # a link works only while both NICs on its rail have carrier
        return self.up[link] and not any(e.rails.is_down(link) for e in self.ends)

    def active(self):
        return next((i for i in range(NLINKS) if self.usable(i)), None)

    def frame(self, d: int, kind: str, seq: int = 0, payload: bytes = b""):
        e = self.ends[d]
        e.rx.ack_sent_upto(e.rx.cumulative_ack)
        return (kind, seq, e.rx.cumulative_ack, e.rails.word, payload)

    def send(self, d: int, payload: bytes) -> None:
        f = self.ends[d].tx.emit(msg=1, sig=0, offset=0, payload=memoryview(payload), copy=True)
        link = self.active()
        if link is not None:
            self.q[d][link].append(self.frame(d, "data", f.seq, bytes(f.payload)))

    def control(self, d: int, link: int) -> None:
        if self.usable(link):
            self.q[d][link].append(self.frame(d, "control"))

    def fail(self, link: int) -> None:
        self.up[link] = False
        self._lose(link)

    def _lose(self, link: int) -> None:
        for d in range(2):
            self.q[d][link].clear()
        self.replay()

    def repair(self, link: int) -> None:
        self.up[link] = True
        self.replay()

    def carrier(self, d: int, rail: int, down: bool) -> None:
        self.ends[d].rails.set(rail, down)
        if down:
            self._lose(rail)
        else:
            self.replay()

    def replay(self) -> None:
        link = self.active()
        if link is None:
            return
        for d in range(2):
            e = self.ends[d]
            for f in list(e.tx.unacked):
                self.q[d][link].append(self.frame(d, "data", f.seq, bytes(f.payload)))

    def drop_control(self, d: int, link: int) -> None:
        """Lose the first control frame in flight (an ACK, heartbeat, notification)."""
        q = self.q[d][link]
        for i, f in enumerate(q):
            if f[0] == "control":
                del q[i]
                return

    def step(self, d: int, link: int) -> bool:
        q = self.q[d][link]
        if not q:
            return False
        kind, seq, ack, word, payload = q[0]
        r = self.ends[1 - d]
        if kind == "data" and r.rx.classify(seq) is AHEAD:
            return False  # parked until the gap fills
        q.popleft()
        r.tx.on_ack(ack)  # the reverse direction's cumulative ack rides on every frame
        r.peer.apply(word)
        if kind == "data" and r.rx.classify(seq) is NEW:
            r.rx.applied(seq)
            r.delivered.append(payload)
        return True

    def drain(self) -> None:
        for _ in range(20_000):
            if not any(self.step(d, l) for d in range(2) for l in range(NLINKS)):
                return


actions = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 1), st.binary(min_size=1, max_size=3)),
        st.tuples(st.just("step"), st.integers(0, 1), st.integers(0, NLINKS - 1)),
        st.tuples(st.just("control"), st.integers(0, 1), st.integers(0, NLINKS - 1)),
        st.tuples(st.just("drop"), st.integers(0, 1), st.integers(0, NLINKS - 1)),
        st.tuples(st.just("fail"), st.integers(0, 1), st.integers(0, NLINKS - 1)),
        st.tuples(st.just("repair"), st.integers(0, 1), st.integers(0, NLINKS - 1)),
        st.tuples(st.just("carrier_down"), st.integers(0, 1), st.integers(0, NLINKS - 1)),
        st.tuples(st.just("carrier_up"), st.integers(0, 1), st.integers(0, NLINKS - 1)),
    ),
    max_size=150,
)


@settings(max_examples=400, deadline=None)
@given(actions)
def test_lost_notifications_and_acks_in_both_directions_lose_nothing(schedule):
    w = Wire()
    sent = ([], [])
    for action, d, arg in schedule:
        if action == "send":
            sent[d].append(arg)
            w.send(d, arg)
        elif action == "step":
            w.step(d, arg)
        elif action == "control":
            w.control(d, arg)
        elif action == "drop":
            w.drop_control(d, arg)
        elif action == "fail":
            w.fail(arg)
        elif action == "repair":
            w.repair(arg)
        elif action == "carrier_down":
            w.carrier(d, arg, True)
        else:
            w.carrier(d, arg, False)
        for e in (0, 1):  # at every step: a prefix, never a duplicate
            assert w.ends[1 - e].delivered == sent[e][: len(w.ends[1 - e].delivered)]
    # the faults end: links and carriers come back, a frame gets through each way
    for link in range(NLINKS):
        w.up[link] = True
    for d in range(2):
        for rail in range(NLINKS):
            if w.ends[d].rails.is_down(rail) and rail != 0:
                continue  # a NIC may stay down for good; rail 0 is repaired
            w.ends[d].rails.set(rail, False)
    w.replay()
    link = w.active()
    for d in range(2):
        w.control(d, link)
    # the newest words arrive first; frames still queued on other links,
    # older, arrive after them and must not roll the state back
    while any(w.step(d, link) for d in range(2)):
        pass
    w.drain()
    for d in range(2):
        for rail in range(NLINKS):
            assert w.ends[1 - d].peer.is_down(rail) == w.ends[d].rails.is_down(rail)
    for d in range(2):
        w.control(d, link)  # the last acks
    w.drain()
    for d in range(2):
        assert w.ends[1 - d].delivered == sent[d]
        assert not w.ends[d].tx.unacked
