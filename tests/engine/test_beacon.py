"""The store's liveness records as evidence (engine/beacon.py): a record
that keeps advancing is a live peer, one that stopped is a gone one. A
record the job did not write costs only that record (issue 48): in a peer's
key it makes that peer's record no evidence of its death, never another
peer's; a replayed old record (rolled back, or written before the last frame
heard from its rank) is no evidence either. Driven by hand: a dict store and
a clock that moves only when told; the beacon's thread is not started."""

from __future__ import annotations

from linkescape.engine.beacon import ALIVE_KEY, FAILED_KEY, Beacon, RecordKey
from linkescape.engine.clock import FakeClock

KEY = RecordKey(b"k" * 32, b"job-1")
STALE = 2.0


class DictStore:
    def __init__(self) -> None:
        self.data = {}

    def set(self, key, value) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.data[key]

    def check(self, keys) -> bool:
        return all(k in self.data for k in keys)


def _beacon(store, clock, records=None):
    return Beacon(0, store, KEY, clock, STALE, on_record=(records if records is not None else []).append, failed=lambda: False)


def _round(beacon, peer):
    """What the thread does for a watched peer, twice a second."""
    beacon._read_failed()
    beacon._read_peer(peer)


def _judge(beacon, store, clock, peer, counters, heard=None, written=None):
    """Read ``peer``'s record once per half second while it holds ``counters`` in turn
    (written now, or at wall time ``written``); ``heard``: our wall time when the last frame of
    ``peer`` arrived over the rails."""
    beacon.watch(peer, heard=heard)
    for c in counters:
        if c is not None:
            store.set(ALIVE_KEY.format(rank=peer), KEY.alive(peer, c, clock.wall() if written is None else written))
        _round(beacon, peer)
        clock.advance(0.5)
    age = beacon.record_age(peer, clock.now())
    return None if age is None else age <= beacon.stale_after(STALE)


def test_an_advancing_record_is_a_live_peer_and_a_stopped_one_a_gone_one():
    store, clock = DictStore(), FakeClock()
    b = _beacon(store, clock)
    assert _judge(b, store, clock, 2, [1, 1, 2, 2, 3, 3]) is True
    assert _judge(b, store, clock, 2, [4] + [None] * 7) is False  # unchanged for 4 s > 2.5 beats
    assert b.tampered is None


def test_a_garbage_record_costs_only_that_record_and_a_real_death_is_still_seen():
    """Issue 48 item 6: before, one garbage record turned off store-based death detection for
    the rest of the job (a host then powered off was waited for LINKESCAPE_NO_PATH_TIMEOUT)."""
    store, clock = DictStore(), FakeClock()
    b = _beacon(store, clock)
    store.set(ALIVE_KEY.format(rank=1), "999999 0 " + "f" * 32)  # forged: another peer's key
    store.set(FAILED_KEY, "not json at all")
    b.watch(1)
    b._read_failed()
    b._read_peer(1)
    assert b.tampered and 1 in b.untrusted
    # peer 2 dies: its record stops; the garbage in other keys changes nothing about it
    assert _judge(b, store, clock, 2, [7] + [None] * 7, heard=clock.wall()) is False
    # peer 1's key was written by someone else: its record is no evidence of its death...
    assert _judge(b, store, clock, 1, [3] + [None] * 7) is None
    # ...and its genuine records still show it alive
    b.untrusted.pop(1)
    assert _judge(b, store, clock, 1, [4, 4, 5, 5, 6]) is True


def test_a_replayed_old_record_never_makes_a_live_cut_off_rank_look_dead():
    """The attacker of tests/integration/test_store_attack_integ.py as one
    reader sees it when every read of the cut-off rank's key finds the
    rank's early record (it rewrites it every 10 ms, the rank every second):
    before, that was a verdict (PeerLost naming a live rank; CI, tree 75fb2ae).
    The record was written well before the last frame the rank sent us: a
    dead rank's last record is at most a beat older than that."""
    store, clock = DictStore(), FakeClock()
    records = []
    b = _beacon(store, clock, records)
    early = clock.wall()
    clock.advance(30.0)  # the job ran; the rank was cut off a moment ago
    assert _judge(b, store, clock, 2, [1] * 10, heard=clock.wall() - 0.2, written=early) is None
    assert records == [] and "replayed" in b.untrusted[2]
    # a record written just before the last frame heard is a dead rank's last record: a verdict
    assert _judge(b, store, clock, 3, [40] + [None] * 7, heard=clock.wall(), written=clock.wall() - 0.8) is False


def test_a_rollback_below_a_counter_read_in_an_earlier_outage_is_caught():
    store, clock = DictStore(), FakeClock()
    b = _beacon(store, clock)
    assert _judge(b, store, clock, 2, [5, 5, 6]) is True
    b.unwatch(2)  # its path came back
    clock.advance(30.0)
    # cut off again; the store now holds its record of an earlier outage
    assert _judge(b, store, clock, 2, [3] * 8) is None
    assert "rolled back from 6 to 3" in b.tampered and 2 in b.untrusted


def test_an_authentic_failure_record_of_another_rank_is_passed_on():
    store, clock = DictStore(), FakeClock()
    records = []
    b = _beacon(store, clock, records)
    store.set(FAILED_KEY, KEY.failure(3, 1, "PeerLost", "gone", 12.5))
    b._read_failed()
    assert [r["peer"] for r in records] == [3] and b.tampered is None


def test_a_skewed_or_late_writer_is_trusted_again_once_its_record_moves_forward():
    """Issue 48 review: the replay check compares wall clocks across hosts. A peer whose clock is
    5 s behind ours (or whose beacon thread ran late) wrote a record that looks older than the
    last frame we heard from it; before, that peer's record was no evidence of its death for good
    (store-based death detection silently stopped for it). Its next record moves forward: it is
    trusted again, and its death is still seen."""
    store, clock = DictStore(), FakeClock()
    b = _beacon(store, clock)
    heard = clock.wall()
    key = ALIVE_KEY.format(rank=2)
    b.watch(2, heard=heard)
    store.set(key, KEY.alive(2, 7, clock.wall() - 5.0))
    _round(b, 2)
    assert "replayed" in b.untrusted[2]  # one read: no evidence, as a replay is
    assert b.record_age(2, clock.now()) is None
    clock.advance(0.5)
    store.set(key, KEY.alive(2, 8, clock.wall() - 5.0))  # its next beat, on its skewed clock
    _round(b, 2)
    assert 2 not in b.untrusted
    assert _judge(b, store, clock, 2, [9, 9, 10, 10], heard=heard, written=clock.wall() - 5.0) is True
    assert _judge(b, store, clock, 2, [11] + [None] * 7, heard=heard, written=clock.wall() - 5.0) is False  # it died
    # a replay that never moves forward stays no evidence (test above); one rolled back stays for good
    store.set(key, KEY.alive(2, 3, clock.wall()))
    _round(b, 2)
    store.set(key, KEY.alive(2, 12, clock.wall()))
    _round(b, 2)
    assert "rolled back" in b.untrusted[2]
