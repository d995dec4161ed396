"""Issue 17 on real loopback sockets: strangers who read the store cannot
evict a host's genuine re-dials (item 3), a REJECT says whether it was
verified (item 6a), and a link's rail is the listener's and the dialer's
address's, not only what the HELLO says (item 6b)."""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import socket
import threading
import time

import pytest

from linkescape.config import Config
from linkescape.errors import AuthError, HandshakeError, RailMismatch, UnverifiedReject
from linkescape.protocol.handshake import (CHALLENGE, HELLO_SIZE, MAGIC, REJECT, VERSION, LinkAuth, Msg, Reject)
from linkescape.transport import tcp
from linkescape.transport.acceptor import Acceptor

KEY = b"link-security-test-key-012345678"
JOB = b"00112233445566778899aabbccddeeff"
#: a store reader has the job, the ranks and the addresses, not the key
STRANGER_KEY = b"a store reader's best guess....."
#: the host of ranks 1..5 (they re-dial rank 0 at once, after a failback)
HOST = "127.0.0.2"
#: where the flood comes from: several addresses, each holding fewer slots than HOST
FLOODERS = ["127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"]
WORLD = 6


class Accepting:
    """Rank 0 of a job accepting on its listeners (one per rail), on a
    thread that waits on the acceptor only, as recovery's does."""

    def __init__(self, listen_on=("127.0.0.1",), world=WORLD, peer_addrs=None, **config) -> None:
        self.config = Config(**{"handshake_timeout": 2.0, **config})
        self.listeners = [tcp.listen(a) for a in listen_on]
        self.addrs = [l.getsockname() for l in self.listeners]
        self.acceptor = Acceptor(self.listeners, LinkAuth(KEY, JOB, 0, world, len(listen_on)), self.config,
                                 peer_addrs=peer_addrs)
        self.epochs = {}
        self.links = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def admit(self, peer, rail, epoch):
        last = self.epochs.get((peer, rail), 1)
        if epoch <= last:
            raise HandshakeError(f"stale epoch {epoch}")
        self.epochs[(peer, rail)] = epoch
        return 1

    def _run(self):
        while not self.stop.is_set():
            ready, _, _ = select.select([self.acceptor], [], [], 0.1)
            if ready:
                self.links += self.acceptor.poll(self.admit)

    def wait_rejected(self, n, timeout=5.0):
        deadline = time.monotonic() + timeout
        while self.acceptor.rejected < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.acceptor.rejected

    def close(self):
        self.stop.set()
        self.thread.join()
        for link in self.links:
            link.sock.close()
        self.acceptor.close()
        for l in self.listeners:
            l.close()


@pytest.fixture
def accepting():
    made = []

    def make(**kw):
        a = Accepting(**kw)
        made.append(a)
        return a
    yield make
    for a in made:
        a.close()


def _conn(source, addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.IPPROTO_IP, tcp.IP_BIND_ADDRESS_NO_PORT, 1)
        s.bind((source, 0))
        s.settimeout(5)
        s.connect(addr)
    except BaseException:
        s.close()
        raise
    return s


def _stranger_hello(src, rail=0, dst=0):
    """A well-formed HELLO for this job, from someone without the key."""
    hs = LinkAuth(STRANGER_KEY, JOB, src, WORLD, 1).dialer(dst, rail, 1 << 30, 1, time.monotonic() + 10)
    return hs.data_to_send()


def _read_all(sock, timeout=5.0):
    sock.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except (ConnectionResetError, socket.timeout):
            return out
        if not chunk:
            return out
        out += chunk


