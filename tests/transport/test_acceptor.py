"""The non-blocking acceptor on real loopback sockets: authenticated dials get
through; strangers, floods, stalls and replays get nothing and are counted."""

from __future__ import annotations

import logging
import multiprocessing as mp
import select
import socket
import threading
import time

import pytest

from linkescape.config import Config
from linkescape.errors import AuthError, HandshakeError, NotYet
from linkescape.protocol.handshake import CHALLENGE, REJECT, LinkAuth, Msg, Proved, Reject
from linkescape.transport import tcp
from linkescape.transport.acceptor import Acceptor

KEY = b"acceptor-test-key-0123456789abcd"
JOB = b"00112233445566778899aabbccddeeff"


class Harness:
    """Rank 0 of a 3-rank job, accepting on one loopback listener. Its thread
    waits on the acceptor's descriptor only, as recovery's thread does: stalled
    handshakes must be reaped by the acceptor's own timer."""

    def __init__(self, **config) -> None:
        self.config = Config(**{"handshake_timeout": 2.0, **config})
        self.listener = tcp.listen("127.0.0.1")
        self.addr = self.listener.getsockname()
        self.acceptor = Acceptor([self.listener], LinkAuth(KEY, JOB, 0, 3, 1), self.config)
        self.epochs = {}
        self.links = []
        self.refuse = False
        self.later = False
        self.max_pending = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def admit(self, peer, rail, epoch):
        if self.refuse:
            raise HandshakeError("not now")
        if self.later:
            raise NotYet("opened after start-up")
        last = self.epochs.get((peer, rail), 1)
        if epoch <= last:
            raise HandshakeError(f"stale epoch {epoch}")
        self.epochs[(peer, rail)] = epoch
        return 42

    def _run(self):
        while not self.stop.is_set():
            ready, _, _ = select.select([self.acceptor], [], [], 0.2)
            if ready:
                self.links += self.acceptor.poll(self.admit)
                self.max_pending = max(self.max_pending, len(self.acceptor.pending))

    def dial(self, epoch, key=KEY, src=2, timeout=5.0):
        hs = LinkAuth(key, JOB, src, 3, 1).dialer(0, 0, epoch, 7, time.monotonic() + timeout)
        return tcp.connect("127.0.0.1", self.addr, hs, self.config, time.monotonic() + timeout)

    def wait_links(self, n, timeout=10.0):
        deadline = time.monotonic() + timeout
        while len(self.links) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.links

    def close(self):
        self.stop.set()
        self.thread.join()
        for link in self.links:
            link.sock.close()
        self.acceptor.close()
        self.listener.close()


@pytest.fixture
def harness(request):
    made = []

    def make(**config):
        h = Harness(**config)
        made.append(h)
        return h
    yield make
    for h in made:
        h.close()


def _read_all(sock, timeout=10.0):
    sock.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def test_an_authenticated_dial_opens_a_link_both_ways(harness):
    h = harness()
    sock, est = h.dial(epoch=2)
    assert (est.peer, est.rail, est.epoch, est.peer_expected) == (0, 0, 2, 42)
    [link] = h.wait_links(1)
    assert (link.peer, link.rail, link.epoch, link.peer_expected) == (2, 0, 2, 7)
    assert not sock.getblocking() and not link.sock.getblocking()
    sock.sendall(b"frames follow")
    link.sock.setblocking(True)
    assert link.sock.recv(100) == b"frames follow"  # nothing of it was eaten by the handshake
    sock.close()
    assert h.acceptor.rejected == 0


def test_a_wrong_key_is_an_auth_error_and_is_counted(harness):
    h = harness()
    with pytest.raises(AuthError) as err:
        h.dial(epoch=2, key=b"some other key of the same size!")
    assert err.value.peer == 0
    deadline = time.monotonic() + 5
    while h.acceptor.rejected < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert h.acceptor.rejected_by == {"auth": 1} and h.acceptor.auth_failures == {2: 1}
    assert h.links == [] and h.epochs == {}  # no epoch moved


def test_a_link_accepted_only_later_is_refused_quietly_and_not_counted_as_a_rejection(harness, caplog):
    # a peer whose start-up ended dials a backup while this rank still starts up: nothing is wrong
    h = harness()
    h.later = True
    with caplog.at_level(logging.DEBUG, logger="linkescape"):
        with pytest.raises((HandshakeError, OSError)):
            h.dial(epoch=2)
        deadline = time.monotonic() + 5
        # the acceptor's thread counts, then logs: wait for both (CI read the text between the two)
        while ((h.acceptor.rejected_by.get("later", 0) < 1 or "not yet accepting" not in caplog.text)
               and time.monotonic() < deadline):
            time.sleep(0.01)
    assert h.acceptor.rejected_by == {"later": 1} and h.acceptor.rejected == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "not yet accepting" in caplog.text
    h.later = False
    h.dial(epoch=3)[0].close()  # the dialer's next try gets through
    assert len(h.wait_links(1)) == 1


