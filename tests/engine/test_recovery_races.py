"""Recovery's thread reads the engine's link states without the engine's lock, and a dial's outcome
reaches the engine later (``call_soon``). A dial that ended (adopted, or failed with a new back-off)
must never be dialed again on a state read from before the engine took that outcome: at 64 ranks on
this machine that race re-dialed 26 backups of a healthy start-up, and the replaced links showed as
``link_down`` on both sides of each pair (``replaced by a new connection`` / ``LinkClosed``).

Stub engine, no threads: the interleavings are played in order."""

from __future__ import annotations

import select
import socket

from linkescape.config import Config
from linkescape.engine.recovery import Recovery
from linkescape.engine.io import Signal
from linkescape.engine.clock import SYSTEM


class _Heap:
    def due(self):
        return None

    def run(self, now):
        pass


class _Engine:
    """What Recovery uses of the engine; link (0, rail 1) starts down with its first try due."""

    def __init__(self) -> None:
        self.rank = 1
        self.clock = SYSTEM
        self.recovery_signal = Signal()
        self.heap = _Heap()
        self.closed = False
        self.state = {(0, 1): (0.0, True)}  # (peer, rail) -> (next try, never up) while down
        self.adopted = []
        self.failed = []
        self.seen_dialing = []
        self.recovery = None
        self.dial_answers = []
        self.wanted = set()
        self.probed = []
        self.stranded_peers = set()

    def down_links(self):
        return [(p, r, nxt, first) for (p, r), (nxt, first) in self.state.items()]

    def redial_due(self, peer, rail):
        return self.state.get((peer, rail))

    def stranded(self, peer):
        return peer in self.stranded_peers

    def expected_from(self, peer):
        return 1

    def call_soon(self, fn):
        fn()

    def adopt(self, link, peer_expected):
        self.seen_dialing.append((link.peer, link.rail) in self.recovery.dialing)
        self.state.pop((link.peer, link.rail), None)
        self.adopted.append(link)

    def dial_failed(self, peer, rail, refused, answered=False):
        self.seen_dialing.append((peer, rail) in self.recovery.dialing)
        self.failed.append((peer, rail))
        self.dial_answers.append((refused, answered))

    def probes_wanted(self):
        return list(self.wanted)

    def probe_taken(self, peer):
        self.wanted.discard(peer)

    def listener_probed(self, peer, rail, refused, answered=False):
        self.probed.append((peer, rail, refused, answered))


class _Auth:
    def __init__(self) -> None:
        self.dials = []

    def dialer(self, peer, rail, epoch, expected, deadline):
        self.dials.append((peer, rail, epoch))
        raise OSError(111, "refused (stub)")  # the dial ends at once, as a refused connect does


class _Acceptor:
    def fileno(self):
        return -1


def _recovery():
    eng = _Engine()
    auth = _Auth()
    rec = Recovery(eng, auth, _Acceptor(), ["127.0.0.1", "127.0.0.2"], [None, None],
                   {0: [("127.0.0.1", 1), ("127.0.0.2", 1)]}, Config(carrier_watch=False))
    eng.recovery = rec
    return eng, auth, rec


class _Hs:
    peer_expected = 1
    link_key = None


def test_a_link_adopted_after_the_list_was_read_is_not_dialed_again():
    eng, auth, rec = _recovery()
    listed = eng.down_links()
    # the engine adopts the link between the list and the dialing check: the fresh read says so
    eng.state.clear()
    eng.down_links = lambda: listed
    rec._start_dials(SYSTEM.now())
    assert auth.dials == [] and not rec.dialing


def test_a_back_off_set_after_the_list_was_read_is_kept():
    eng, auth, rec = _recovery()
    listed = eng.down_links()
    now = SYSTEM.now()
    eng.state[(0, 1)] = (now + 5.0, True)  # a failed dial's back-off, set after the list was read
    eng.down_links = lambda: listed
    rec._start_dials(now)
    assert auth.dials == []


def test_a_down_link_is_dialed():
    eng, auth, rec = _recovery()
    rec._start_dials(SYSTEM.now())
    assert auth.dials == [(0, 1, 2)]
    assert eng.failed == [(0, 1)]  # (the stub refused it)


