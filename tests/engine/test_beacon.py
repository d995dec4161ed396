"""The store's liveness records as evidence (engine/beacon.py): a record
that keeps advancing is a live peer, one that stopped is a gone one, and a
store that holds a single record the job did not write is no evidence
about any peer (its verdicts wait for the rails). Driven by hand: a dict
store and a clock that moves only when told; the beacon's thread is not
started."""

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


def _judge(beacon, store, clock, peer, counters):
    """Read ``peer``'s record once per half second while it holds ``counters`` in turn."""
    beacon.watch(peer)
    for c in counters:
        if c is not None:
            store.set(ALIVE_KEY.format(rank=peer), KEY.alive(peer, c))
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


def test_a_record_the_job_did_not_write_makes_the_store_no_evidence_about_every_peer():
    store, clock = DictStore(), FakeClock()
    b = _beacon(store, clock)
    store.set(ALIVE_KEY.format(rank=1), "999999 " + "f" * 32)  # forged: another peer's key
    b.watch(1)
    b._read_peer(1)
    # peer 2's record stopped for 4 s: what a gone peer shows, and what a
    # writer who replays its old record faster than it refreshes shows
    assert _judge(b, store, clock, 2, [7] + [None] * 7) is None
    assert b.tampered and "alive/1" in b.tampered


def test_garbage_in_the_failure_record_and_a_frozen_liveness_record_are_no_verdict():
    """The attacker of tests/integration/test_store_attack_integ.py as one
    reader sees it when every read of the cut-off rank's key finds the
    rank's early record (it rewrites it every 10 ms, the rank every second):
    before, that was a verdict (PeerLost naming a live rank; CI, tree 75fb2ae)."""
    store, clock = DictStore(), FakeClock()
    records = []
    b = _beacon(store, clock, records)
    store.set(FAILED_KEY, "not json at all")
    assert _judge(b, store, clock, 2, [1] * 10) is None
    assert records == []


def test_a_rollback_below_a_counter_read_in_an_earlier_outage_is_caught():
    store, clock = DictStore(), FakeClock()
    b = _beacon(store, clock)
    assert _judge(b, store, clock, 2, [5, 5, 6]) is True
    b.unwatch(2)  # its path came back
    clock.advance(30.0)
    # cut off again; the store now holds its record of an earlier outage
    assert _judge(b, store, clock, 2, [3] * 8) is None
    assert "rolled back from 6 to 3" in b.tampered


def test_an_authentic_failure_record_of_another_rank_is_passed_on():
    store, clock = DictStore(), FakeClock()
    records = []
    b = _beacon(store, clock, records)
    store.set(FAILED_KEY, KEY.failure(3, 1, "PeerLost", "gone", 12.5))
    b._read_failed()
    assert [r["peer"] for r in records] == [3] and b.tampered is None
