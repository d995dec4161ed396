"""Start-up: the address exchange costs a fixed number of store calls at any
N, a rank that never arrives is named, and start-up dials that cannot reach
a peer are retried until the deadline, then name it."""

from __future__ import annotations

import json
import time

import pytest

from linkescape import rendezvous
from linkescape.config import Config
from linkescape.errors import RendezvousError


class DictStore:
    """A store with torch's wait and multi_get, counting its calls."""

    def __init__(self, values=None, wait_ok=True) -> None:
        self.values = dict(values or {})
        self.calls = {}
        self.wait_ok = wait_ok

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def set(self, key, value):
        self._count("set")
        self.values[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        self._count("get")
        return self.values[key]

    def check(self, keys):
        self._count("check")
        return all(k in self.values for k in keys)

    def wait(self, keys, timeout=None):
        self._count("wait")
        if not all(k in self.values for k in keys):
            raise RuntimeError("Wait timeout")  # what torch's stores raise

    def multi_get(self, keys):
        self._count("multi_get")
        return [self.values[k] for k in keys]


def _published(n, absent=()):
    values = {rendezvous.KEY_JOB: b"job0"}
    for p in range(n):
        if p not in absent:
            values[rendezvous.KEY_ADDR.format(rank=p)] = json.dumps([f"127.0.0.1:{1000 + p}"]).encode()
    return values


@pytest.mark.parametrize("n", [4, 256])
def test_the_address_exchange_costs_the_same_store_calls_at_any_size(n):
    store = DictStore(_published(n))
    job, peers, secret = rendezvous.exchange(store, 1, n, [("127.0.0.1", 1001)], time.monotonic() + 5)
    assert job == b"job0" and sorted(peers) == [p for p in range(n) if p != 1]
    assert peers[n - 1] == [("127.0.0.1", 1000 + n - 1)]
    assert store.calls.get("wait") == 2 and store.calls.get("multi_get") == 1
    assert sum(store.calls.values()) <= 6, store.calls  # set, the job (wait, get), wait, multi_get
    assert secret is None


def test_the_job_secret_comes_with_the_addresses_in_the_same_store_calls():
    values = _published(8)
    values[rendezvous.KEY_SECRET.format(job="job0")] = b"s3cret"
    store = DictStore(values)
    job, peers, secret = rendezvous.exchange(store, 1, 8, [("127.0.0.1", 1001)], time.monotonic() + 5,
                                             with_secret=True)
    assert secret == b"s3cret" and sorted(peers) == [0, 2, 3, 4, 5, 6, 7]
    assert store.calls.get("wait") == 2 and store.calls.get("multi_get") == 1 and store.calls.get("get") == 1


def test_addresses_read_in_one_parse_are_each_peer_s_own():
    """The records are parsed together; one that is not a JSON list of its own (it would shift
    or break the others in the joined parse) sends the exchange back to one parse per record,
    and start-up fails naming the rank whose record it is."""
    values = _published(5)
    values[rendezvous.KEY_ADDR.format(rank=3)] = b'["127.0.0.1:1003"], ["10.0.0.9:1"]'
    store = DictStore(values)
    with pytest.raises(RendezvousError) as err:  # that record alone is not JSON: start-up names its rank
        rendezvous.exchange(store, 1, 5, [("127.0.0.1", 1001)], time.monotonic() + 5)
    assert err.value.missing == (3,) and "rank 3" in str(err.value)
    values[rendezvous.KEY_ADDR.format(rank=3)] = json.dumps(["127.0.0.2:1003", "[::1]:7"]).encode()
    job, peers, _secret = rendezvous.exchange(DictStore(values), 1, 5, [("127.0.0.1", 1001)], time.monotonic() + 5)
    assert peers == {0: [("127.0.0.1", 1000)], 2: [("127.0.0.1", 1002)],
                     3: [("127.0.0.2", 1003), ("[::1]", 7)], 4: [("127.0.0.1", 1004)]}
    assert rendezvous._decode_all([b'["a:1"]', b'["b:2"], ["c:3"]']) is None
    assert rendezvous._decode_all([b'["a:1"]', "text"]) is None


def test_each_rank_publishes_its_x25519_key_with_its_addresses():
    """Issue 48: the public half of each rank's key for relayed frames' end-to-end MACs goes into
    its address record; the peers' come back in ``publics``. A record without one (the older list)
    gives none; a key of the wrong size is an error naming its rank."""
    values = _published(4)
    values[rendezvous.KEY_ADDR.format(rank=2)] = json.dumps({"rails": ["127.0.0.1:1002"],
                                                              "x25519": "ab" * 32}).encode()
    store = DictStore(values)
    publics = {}
    job, peers, _secret = rendezvous.exchange(store, 1, 4, [("127.0.0.1", 1001)], time.monotonic() + 5,
                                              public=b"\x01" * 32, publics=publics)
    assert peers[2] == [("127.0.0.1", 1002)] and peers[0] == [("127.0.0.1", 1000)]
    assert publics == {2: b"\xab" * 32}
    assert json.loads(store.values[rendezvous.KEY_ADDR.format(rank=1)]) == {"rails": ["127.0.0.1:1001"],
                                                                            "x25519": "01" * 32}
    values[rendezvous.KEY_ADDR.format(rank=2)] = json.dumps({"rails": ["127.0.0.1:1002"], "x25519": "ab"}).encode()
    with pytest.raises(RendezvousError) as err:
        rendezvous.exchange(DictStore(values), 1, 4, [("127.0.0.1", 1001)], time.monotonic() + 5, publics={})
    assert "rank 2" in str(err.value)


def test_a_rank_that_never_arrives_is_named():
    store = DictStore(_published(6, absent=(2, 5)))
    with pytest.raises(RendezvousError) as err:
        rendezvous.exchange(store, 0, 6, [("127.0.0.1", 1000)], time.monotonic() + 0.2)
    assert sorted(err.value.missing) == [2, 5]


def test_a_store_without_wait_is_read_key_by_key():
    class Plain:
        def __init__(self, values):
            self.values = values

        def set(self, key, value):
            self.values[key] = value

        def get(self, key):
            return self.values[key]

    job, peers, _secret = rendezvous.exchange(Plain(_published(5)), 1, 5, [("127.0.0.1", 1001)], time.monotonic() + 5)
    assert sorted(peers) == [0, 2, 3, 4]


def test_start_up_dials_retry_then_name_the_peer_they_cannot_reach():
    from linkescape.protocol.handshake import LinkAuth
    from linkescape.transport import tcp

    closed = tcp.listen("127.0.0.1")
    addr = closed.getsockname()
    closed.close()  # nothing listens there: every dial is refused
    setup = rendezvous.LinkSetup(1, 2, ["127.0.0.1"], Config())
    try:
        setup.auth = LinkAuth(b"k" * 32, b"job0", 1, 2, 1)
        peers = {0: [addr]}
        t0 = time.monotonic()
        with pytest.raises(RendezvousError) as err:
            setup._dial_all(peers, [0], time.monotonic() + 0.6, {})
        assert list(err.value.missing) == [0] and "could not reach rank 0" in str(err.value)
        assert 0.2 < time.monotonic() - t0 < 5  # retried with backoff (0.01 s doubling) until the deadline, not at once
    finally:
        setup.close()


@pytest.mark.parametrize("swapped_for", ["dialer", "acceptor"])
def test_rails_swapped_in_the_store_never_become_crossed_links(swapped_for):
    """A store that lists a rank's rail addresses in the wrong order (a
    rewritten store, a launcher's mistake): the dial for rail 0 would reach
    the rail-1 listener (or come from the address the acceptor expects on
    rail 1) and become "rail 0" on the wrong NIC. Start-up fails instead,
    naming the peer, with a RailMismatch as the cause; no link is made."""
    import threading

    from linkescape.errors import RailMismatch

    cfg = Config(auth_key="k" * 32)
    setups = [rendezvous.LinkSetup(0, 2, ["127.0.0.1", "127.0.0.2"], cfg),
              rendezvous.LinkSetup(1, 2, ["127.0.0.3", "127.0.0.4"], cfg)]
    try:
        true = {0: setups[0].addresses, 1: setups[1].addresses}
        views = {0: {1: true[1]}, 1: {0: true[0]}}
        if swapped_for == "dialer":  # rank 1 dials rank 0's rail-1 listener for rail 0
            views[1] = {0: true[0][::-1]}
        else:  # rank 0 expects rank 1's rail-0 dial from its rail-1 address
            views[0] = {1: true[1][::-1]}
        results = {}

        def run(rank):
            try:
                results[rank] = setups[rank].connect_all(b"job0", views[rank], time.monotonic() + 1.5)
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                results[rank] = exc
        threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert isinstance(results[1], RendezvousError) and list(results[1].missing) == [0], results
        assert isinstance(results[1].__cause__, RailMismatch), results[1].__cause__
        assert isinstance(results[0], RendezvousError) and list(results[0].missing) == [1], results
        assert setups[0].acceptor.rejected_by.get("route", 0) >= 1 and not setups[0].accepted
    finally:
        for s in setups:
            for sock in (s.accepted or {}).values():
                sock.close()
            s.close()


# ------------------------------------------------------------------ connect_at_start
class CountingStore(DictStore):
    """DictStore with torch's add."""

    def add(self, key, amount):
        self._count("add")
        value = int(self.values.get(key, b"0")) + amount
        self.values[key] = str(value).encode()
        return value


def test_start_up_opens_the_ring_neighbours_only_from_16_ranks_on_and_only_with_a_counting_store():
    auto = Config()
    assert rendezvous.start_up_peers(3, 8, auto, CountingStore()) is None  # few ranks: every link
    assert rendezvous.start_up_peers(3, 16, auto, CountingStore()) == {2, 4}
    assert rendezvous.start_up_peers(0, 64, auto, CountingStore()) == {63, 1}  # a ring
    assert rendezvous.start_up_peers(0, 64, auto, DictStore()) is None  # a store that cannot count: every link
    assert rendezvous.start_up_peers(1, 2, Config(connect_at_start="neighbours"), CountingStore()) == {0}
    assert rendezvous.start_up_peers(3, 64, Config(connect_at_start="all"), CountingStore()) is None


def test_every_set_of_ranks_has_a_ring_edge_to_the_others():
    # why the neighbours suffice to find a key mismatch at start-up: any rank whose key differs
    # from a neighbour's fails there, and any split of the ranks into two keys has such a pair
    n = 16
    for odd in ({5}, {0, 1}, set(range(1, n)), {3, 9, 12}):
        assert any((r in odd) != (p in odd) for r in range(n)
                   for p in rendezvous.start_up_peers(r, n, Config(), CountingStore()))


def _setup(rank, n, store):
    setup = rendezvous.LinkSetup.__new__(rendezvous.LinkSetup)
    setup.rank, setup.world_size, setup.job = rank, n, b"job0"
    setup._store, setup._abort, setup._flag_at, setup._auth_seen = store, None, 0.0, 0
    return setup


def test_the_start_up_barrier_costs_two_store_calls_and_returns_once_every_rank_arrived():
    store = CountingStore()
    setups = [_setup(r, 3, store) for r in range(3)]
    # the last rank to arrive sets the key: it returns at once
    store.values[rendezvous.KEY_STARTED.format(job="job0")] = b"2"
    setups[2].barrier(store, time.monotonic() + 5)
    assert store.calls == {"add": 1, "set": 1, "wait": 1}
    # an earlier rank waiting would find it set
    setups[0].barrier(store, time.monotonic() + 5)


def test_the_rank_s_threads_start_once_it_has_arrived_and_before_it_waits():
    # (a thread's start waits a scheduling round: spent while the others arrive, not before)
    store = CountingStore()
    seen = []
    store.values[rendezvous.KEY_STARTED.format(job="job0")] = b"1"  # the other rank arrived already
    _setup(0, 2, store).barrier(store, time.monotonic() + 5, meanwhile=lambda: seen.append(dict(store.calls)))
    assert seen == [{"add": 1, "set": 1}]  # counted in (and, last, it released the others), not waiting yet
    assert store.calls == {"add": 1, "set": 1, "wait": 1}


def test_a_rank_waiting_at_the_barrier_stops_on_a_key_mismatch_reported_by_another():
    store = CountingStore({rendezvous.KEY_AUTH_FAILED.format(job="job0"): json.dumps({"rank": 4, "peer": 5})})
    t0 = time.monotonic()
    with pytest.raises(rendezvous.AuthError) as info:
        _setup(0, 8, store).barrier(store, time.monotonic() + 30)
    assert info.value.peer == 4 and time.monotonic() - t0 < 5


def test_a_rank_waiting_at_the_barrier_stops_when_another_could_not_start():
    store = CountingStore()
    failed = _setup(5, 8, store)
    failed.report_start_failure(store, RendezvousError("rank 5 could not reach rank 6 on rail 0"))
    with pytest.raises(RendezvousError, match="rank 5 could not start") as info:
        _setup(0, 8, store).barrier(store, time.monotonic() + 30)
    assert info.value.missing == (5,)


def test_a_barrier_that_never_completes_names_how_many_ranks_arrived():
    store = CountingStore()
    with pytest.raises(RendezvousError, match="1 of 4"):
        _setup(0, 4, store).barrier(store, time.monotonic() + 0.3)