# ------------------------------------------------------------------ item 3: floods of valid HELLOs
@pytest.mark.parametrize("known", [True, False], ids=["addresses-known", "addresses-unknown"])
def test_a_flood_of_valid_hellos_from_several_addresses_never_evicts_a_hosts_re_dials(accepting, known):
    """Ranks 1..5 share a host and re-dial rank 0 at once (a failback): each
    sent its HELLO and waits for its proof's turn. A store reader floods
    well-formed HELLOs (the right job, ranks and rail, no key) and stalled
    connections from four other addresses, each holding fewer slots than
    the host. Every genuine re-dial gets through."""
    peers = {p: [(HOST, 1)] for p in range(1, WORLD)} if known else None
    acc = accepting(max_pending_handshakes=8, peer_addrs=peers)
    addr = acc.addrs[0]
    dials = []
    for src in range(1, WORLD):  # the host's re-dials, each now waiting (as if slow) before its proof
        hs = LinkAuth(KEY, JOB, src, WORLD, 1).dialer(0, 0, 2, 1, time.monotonic() + 20)
        s = _conn(HOST, addr)
        s.sendall(hs.data_to_send())
        hs.receive_data(s.recv(CHALLENGE.size), time.monotonic())
        dials.append((s, hs))
    flood = []
    for i in range(3):  # valid HELLOs claiming the host's very links, spread over the flooders
        for j, source in enumerate(FLOODERS):
            s = _conn(source, addr)
            s.sendall(_stranger_hello(1 + (i * len(FLOODERS) + j) % (WORLD - 1)))
            flood.append(s)
    for _ in range(4):  # and connections that stall half-way through a HELLO
        for source in FLOODERS:
            s = _conn(source, addr)
            s.sendall(_stranger_hello(1)[:50])
            flood.append(s)
    # 33 connections for 8 slots: 25 of them must go, none of the host's
    assert acc.wait_rejected(len(flood) + len(dials) - 8) >= len(flood) + len(dials) - 8
    for s, hs in dials:
        s.sendall(hs.data_to_send())  # the proof, late
        while not hs.done:
            data = s.recv(hs.want())
            assert data, "a genuine re-dial was evicted"
            hs.receive_data(data, time.monotonic())
        assert hs.state == "established"
    deadline = time.monotonic() + 5
    while len(acc.links) < len(dials) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted((l.peer, l.rail) for l in acc.links) == [(p, 0) for p in range(1, WORLD)]
    # Every one that went was the flood's: a keyless HELLO the acceptor read is refused on arrival
    # (auth); one whose HELLO was still in flight when a newer connection needed the slot was the
    # least advanced and made room (evicted). Which of the two is a race (CI saw 11 and 14).
    why = acc.acceptor.rejected_by
    assert set(why) <= {"auth", "evicted"} and sum(why.values()) >= len(flood) + len(dials) - 8, why
    for s in flood + [s for s, _ in dials]:
        s.close()


def _hello_flood(addr, seconds, counter):
    """Valid HELLOs from several addresses as fast as possible, each left
    open (stalled) until 40 newer ones are."""
    open_socks = []
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        for source in FLOODERS:
            try:
                s = _conn(source, addr)
                s.sendall(_stranger_hello(1 + n % (WORLD - 1)))
            except OSError:
                continue
            open_socks.append(s)
            n += 1
            if len(open_socks) > 40:
                open_socks.pop(0).close()
    for s in open_socks:
        s.close()
    counter.value = n