def test_a_dial_leaves_dialing_only_once_the_engine_took_its_outcome():
    eng, auth, rec = _recovery()
    a, b = socket.socketpair()
    try:
        rec.dialing.add((0, 1))
        rec._adopt(a, 0, 1, 2, _Hs())
        assert eng.adopted and eng.seen_dialing == [True] and not rec.dialing
        rec.dialing.add((0, 1))
        rec._dial_failed((0, 1), OSError(110, "timed out"))
        assert eng.failed == [(0, 1)] and eng.seen_dialing == [True, True] and not rec.dialing
    finally:
        a.close()
        b.close()


class _Accepted:
    def __init__(self, sock) -> None:
        self.sock, self.peer, self.rail, self.epoch = sock, 0, 1, 2
        self.peer_expected, self.link_key = 1, None


def test_a_handshake_completed_before_close_is_adopted_so_that_it_gets_a_bye():
    """A rank that closes right after start-up: a peer's backup handshake completed (the peer counts
    the link as up) and recovery's thread had not looked again. Closing it unseen was a reset at the
    peer, which then found every rail refused and failed with PeerLost."""
    eng, auth, rec = _recovery()
    a, b = socket.socketpair()
    polled = []

    def poll(admit):
        polled.append(admit(0, 1, 2))
        return [_Accepted(a)]
    rec.acceptor.poll = poll
    try:
        rec.close()
        assert polled == [1] and [(l.peer, l.rail) for l in eng.adopted] == [(0, 1)]
    finally:
        for link in eng.adopted:
            link.close()
        b.close()


class _ProvedDial:
    """A dial whose proof is sent: ``step`` finishes it once the acceptor's answer is readable."""

    def __init__(self, sock, proved=True) -> None:
        self.sock, self.proved, self.established, self.closed = sock, proved, _Hs(), False
        self.due = float("inf")  # (no deadline of its own in these tests)
        self.connected = True  # (its proof is sent: the TCP connection is up)

    def fileno(self):
        return self.sock.fileno()

    def step(self, now):
        return bool(self.sock.recv(1))

    def close(self):
        self.closed = True
        self.sock.close()


def test_a_dial_whose_proof_is_sent_is_finished_at_close_so_that_it_gets_a_bye():
    """The rest of the case above, seen from the dialer: the acceptor adopted the link as it
    answered, and our close came before we read the answer. Closed unfinished, the dial was a reset
    at a peer that counted the link as up; with no other link to us it then found every rail
    refused and failed with PeerLost (32 ranks closing right after start-up, 3 runs in 12).
    A dial that proved nothing yet cannot be up anywhere and is closed at once."""
    eng, auth, rec = _recovery()
    rec.acceptor.poll = lambda admit: []
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    proved, early = _ProvedDial(a), _ProvedDial(c, proved=False)
    rec.epochs[(0, 1)] = 2
    rec._dials = {a.fileno(): ((0, 1), proved), c.fileno(): ((0, 0), early)}
    try:
        b.send(b"A")  # the acceptor's answer, already on its way
        rec.close()
        assert [(l.peer, l.rail) for l in eng.adopted] == [(0, 1)]
        assert not proved.closed and early.closed and not rec._dials
    finally:
        for link in eng.adopted:
            link.close()
        for s in (b, d):
            s.close()


def test_an_unanswered_proved_dial_is_closed_when_the_close_wait_ends(monkeypatch):
    from linkescape.engine import recovery

    monkeypatch.setattr(recovery, "CLOSE_DIALS", 0.05)
    eng, auth, rec = _recovery()
    rec.acceptor.poll = lambda admit: []
    a, b = socket.socketpair()
    dial = _ProvedDial(a)
    rec.epochs[(0, 1)] = 2
    rec._dials = {a.fileno(): ((0, 1), dial)}
    try:
        rec.close()
        assert dial.closed and not eng.adopted and not rec._dials
    finally:
        b.close()


