"""Start-up builds only the peers it connects (``Engine(peers_now=)``, the ring neighbours from 16
ranks on); a peer is built when first looked up, and ``build_peers`` (the progress thread, right
after the start-up barrier) builds the rest. A peer built after start-up has every link marked for
Recovery to open, as start-up's backups are (the 31 channels of a 32-rank start-up were a quarter
of its CPU before the barrier: docs/benchmarks.md)."""

from __future__ import annotations

import select

import pytest

from linkescape.config import Config
from linkescape.engine.clock import FakeClock
from linkescape.engine.core import Engine
from linkescape.protocol.linkstate import State


def _signalled(signal) -> bool:
    return bool(select.select([signal.fileno()], [], [], 0)[0])


@pytest.fixture
def eng():
    e = Engine(7, 8, 2, Config(), clock=FakeClock(), peers_now={6, 0})
    yield e
    e.close_io()
    e.recovery_signal.close()


def test_start_up_builds_only_the_peers_it_connects(eng):
    assert sorted(eng.peers) == [0, 6]
    assert eng.peers.get(3) is None  # a look that builds nothing (other threads read without the lock)
    assert eng.probes.count == 7 * 2  # the probe budget goes round every peer, built or not


def test_a_lookup_builds_a_valid_peer_and_nothing_else(eng):
    eng.start_links([])
    peer = eng.peers[3]
    assert peer.rank == 3 and eng.peers.get(3) is peer and sorted(eng.peers) == [0, 3, 6]
    assert eng.peers.find(3) is peer
    for bad in (7, 8, -1, "3", None):  # ourselves, no such rank, not a rank
        assert eng.peers.find(bad) is None
        with pytest.raises(KeyError):
            eng.peers[bad]  # noqa: B018
    assert sorted(eng.peers) == [0, 3, 6]


def test_a_peer_built_after_start_up_has_its_links_opened_by_recovery(eng):
    eng.start_links([])  # start-up opened nothing here: its peers' links are all Recovery's
    assert eng.down == {(0, 0), (0, 1), (6, 0), (6, 1)}
    assert _signalled(eng.recovery_signal)
    eng.recovery_signal.clear()
    eng.peers[2]  # noqa: B018 - an operation's first look at rank 2
    assert {(2, 0), (2, 1)} <= eng.down and _signalled(eng.recovery_signal)
    assert all(st.state is State.DOWN and st.never_up for st in eng.peers[2].status)
    # this rank is the higher of each pair: it re-dials them, at once
    assert {(p, r) for p, r, _next, first in eng.down_links() if first} == eng.down


def test_build_peers_builds_every_other_rank_once(eng):
    eng.start_links([])
    built = dict(eng.peers)
    eng.build_peers()
    assert sorted(eng.peers) == [0, 1, 2, 3, 4, 5, 6]
    assert all(eng.peers[p] is built[p] for p in built)  # start-up's are kept
    assert eng.down == {(p, r) for p in range(7) for r in range(2)}
    eng.build_peers()  # nothing left: nothing changes
    assert sorted(eng.peers) == [0, 1, 2, 3, 4, 5, 6]


def test_without_peers_now_every_peer_is_built_at_once():
    e = Engine(0, 5, 1, Config(), clock=FakeClock())
    try:
        assert sorted(e.peers) == [1, 2, 3, 4]
    finally:
        e.close_io()
        e.recovery_signal.close()


def test_looks_from_other_threads_build_nothing(eng):
    # Recovery's acceptor asks what we expect from a dialer before its link is adopted, without the
    # engine's lock: a peer not built yet sent us nothing, and building it is the engine's business
    eng.start_links([])
    assert eng.expected_from(4) == 1
    assert eng.redial_due(4, 0) is None and not eng.stranded(4)
    assert sorted(eng.peers) == [0, 6]
