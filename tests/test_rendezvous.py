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
    job, peers = rendezvous.exchange(store, 1, n, [("127.0.0.1", 1001)], time.monotonic() + 5)
    assert job == b"job0" and sorted(peers) == [p for p in range(n) if p != 1]
    assert peers[n - 1] == [("127.0.0.1", 1000 + n - 1)]
    assert store.calls.get("wait") == 1 and store.calls.get("multi_get") == 1
    assert sum(store.calls.values()) <= 6, store.calls  # set, the job (check, get), wait, multi_get


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

    job, peers = rendezvous.exchange(Plain(_published(5)), 1, 5, [("127.0.0.1", 1001)], time.monotonic() + 5)
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
            setup._dial_all(peers, 1, time.monotonic() + 0.6, {})
        assert list(err.value.missing) == [0] and "could not reach rank 0" in str(err.value)
        assert 0.2 < time.monotonic() - t0 < 5  # retried with backoff (0.01 s doubling) until the deadline, not at once
    finally:
        setup.close()