def test_a_wanted_probe_is_made_once_per_request_and_says_whether_the_listener_answered():
    """Liveness asks for a probe of a peer's listeners (every link ended with FIN/RST, or its store
    record stopped): one connect per rail, and the peer leaves the wanted set (it is asked again while
    still needed). A wanted peer once stayed wanted for good: its listeners were probed twice a second
    for the rest of the job."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    closed = socket.socket()
    closed.bind(("127.0.0.2", 0))  # bound, not listening: the kernel refuses
    try:
        eng = _Engine()
        eng.state.clear()
        rec = Recovery(eng, _Auth(), _Acceptor(), ["127.0.0.1", "127.0.0.2"], [None, None],
                       {0: [listener.getsockname(), closed.getsockname()]}, Config(carrier_watch=False))
        eng.recovery = rec
        eng.wanted.add(0)
        now = SYSTEM.now()
        rec._start_probes(now)
        assert eng.wanted == set()
        deadline = now + 2.0
        while rec._probes and SYSTEM.now() < deadline:
            poller = select.poll()
            for fd in rec._probes:
                poller.register(fd, select.POLLOUT)
            rec._advance_probes(dict(poller.poll(100)), SYSTEM.now())
        assert sorted(eng.probed) == [(0, 0, False, True), (0, 1, True, False)]
        rec._start_probes(SYSTEM.now() + 1.0)  # nothing wanted: nothing probed
        assert len(eng.probed) == 2 and not rec._probes
    finally:
        listener.close()
        closed.close()


def test_a_dial_whose_connect_completed_tells_the_engine_the_listener_answered():
    eng, auth, rec = _recovery()
    rec.dialing.add((0, 1))
    rec._dial_failed((0, 1), OSError(110, "handshake timed out"), answered=True)
    rec.dialing.add((0, 1))
    rec._dial_failed((0, 1), OSError(111, "refused"))
    assert eng.dial_answers == [(False, True), (True, False)]


def test_a_peer_is_probed_on_every_rail_at_once_or_stays_wanted():
    """Probes in flight are bounded (MAX_DIALS): a peer whose rails do not all fit is left wanted
    for the next round, not taken with a rail unprobed (a knock with no connect made would read as
    nobody answering)."""
    from linkescape.engine.recovery import MAX_DIALS

    eng, _auth, rec = _recovery()
    eng.state.clear()
    eng.wanted.add(0)
    rec._probes = {-(i + 1): None for i in range(MAX_DIALS - 1)}  # one slot left, the peer has two rails
    rec._start_probes(SYSTEM.now())
    assert eng.wanted == {0} and len(rec._probes) == MAX_DIALS - 1 and not rec._probed


class _SilentDial:
    """A dial whose SYN went into a black hole: never connected, given up past ``connect_by``."""

    def __init__(self, started: float, connect_by: float) -> None:
        self.started, self.connect_by, self.first = started, connect_by, False
        self.connected = False
        self.closed = False

    @property
    def due(self) -> float:
        return self.connect_by

    def step(self, now: float) -> bool:
        if now > self.connect_by:
            raise socket.timeout("connect timed out")
        return False

    def close(self) -> None:
        self.closed = True


def test_a_dial_in_flight_is_given_up_soon_once_its_peer_has_no_rail_left():
    """A dial begun while the peer had another rail waits half a second for its SYN's answer; once the
    peer has no rail left, a SYN lost in a black hole repaired since must not hold the pair that long."""
    eng, auth, rec = _recovery()
    dial = _SilentDial(started=100.0, connect_by=100.5)
    rec.dialing.add((0, 1))
    rec._dials[7] = ((0, 1), dial)
    rec._advance_dials({}, 100.2)
    assert not eng.failed and not dial.closed  # the peer still has a rail: its dial goes on
    eng.stranded_peers.add(0)
    rec._advance_dials({}, 100.2)
    assert eng.failed == [(0, 1)] and dial.closed and not rec._dials  # given up 0.15 s after it began


def test_a_stranded_peers_dials_get_a_short_connect():
    eng, auth, rec = _recovery()
    auth.dialer = lambda *a: object()
    made = []

    class _Dial(_SilentDial):
        def __init__(self, local, remote, handshake, config, deadline, connect_by=None):
            super().__init__(0.0, connect_by)
            self.done = False
            made.append(self)

        def fileno(self):
            return 9

    import linkescape.engine.recovery as recovery_mod
    real = recovery_mod.tcp.Dial
    recovery_mod.tcp.Dial = _Dial
    try:
        eng.state[(0, 1)] = (0.0, False)  # down after having been up: a re-dial
        rec._start_dials(50.0)
        eng.stranded_peers.add(0)
        rec._dials.clear()
        rec.dialing.clear()
        rec._start_dials(60.0)
    finally:
        recovery_mod.tcp.Dial = real
    assert made[0].connect_by == 50.5 and made[1].connect_by == 60.15