def test_a_peer_that_closes_mid_handshake_is_counted_but_not_warned_about(harness, caplog):
    """A rank of the job (its HELLO showed the key) whose connection closes before the handshake
    ends (the job closing while backups are dialed) is an INFO line; a stranger's close, a WARN."""
    h = harness()
    with caplog.at_level(logging.INFO, logger="linkescape.transport"):
        hs = LinkAuth(KEY, JOB, 2, 3, 1).dialer(0, 0, 5, 1, time.monotonic() + 5)
        s = socket.create_connection(h.addr)
        s.sendall(hs.data_to_send())
        s.settimeout(5)
        assert len(s.recv(CHALLENGE.size)) == CHALLENGE.size  # the HELLO was taken: a challenge back
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()  # a reset, as a closing process's dial ends
        deadline = time.monotonic() + 5
        # the acceptor's thread counts, then logs: wait for both (make test read the records between the two)
        while ((h.acceptor.rejected < 1 or "closed before its handshake ended" not in caplog.text)
               and time.monotonic() < deadline):
            time.sleep(0.01)
        assert h.acceptor.rejected_by == {"closed": 1}
        mine = [r for r in caplog.records if "closed before its handshake ended" in r.getMessage()]
        assert mine and mine[0].levelno == logging.INFO and "rank 2's connection on rail 0" in mine[0].getMessage()
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        stranger = socket.create_connection(h.addr)
        stranger.sendall(b"\x00" * 3)
        stranger.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        stranger.close()
        def warned():
            return [r for r in caplog.records if r.levelno == logging.WARNING and "rejected a connection" in
                    r.getMessage()]
        # (the acceptor's thread counts the rejection, then logs it: wait for both)
        while (h.acceptor.rejected < 2 or not warned()) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert h.acceptor.rejected_by == {"closed": 2}
    assert warned()


def test_a_stranger_gets_a_rejection_never_a_nonce_or_a_proof(harness):
    h = harness()
    hs = LinkAuth(b"guessed key, not the job's key..", JOB, 2, 3, 1).dialer(0, 0, 1 << 30, 1 << 40,
                                                                            time.monotonic() + 5)
    s = socket.create_connection(h.addr)
    s.sendall(hs.data_to_send())
    rest = _read_all(s)  # its HELLO does not show the key: a REJECT on arrival, then the close
    s.close()
    assert len(rest) == REJECT.size and REJECT.unpack(rest)[2:4] == (Msg.REJECT, Reject.BAD_PROOF)
    assert h.links == [] and h.epochs == {}


def test_a_recorded_handshake_replayed_on_a_new_connection_fails(harness):
    h = harness()
    hs = LinkAuth(KEY, JOB, 2, 3, 1).dialer(0, 0, 5, 1, time.monotonic() + 5)
    s = socket.create_connection(h.addr)
    hello = hs.data_to_send()
    s.sendall(hello)
    s.settimeout(5)
    hs.receive_data(s.recv(CHALLENGE.size), time.monotonic())
    proof = hs.data_to_send()
    s.sendall(proof)
    s.recv(100)
    s.close()
    h.wait_links(1)
    # the same bytes again, as someone who recorded them would send them
    r = socket.create_connection(h.addr)
    r.sendall(hello)
    r.recv(CHALLENGE.size)
    r.sendall(proof)
    rest = _read_all(r)
    r.close()
    assert REJECT.unpack(rest)[2:4] == (Msg.REJECT, Reject.BAD_PROOF)
    assert len(h.links) == 1 and h.epochs == {(2, 0): 5}


def test_an_authenticated_but_refused_dialer_gets_a_handshake_error(harness):
    h = harness()
    h.refuse = True
    with pytest.raises(HandshakeError) as err:
        h.dial(epoch=3)
    assert not isinstance(err.value, AuthError)
    h.refuse = False
    h.dial(epoch=3)[0].close()


def test_a_silent_connection_is_closed_at_its_deadline(harness):
    h = harness(handshake_timeout=0.3)
    s = socket.create_connection(h.addr)
    assert _read_all(s, timeout=10.0) == b""  # closed by the acceptor, unprompted
    s.close()
    assert h.acceptor.rejected_by == {"timeout": 1} and not h.acceptor.pending