def test_live_re_dials_of_a_multi_rank_host_all_get_through_a_hello_flood(accepting):
    acc = accepting(max_pending_handshakes=16, peer_addrs={p: [(HOST, 1)] for p in range(1, WORLD)})
    addr = acc.addrs[0]
    counter = mp.get_context("fork").Value("i", 0)
    flood = mp.get_context("fork").Process(target=_hello_flood, args=(addr, 3.5, counter), daemon=True)
    flood.start()
    failures, done = [], {p: 0 for p in range(1, WORLD)}

    def redial(src):
        epoch = 1
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            epoch += 1
            hs = LinkAuth(KEY, JOB, src, WORLD, 1).dialer(0, 0, epoch, 1, time.monotonic() + 5)
            try:
                sock, est = tcp.connect(HOST, addr, hs, acc.config, time.monotonic() + 5)
            except (OSError, HandshakeError) as exc:  # every re-dial must get through, no retry
                failures.append((src, epoch, repr(exc)))
                return
            sock.close()
            done[src] += 1
            time.sleep(0.01)
    try:
        time.sleep(0.3)  # the flood gets going
        threads = [threading.Thread(target=redial, args=(p,)) for p in range(1, WORLD)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        flood.join(10)
        if flood.is_alive():
            flood.kill()
    print(f"re-dials {done} through {counter.value} flooding HELLOs; rejected {acc.acceptor.rejected_by}")
    assert failures == [] and min(done.values()) >= 3
    assert counter.value > 100 and acc.acceptor.rejected_by.get("auth", 0) > counter.value // 2


# ------------------------------------------------------------------ item 6a: REJECT verified or not
def _fake_acceptor(reply):
    """A listener that answers every HELLO with ``reply(hello)``: what someone
    who took a rank's address in the store (or writes into the stream) sends."""
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(4)

    def serve():
        conn, _ = l.accept()
        with conn:
            conn.settimeout(5)
            hello = b""
            while len(hello) < HELLO_SIZE:
                hello += conn.recv(HELLO_SIZE - len(hello))
            conn.sendall(reply(hello))
            _read_all(conn, 1.0)
        l.close()
    threading.Thread(target=serve, daemon=True).start()
    return l.getsockname()


@pytest.mark.parametrize("reason", [Reject.BAD_PROOF, Reject.REFUSED, Reject.BAD_ROUTE])
def test_a_forged_reject_makes_the_dialer_say_unverified_not_different_keys(reason):
    addr = _fake_acceptor(lambda hello: REJECT.pack(MAGIC, VERSION, Msg.REJECT, int(reason), os.urandom(32)))
    hs = LinkAuth(KEY, JOB, 2, 3, 1).dialer(0, 0, 1, 1, time.monotonic() + 5)
    with pytest.raises(UnverifiedReject) as err:
        tcp.connect("127.0.0.1", addr, hs, Config(), time.monotonic() + 5)
    assert "unverified" in str(err.value) and err.value.peer == 0


def test_a_real_key_mismatch_is_unverified_too_and_still_an_auth_error(accepting):
    acc = accepting(world=3)
    hs = LinkAuth(b"the other key, 32 bytes long....", JOB, 2, 3, 1).dialer(0, 0, 2, 1, time.monotonic() + 5)
    with pytest.raises(AuthError) as err:  # start-up still stops on it, naming the rank
        tcp.connect("127.0.0.1", acc.addrs[0], hs, acc.config, time.monotonic() + 5)
    assert isinstance(err.value, UnverifiedReject) and err.value.peer == 0 and "unverified" in str(err.value)
    assert acc.wait_rejected(1) == 1 and acc.acceptor.rejected_by == {"auth": 1}


def test_a_refusal_from_a_rank_with_our_key_is_verified(accepting):
    acc = accepting(world=3)
    acc.epochs[(2, 0)] = 9  # a stale epoch: refused after the proof
    hs = LinkAuth(KEY, JOB, 2, 3, 1).dialer(0, 0, 5, 1, time.monotonic() + 5)
    with pytest.raises(HandshakeError) as err:
        tcp.connect("127.0.0.1", acc.addrs[0], hs, acc.config, time.monotonic() + 5)
    assert not isinstance(err.value, AuthError) and "unverified" not in str(err.value)


# ------------------------------------------------------------------ item 6b: the rail is the listener's
RANK0_RAILS = ("127.0.0.1", "127.0.0.2")
RANK2_RAILS = ("127.0.0.11", "127.0.0.12")


def _dial(acc, source, listener_rail, rail):
    hs = LinkAuth(KEY, JOB, 2, 3, 2).dialer(0, rail, 2 + len(acc.links) + acc.acceptor.rejected, 1,
                                            time.monotonic() + 5)
    return tcp.connect(source, acc.addrs[listener_rail], hs, acc.config, time.monotonic() + 5)


@pytest.mark.parametrize("known", [True, False], ids=["addresses-known", "addresses-unknown"])
def test_a_dial_on_another_rails_listener_is_rejected(accepting, known):
    peers = {1: [("127.0.0.21", 1), ("127.0.0.22", 1)], 2: [(a, 1) for a in RANK2_RAILS]} if known else None
    acc = accepting(listen_on=RANK0_RAILS, world=3, peer_addrs=peers)
    with pytest.raises(RailMismatch) as err:  # "rail 1", mis-routed to the rail-0 listener
        _dial(acc, RANK2_RAILS[1], 0, 1)
    assert (err.value.peer, err.value.rail) == (0, 1) and not isinstance(err.value, AuthError)
    with pytest.raises(RailMismatch):  # "rail 0" on the rail-1 listener
        _dial(acc, RANK2_RAILS[0], 1, 0)
    assert acc.wait_rejected(2) == 2 and acc.acceptor.rejected_by == {"route": 2} and acc.links == []
    for rail in (0, 1):  # where they belong, they get through
        sock, est = _dial(acc, RANK2_RAILS[rail], rail, rail)
        sock.close()
        assert est.rail == rail
    deadline = time.monotonic() + 5
    while len(acc.links) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted((l.peer, l.rail, l.addr[0]) for l in acc.links) == [(2, 0, RANK2_RAILS[0]), (2, 1, RANK2_RAILS[1])]


def test_a_dial_from_another_address_than_the_ranks_on_that_rail_is_rejected(accepting):
    peers = {1: [("127.0.0.21", 1), ("127.0.0.22", 1)], 2: [(a, 1) for a in RANK2_RAILS]}
    acc = accepting(listen_on=RANK0_RAILS, world=3, peer_addrs=peers)
    with pytest.raises(RailMismatch):  # rank 2's rail-0 link, dialed from its rail-1 address (the wrong NIC)
        _dial(acc, RANK2_RAILS[1], 0, 0)
    with pytest.raises(RailMismatch):  # or from rank 1's address
        _dial(acc, "127.0.0.21", 0, 0)
    assert acc.wait_rejected(2) == 2 and acc.acceptor.rejected_by == {"route": 2} and acc.links == []
    sock, est = _dial(acc, RANK2_RAILS[0], 0, 0)
    sock.close()
    assert est.rail == 0
