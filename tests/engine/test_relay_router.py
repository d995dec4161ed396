"""Choosing the relay (issue 16, item 4): by load, never a rank that cannot
reach us or refused lately, and several broken pairs spread over several
ranks. The router alone, with stand-in peers and a fake clock."""

from __future__ import annotations

from types import SimpleNamespace

from linkescape.engine.clock import FakeClock
from linkescape.engine.relay import REFUSAL_MEMORY, RelayRouter
from linkescape.protocol.linkstate import State
from linkescape.protocol.railstate import RailWord
from linkescape.testing import job_keys

#: rank 0's X25519 key, knowing its peers' (a relayed frame to a peer is sealed with their pair key)
KEYS = job_keys(8)


def _peer(rank: int, load: int = 0, up: bool = True):
    link = SimpleNamespace(rail=0)
    return SimpleNamespace(rank=rank, lost=None, relay=None, active=[0] if up else [], links=[link],
                           status=[SimpleNamespace(state=State.UP if up else State.DOWN)], relay_load=load,
                           pairs=KEYS[0].pair(rank))


def _router(peers):
    clock = FakeClock()
    return RelayRouter(0, {p.rank: p for p in peers}, RailWord(), 4 << 20, clock), clock


def test_the_least_loaded_rank_that_reaches_us_relays():
    router, _ = _router([_peer(1), _peer(2, load=3), _peer(3, load=1), _peer(4, up=False), _peer(5)])
    # rank 1 is the destination, rank 4 has no live link to us, rank 5 lost; 3 relays fewer pairs than 2
    router.peers[5].lost = "gone"
    path = router.choose(1)
    assert path is not None and path.via == 3 and path.dst == 1
    assert router.routes == {1: 3}


def test_several_broken_pairs_spread_over_several_relays():
    router, _ = _router([_peer(r, up=r > 3) for r in range(1, 7)])
    # ranks 1, 2 and 3 lost their path to us; 4, 5 and 6 are healthy and relay nothing yet
    vias = [router.choose(dst).via for dst in (1, 2, 3)]
    assert sorted(vias) == [4, 5, 6], vias  # each pair we route through a relay counts as load on it
    # the routes we hold are what we relay through each rank
    assert sorted(router.relayed_through(vias[0])) == [1]


def test_a_rank_that_refused_is_not_asked_again_for_a_while():
    router, clock = _router([_peer(1), _peer(2), _peer(3, load=5)])
    assert router.choose(1).via == 2
    router.refused(1, 2)
    assert router.choose(1).via == 3  # 2 said it cannot reach 1
    clock.advance_ms(REFUSAL_MEMORY * 1000 + 1)
    assert router.choose(1).via == 2  # asked again after REFUSAL_MEMORY


def test_a_rank_that_just_passed_the_peers_frame_on_is_taken_at_once_whatever_it_said_before():
    router, clock = _router([_peer(1), _peer(2, load=5), _peer(3), _peer(4, up=False)])
    router.refused(1, 2)
    router.refused(1, 3)
    assert router.choose(1) is None  # every rank that reaches us refused 1 a moment ago
    # 2 passes a frame of 1's on to us: it reaches 1 now; it is taken although it refused and is loaded
    path = router.choose(1, through=2)
    assert path is not None and path.via == 2 and router.routes == {1: 2}
    assert (1, 2) not in router.refusals
    # a rank we cannot reach ourselves is never taken, even when it passed a frame on
    router.routes.clear()
    clock.advance_ms(REFUSAL_MEMORY * 1000 + 1)
    assert router.choose(1, through=4).via in (2, 3)


def test_a_refusal_is_forgotten_by_the_next_search():
    from linkescape.engine.core import RELAY_RETRY

    # a refusal says what the rank reached then: the next search (RELAY_RETRY later) asks it again
    router, clock = _router([_peer(1), _peer(2)])
    router.refused(1, 2)
    assert router.choose(1) is None  # the only rank that reaches us refused 1
    clock.advance_ms(RELAY_RETRY * 1000)
    path = router.choose(1)
    assert path is not None and path.via == 2


def test_no_candidate_means_no_relay():
    router, _ = _router([_peer(1), _peer(2, up=False)])
    assert router.choose(1) is None and router.routes == {}


def test_a_relayed_peer_never_relays():
    router, _ = _router([_peer(1), _peer(2), _peer(3, load=9)])
    router.peers[2].relay = object()  # we reach 2 through a relay ourselves: never a relay of a relay
    assert router.choose(1).via == 3


class _Link:
    """A live link of the relay to a destination: it holds what is queued."""

    def __init__(self) -> None:
        self.rail = 0
        self.out_bytes = 0
        self.items = []

    def queue(self, item) -> None:
        self.items.append(item)
        self.out_bytes += item.total


def _relay(world: int):
    peers = [_peer(r) for r in range(1, world)]
    for p in peers:
        p.links = [_Link()]
    return _router(peers)[0]


def _flood(router, src: int, dsts, frame: int) -> int:
    """``src`` asks the relay (rank 0) to pass frames on to every rank of ``dsts`` while it admits them
    (and nothing is written meanwhile: the destinations' sockets are full); the bytes the relay then holds."""
    for _ in range(64):
        for dst in dsts:
            if router.admit(src, dst, frame):
                assert router.forward(src, dst, memoryview(bytearray(frame))) is not None
    return sum(router.held.values())


def test_one_source_cannot_make_a_relay_hold_a_window_per_destination():
    """Issue 48 item 5: the bound was per pair, so one hostile rank that asked a relay to pass
    frames on to each of N ranks made it hold N windows."""
    from linkescape.engine import relay

    source_windows, relay_windows = getattr(relay, "SOURCE_WINDOWS", 2), getattr(relay, "RELAY_WINDOWS", 16)
    window, frame = 4 << 20, 1 << 20
    router = _relay(64)
    held = _flood(router, 1, range(2, 64), frame)
    assert held <= source_windows * window + frame, held >> 20
    assert router.held_by_src == {1: held} and router.held_total == held
    # every source together: bounded by the relay's share, not by the number of ranks
    for src in range(2, 40):
        _flood(router, src, [d for d in range(1, 64) if d != src][:4], frame)
    assert router.held_total <= relay_windows * window + frame, router.held_total >> 20
    assert router.held_total == sum(router.held.values()) == sum(router.held_by_src.values())
    # writing what is held releases it, and the sources may go on
    for p in router.peers.values():
        for item in p.links[0].items:
            item.on_sent()
        p.links[0].items.clear()
    assert router.held_total == 0 and not router.held and not router.held_by_src
    assert sorted(router.take_unblocked())[:3] == [1, 2, 3]
    assert router.admit(1, 2, frame)


def test_a_rank_that_advertises_no_load_does_not_attract_relays_past_what_we_measured():
    """Issue 48: the relay was chosen by the load candidates advertise alone, so a rank that
    advertised zero attracted every relay. What we saw a rank pass on to us counts too."""
    router, clock = _router([_peer(1), _peer(2, load=0), _peer(3, load=2), _peer(4, up=False)])
    for src in (5, 6, 7, 8):  # rank 2 passed frames of four pairs on to us lately, whatever it says
        router.saw(2, src)
    assert router.measured(2) == 4
    assert router.choose(1).via == 3
    clock.advance_ms(10_001)  # what we saw ages out
    assert router.measured(2) == 0 and router.seen == {2: {}}