def test_pending_handshakes_are_bounded_and_a_dial_still_gets_through(harness):
    h = harness(max_pending_handshakes=8)
    stalled = [socket.create_connection(h.addr) for _ in range(60)]
    for s in stalled:
        s.sendall(b"L")  # a byte, never the rest
    sock, _ = h.dial(epoch=2)
    sock.close()
    deadline = time.monotonic() + 5
    while h.acceptor.rejected_by.get("evicted", 0) < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert h.max_pending <= 8 and len(h.acceptor.pending) <= 8
    assert h.acceptor.rejected_by.get("evicted", 0) >= 50
    for s in stalled:
        s.close()


#: where the attackers come from: another host than the job's dialer (on one
#: address, the flood's closed connections would share ports and TIME_WAIT
#: state with the dialer's, and the kernel's port reuse, not the acceptor,
#: would decide whether the dial gets through)
ATTACKER = "127.0.0.3"


def _attacker_conn(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # ports picked per 4-tuple at connect: a flood must not use up the
        # machine's ephemeral ports (the dialer's own connect would fail)
        s.setsockopt(socket.IPPROTO_IP, tcp.IP_BIND_ADDRESS_NO_PORT, 1)
        s.bind((ATTACKER, 0))
        s.settimeout(1)
        s.connect(addr)
    except BaseException:
        s.close()
        raise
    return s


def _flood(addr, seconds, counter):
    """connect and close as fast as possible"""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        try:
            s = _attacker_conn(addr)
            s.close()
            n += 1
        except OSError:
            pass
    counter.value = n


def _slowloris(addr, conns, seconds):
    """hold connections open, each sending one byte of a HELLO a second"""
    socks = []
    for _ in range(conns):
        try:
            socks.append(_attacker_conn(addr))
        except OSError:
            pass
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s in list(socks):
            try:
                s.send(b"E")
            except OSError:
                socks.remove(s)
                try:
                    socks.append(_attacker_conn(addr))  # and back
                except OSError:
                    pass
        time.sleep(1.0)
    for s in socks:
        s.close()


def test_dials_get_through_floods_and_slow_handshakes(harness):
    h = harness(max_pending_handshakes=16)
    ctx = mp.get_context("fork")
    counter = ctx.Value("i", 0)
    attackers = [ctx.Process(target=_flood, args=(h.addr, 6.0, counter), daemon=True),
                 ctx.Process(target=_slowloris, args=(h.addr, 100, 6.0), daemon=True)]
    for p in attackers:
        p.start()
    try:
        time.sleep(0.5)  # let them get going
        epoch = 1
        dialed = 0
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            epoch += 1
            sock, est = h.dial(epoch=epoch)  # every dial must succeed, no retry
            assert est.epoch == epoch
            sock.close()
            dialed += 1
            time.sleep(0.01)  # hundreds of dials, not thousands of TIME_WAIT ports
    finally:
        for p in attackers:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert dialed >= 5 and len(h.wait_links(dialed)) == dialed
    print(f"{dialed} dials through {counter.value} flood connections and 100 slow ones; "
          f"acceptor rejected {h.acceptor.rejected_by}")
    assert counter.value > 100 and h.acceptor.rejected > counter.value // 2


def test_rejections_are_logged_at_a_limited_rate(harness, caplog):
    h = harness()
    with caplog.at_level(logging.WARNING, logger="linkescape.transport"):
        for _ in range(100):
            s = socket.create_connection(h.addr)
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            _read_all(s)
            s.close()
        deadline = time.monotonic() + 5
        while h.acceptor.rejected < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert h.acceptor.rejected == 100
    lines = [r for r in caplog.records if "rejected a connection" in r.getMessage()]
    assert 1 <= len(lines) <= 2


def test_dialing_a_closed_port_is_an_os_error():
    l = tcp.listen("127.0.0.1")
    addr = l.getsockname()
    l.close()
    hs = LinkAuth(KEY, JOB, 2, 3, 1).dialer(0, 0, 1, 1, time.monotonic() + 2)
    with pytest.raises(OSError):
        tcp.connect("127.0.0.1", addr, hs, Config(), time.monotonic() + 2)


def test_closing_the_acceptor_closes_what_is_pending():
    l = tcp.listen("127.0.0.1")
    acc = Acceptor([l], LinkAuth(KEY, JOB, 0, 3, 1), Config())
    s = socket.create_connection(l.getsockname())
    deadline = time.monotonic() + 5
    while not acc.pending and time.monotonic() < deadline:
        acc.wait(0.1)
        acc.poll(lambda *a: 1)
    assert len(acc.pending) == 1
    acc.close()
    assert _read_all(s) == b""
    assert acc.poll(lambda *a: 1) == []
    s.close()
    l.close()


def test_a_dial_outlasts_a_flood_of_stalled_connections_from_its_own_host(harness):
    """Connections that never send a whole HELLO, from the dialer's own
    address: they make room before a dial waiting for its proof."""
    h = harness(max_pending_handshakes=8)
    stalled = []
    real = socket.create_connection(h.addr, source_address=("127.0.0.2", 0))
    hs = LinkAuth(KEY, JOB, 2, 3, 1).dialer(0, 0, 9, 1, time.monotonic() + 10)
    real.sendall(hs.data_to_send())
    real.settimeout(10)
    hs.receive_data(real.recv(CHALLENGE.size), time.monotonic())  # the real dial now waits, as if slow
    for _ in range(40):  # then a flood of half HELLOs from the same host
        s = socket.create_connection(h.addr, source_address=("127.0.0.2", 0))
        s.sendall(LinkAuth(KEY, JOB, 2, 3, 1).dialer(0, 0, 1 << 30, 1, time.monotonic() + 10).data_to_send()[:40])
        stalled.append(s)
    deadline = time.monotonic() + 5
    while h.acceptor.rejected_by.get("evicted", 0) < 33 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert h.acceptor.rejected_by.get("evicted", 0) >= 33
    real.sendall(hs.data_to_send())  # the proof, late: its slot was kept
    while not hs.done:
        hs.receive_data(real.recv(hs.want()), time.monotonic())
    assert hs.state == "established" and len(h.wait_links(1)) == 1
    for s in stalled + [real]:
        s.close()


def test_a_dial_gives_up_a_silent_connect_soon_and_an_answered_handshake_late():
    """Recovery's dials: the TCP connect alone has ``connect_by`` (a SYN that
    vanished on a black-holed path), a peer that answered has until the
    whole deadline (a loaded acceptor answered after 0.5 s, the dialer had
    closed a link the acceptor kept, and the backups of a 64-rank job churned
    thousands of times)."""
    slow = socket.socket()  # a listener that never runs the handshake: the kernel completes the connect
    slow.bind(("127.0.0.1", 0))
    slow.listen(4)
    try:
        now = time.monotonic()
        hs = LinkAuth(KEY, JOB, 1, 3, 1).dialer(0, 0, 2, 1, now + 5.0)
        dial = tcp.Dial("127.0.0.1", slow.getsockname(), hs, Config(), now + 5.0, connect_by=now + 0.05)
        try:
            assert not dial.step(now + 1.0)  # connected: waiting for the handshake, past connect_by
            assert dial.connected and dial.due == dial.deadline
            with pytest.raises(socket.timeout):
                dial.step(now + 5.1)
        finally:
            dial.close()
    finally:
        slow.close()


def test_a_dial_is_proved_from_its_proof_sent_until_the_answer_is_read():
    """What a graceful close waits for (engine/recovery): a dial whose proof is sent may already be
    a link at the acceptor, which adopts it as it answers; before its proof it is a link nowhere."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    try:
        now = time.monotonic()
        hs = LinkAuth(KEY, JOB, 1, 3, 1).dialer(0, 0, 2, 1, now + 5.0)
        dial = tcp.Dial("127.0.0.1", lst.getsockname(), hs, Config(), now + 5.0)
        peer, _ = lst.accept()
        try:
            acc = LinkAuth(KEY, JOB, 0, 3, 1).acceptor(now + 5.0)
            dial.step(time.monotonic())
            assert not dial.proved  # the HELLO alone
            while acc.state == "hello":
                acc.receive_data(peer.recv(acc.want()), time.monotonic())
            peer.sendall(acc.data_to_send())  # the CHALLENGE
            while not dial.proved:
                assert not dial.step(time.monotonic())
            event = None
            while event is None:
                event = acc.receive_data(peer.recv(acc.want()), time.monotonic())
            assert isinstance(event, Proved)
            acc.admit(1)
            peer.sendall(acc.data_to_send())  # the ACCEPT: the link is up at the acceptor
            while not dial.step(time.monotonic()):
                pass
            assert dial.done and not dial.proved
        finally:
            dial.close()
            peer.close()
    finally:
        lst.close()
