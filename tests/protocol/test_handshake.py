"""The link handshake as a pure state machine: two endpoints joined by a fake
wire, bytes fed whole or one at a time, time passed in."""

from __future__ import annotations

import struct

import pytest

from linkescape.errors import AuthError, HandshakeError, RailMismatch, UnverifiedReject
from linkescape.protocol import frames
from linkescape.protocol.handshake import (ACCEPT, CHALLENGE, HELLO_SIZE, MAGIC, MAX_MESSAGE, PROOF, REJECT, VERSION,
                                           AcceptorHandshake, DialerHandshake, Established, Hello, LinkAuth, Msg,
                                           Proved, Reject, decode_messages, hello_mac, reject_mac)

KEY = b"k" * 32
JOB = b"0123456789abcdef0123456789abcdef"


def dialer(key=KEY, job=JOB, src=2, dst=0, rail=1, epoch=5, expected=17, deadline=10.0, nonce=None):
    return DialerHandshake(key, job, src, dst, rail, epoch, expected, deadline, nonce=nonce)


def acceptor(key=KEY, job=JOB, rank=0, world_size=4, rails=2, deadline=10.0, nonce=None):
    return AcceptorHandshake(key, job, rank, world_size, rails, deadline, nonce=nonce)


def feed(side, data, now=0.0, step=None):
    """Feed ``data`` whole or ``step`` bytes at a time; returns the last event."""
    event = None
    if step is None:
        return side.receive_data(data, now)
    for i in range(0, len(data), step):
        event = side.receive_data(data[i:i + step], now) or event
    return event


def run(d, a, step=None, admit_expected=9):
    """Drive both sides to the end; returns (dialer event, acceptor event, wire log)."""
    wire = []
    hello = d.data_to_send()
    wire.append(("d", hello))
    assert feed(a, hello, step=step) is None
    challenge = a.data_to_send()
    wire.append(("a", challenge))
    assert feed(d, challenge, step=step) is None
    prf = d.data_to_send()
    wire.append(("d", prf))
    proved = feed(a, prf, step=step)
    assert isinstance(proved, Proved)
    a_est = a.admit(admit_expected)
    accept = a.data_to_send()
    wire.append(("a", accept))
    d_est = feed(d, accept, step=step)
    return d_est, a_est, proved, wire


@pytest.mark.parametrize("step", [None, 1, 3])
def test_both_sides_prove_the_key_and_agree_on_the_link(step):
    d, a = dialer(), acceptor()
    d_est, a_est, proved, wire = run(d, a, step=step)
    assert (d_est.peer, d_est.rail, d_est.epoch, d_est.peer_expected) == (0, 1, 5, 9)
    assert (a_est.peer, a_est.rail, a_est.epoch, a_est.peer_expected) == (2, 1, 5, 17)
    assert proved == Proved(peer=2, rail=1, epoch=5, peer_expected=17)
    # both ends hold the keys of this link alone (frame MACs), one per direction, swapped, and they are fresh
    assert len(d_est.link_key.send) == 32 and d_est.link_key == a_est.link_key.swapped()
    assert d_est.link_key.send != d_est.link_key.recv
    d2_est, a2_est, _, _ = run(dialer(), acceptor(), step=step)
    assert d2_est.link_key == a2_est.link_key.swapped() != d_est.link_key
    assert d.done and a.done and d.want() == 0 and a.want() == 0
    assert [len(m) for _, m in wire] == [HELLO_SIZE, CHALLENGE.size, PROOF.size, ACCEPT.size]


def test_the_key_never_crosses_the_wire():
    key = b"a-very-recognisable-secret-key!!"
    _, _, _, wire = run(dialer(key=key), acceptor(key=key))
    blob = b"".join(m for _, m in wire)
    for i in range(len(key) - 7):
        assert key[i:i + 8] not in blob


def test_acceptor_reveals_nothing_before_the_dialer_proved_the_key():
    d, a = dialer(), acceptor()
    a.receive_data(d.data_to_send(), 0.0)
    challenge = a.data_to_send()
    # the challenge is a fresh nonce and nothing else: no epoch, no expected, no proof
    assert len(challenge) == CHALLENGE.size
    magic, version, kind, nonce = CHALLENGE.unpack(challenge)
    assert (kind, version) == (Msg.CHALLENGE, VERSION) and nonce == a.nonce_a
    # a HELLO without the key gets no challenge at all: a REJECT on arrival
    d, a = dialer(key=b"wrong key" * 4), acceptor()
    with pytest.raises(AuthError) as err:
        a.receive_data(d.data_to_send(), 0.0)
    assert err.value.peer == 2 and err.value.rail == 1 and a.progress != 1
    rest = a.data_to_send()
    assert len(rest) == REJECT.size and REJECT.unpack(rest)[2:4] == (Msg.REJECT, Reject.BAD_PROOF)
    # the dialer cannot verify a REJECT made with another key: it says so, naming the rank it dialed
    with pytest.raises(UnverifiedReject) as err:
        d.receive_data(rest, 0.0)
    assert isinstance(err.value, AuthError) and err.value.peer == 0 and "unverified" in str(err.value)
    with pytest.raises(HandshakeError):
        a.admit(1)  # a failed handshake never admits


def test_a_recorded_handshake_fails_on_a_new_connection():
    d, a = dialer(), acceptor()
    _, _, _, wire = run(d, a)
    hello, prf = wire[0][1], wire[2][1]
    replay = acceptor()  # same job, key and rank: only its nonce is new
    replay.receive_data(hello, 0.0)
    assert replay.data_to_send()[8:] != wire[1][1][8:]  # a fresh challenge
    with pytest.raises(AuthError):
        replay.receive_data(prf, 0.0)


@pytest.mark.parametrize("field,offset", [("src", 8), ("rail", 16), ("epoch", 20), ("expected", 24),
                                          ("nonce", 64), ("mac", 96)])
def test_every_hello_field_is_covered_by_the_hello_mac(field, offset):
    d, a = dialer(src=3), acceptor()
    hello = bytearray(d.data_to_send())
    hello[offset] ^= 1  # src 3 -> 2, still a valid dialer: only the MAC can tell
    with pytest.raises(AuthError):
        a.receive_data(bytes(hello), 0.0)
    # and by the proof, for an acceptor that would let the HELLO through
    d, a = dialer(src=3), acceptor()
    a.receive_data(d.data_to_send(), 0.0)
    a.hello = Hello.unpack(bytes(hello)) if field != "mac" else a.hello
    d.receive_data(a.data_to_send(), 0.0)
    if field != "mac":
        with pytest.raises(AuthError):
            a.receive_data(d.data_to_send(), 0.0)


def test_acceptor_proof_is_checked_and_cannot_be_reflected():
    d, a = dialer(), acceptor()
    a.receive_data(d.data_to_send(), 0.0)
    d.receive_data(a.data_to_send(), 0.0)
    prf = d.data_to_send()
    a.receive_data(prf, 0.0)
    a.admit(9)
    accept = bytearray(a.data_to_send())
    accept[12] ^= 1  # the acceptor's expected, tampered in flight
    with pytest.raises(AuthError):
        d.receive_data(bytes(accept), 0.0)
    # the dialer's own proof sent back as an ACCEPT does not verify (labels differ)
    d2, a2 = dialer(nonce=bytes(32)), acceptor(nonce=bytes(32))
    a2.receive_data(d2.data_to_send(), 0.0)
    d2.receive_data(a2.data_to_send(), 0.0)
    mac = PROOF.unpack(d2.data_to_send())[3]
    forged = ACCEPT.pack(frames.MAGIC, VERSION, Msg.ACCEPT, 5, 17, mac)
    with pytest.raises(AuthError):
        d2.receive_data(forged, 0.0)


def test_impostor_acceptor_with_another_key_is_caught_by_the_dialer():
    d, a = dialer(), acceptor(key=b"other" * 8)
    with pytest.raises(AuthError):
        a.receive_data(d.data_to_send(), 0.0)  # the acceptor fails the dialer first...
    # ...and were it to accept anyway, its proof would fail at the dialer
    e = AcceptorHandshake(b"other" * 8, JOB, 0, 4, 2, 10.0)
    d2 = dialer()
    hello = d2.data_to_send()
    e.hello = Hello.unpack(hello)  # skip its (failing) checks of the dialer
    e.state = "deciding"
    e.nonce_a = bytes(32)
    d2.receive_data(CHALLENGE.pack(MAGIC, VERSION, Msg.CHALLENGE, e.nonce_a), 0.0)
    e.admit(1)
    with pytest.raises(AuthError) as err:
        d2.receive_data(e.data_to_send(), 0.0)
    assert err.value.peer == 0


def test_refused_after_proof_is_a_handshake_error_not_an_auth_error():
    d, a = dialer(), acceptor()
    a.receive_data(d.data_to_send(), 0.0)
    d.receive_data(a.data_to_send(), 0.0)
    assert isinstance(a.receive_data(d.data_to_send(), 0.0), Proved)
    a.refuse("stale epoch")
    with pytest.raises(HandshakeError) as err:
        d.receive_data(a.data_to_send(), 0.0)
    assert not isinstance(err.value, AuthError)


@pytest.mark.parametrize("hello_kw,why", [
    ({"job": b"another-job"}, "job"), ({"dst": 1}, "dst"), ({"src": 0, "dst": 0}, "own"),
    ({"src": 9}, "rank range"), ({"rail": 2}, "rail range"), ({"src": 1, "dst": 2}, "lower rank dials")])
def test_bad_hello_is_rejected_without_a_challenge(hello_kw, why):
    kw = dict(dict(src=2, dst=0, rail=1), **hello_kw)
    d = dialer(**kw)
    a = acceptor(rank=kw["dst"] if why == "lower rank dials" else 0)
    with pytest.raises(HandshakeError) as err:
        a.receive_data(d.data_to_send(), 0.0)
    assert not isinstance(err.value, AuthError)
    out = a.data_to_send()
    assert REJECT.unpack(out)[2:4] == (Msg.REJECT, Reject.BAD_HELLO)
    with pytest.raises(HandshakeError) as err:  # the dialer verifies it: a plain refusal, not a key matter
        d.receive_data(out, 0.0)
    assert not isinstance(err.value, AuthError)


def test_deadline():
    a = acceptor(deadline=1.0)
    d = dialer()
    hello = d.data_to_send()
    a.receive_data(hello[:10], 0.5)
    assert not a.expired(0.9) and a.expired(1.1)
    with pytest.raises(HandshakeError):
        a.receive_data(hello[10:], 1.1)
    assert a.state == "failed"
    d2 = dialer(deadline=2.0)
    with pytest.raises(HandshakeError):
        d2.receive_data(b"x", 3.0)


def test_malformed_out_of_order_and_trailing_bytes():
    cases = [
        b"GET / HTTP/1.1\r\n",                                       # not linkescape
        struct.pack("<IHH", frames.MAGIC, 1, Msg.HELLO) + bytes(200),  # version 1
        struct.pack("<IHH", frames.MAGIC, VERSION, 99),               # unknown type
        struct.pack("<IHH", frames.MAGIC, VERSION, Msg.PROOF) + bytes(32),  # proof before hello
        frames.pack_header(frames.Kind.ACK, 0, (1 << 64) - 1),      # a frame instead of a handshake
    ]
    for raw in cases:
        with pytest.raises(HandshakeError):
            acceptor().receive_data(raw, 0.0)
    d, a = dialer(), acceptor()
    with pytest.raises(HandshakeError):
        a.receive_data(d.data_to_send() + bytes(8), 0.0)  # what follows the HELLO must be a PROOF
    d, a = dialer(), acceptor()
    a.receive_data(d.data_to_send(), 0.0)
    d.receive_data(a.data_to_send(), 0.0)
    with pytest.raises(HandshakeError):
        a.receive_data(d.data_to_send() + b"extra", 0.0)  # nothing may follow the proof
    with pytest.raises(HandshakeError):
        a.receive_data(b"", 0.0)  # a failed handshake stays failed


def test_want_never_asks_past_the_current_message():
    d, a = dialer(), acceptor()
    hello = d.data_to_send()
    seen = []
    for b in hello:
        seen.append(a.want())
        a.receive_data(bytes([b]), 0.0)
    assert max(seen) <= MAX_MESSAGE and seen[0] == 8 and seen[8] == HELLO_SIZE - 8
    assert a.want() == 0 or a.state == "proof"
    assert a.reader.buf == bytearray()


def test_link_auth_makes_matching_sides_and_hides_the_key():
    auth0 = LinkAuth(KEY, JOB, 0, 3, 2)
    auth2 = LinkAuth(KEY, JOB, 2, 3, 2)
    d_est, a_est, _, _ = run(auth2.dialer(0, 1, 7, 1, 10.0), auth0.acceptor(10.0))
    assert (d_est.peer, a_est.peer, d_est.epoch) == (0, 2, 7)
    assert KEY.decode() not in repr(auth0)
    with pytest.raises(HandshakeError):
        LinkAuth(b"", JOB, 0, 3, 2)


def test_hello_is_still_importable_from_frames():
    assert frames.Hello is Hello and frames.HELLO_SIZE == HELLO_SIZE


def test_decode_messages_splits_a_transcript():
    _, _, _, wire = run(dialer(), acceptor())
    msgs = decode_messages(b"".join(m for _, m in wire))
    assert [k for k, _ in msgs] == [Msg.HELLO, Msg.CHALLENGE, Msg.PROOF, Msg.ACCEPT]
    with pytest.raises(HandshakeError):
        decode_messages(b"\x00" * 8)


# ------------------------------------------------------------------ REJECT: verified or not (issue 17, item 6)
def _forged_reject(reason, mac=bytes(32)):
    return REJECT.pack(MAGIC, VERSION, Msg.REJECT, int(reason), mac)


@pytest.mark.parametrize("reason", list(Reject))
def test_a_forged_reject_is_unverified_never_a_diagnosis(reason):
    """Whoever can write into the connection can send a REJECT; without the
    key it cannot make one that verifies, and the dialer says it cannot
    tell a forged REJECT from different keys."""
    for when in ("before the challenge", "after the proof"):
        d, a = dialer(), acceptor()
        a.receive_data(d.data_to_send(), 0.0)
        if when == "after the proof":
            d.receive_data(a.data_to_send(), 0.0)
            d.data_to_send()
        for mac in (bytes(32), b"\x5a" * 32):
            d2 = DialerHandshake(KEY, JOB, 2, 0, 1, 5, 17, 10.0, nonce=d.hello.nonce)
            d2.data_to_send()
            if when == "after the proof":
                d2.receive_data(CHALLENGE.pack(MAGIC, VERSION, Msg.CHALLENGE, a.nonce_a), 0.0)
            with pytest.raises(UnverifiedReject) as err:
                d2.receive_data(_forged_reject(reason, mac), 0.0)
            assert "unverified" in str(err.value) and "different keys" in str(err.value)
            assert err.value.peer == 0 and err.value.rail == 1 and err.value.reason == reason.name


def test_a_reject_replayed_from_another_dial_is_unverified():
    d, a = dialer(key=KEY), acceptor()
    a.receive_data(d.data_to_send(), 0.0)
    d.receive_data(a.data_to_send(), 0.0)
    a.receive_data(d.data_to_send(), 0.0)
    a.refuse("stale epoch")
    genuine = a.data_to_send()  # verifies for d, whose nonce it is bound to...
    d2 = dialer()
    d2.data_to_send()
    with pytest.raises(UnverifiedReject):  # ...and for no other dial
        d2.receive_data(genuine, 0.0)
    assert reject_mac(KEY, d.hello, Reject.REFUSED) == REJECT.unpack(genuine)[4]


def test_a_reject_from_an_acceptor_with_our_key_is_verified_and_says_what_it_is():
    # REFUSED after the proof: a refusal, not a key matter
    d, a = dialer(), acceptor()
    a.receive_data(d.data_to_send(), 0.0)
    d.receive_data(a.data_to_send(), 0.0)
    a.receive_data(d.data_to_send(), 0.0)
    a.refuse("stale epoch")
    with pytest.raises(HandshakeError) as err:
        d.receive_data(a.data_to_send(), 0.0)
    assert not isinstance(err.value, AuthError) and "unverified" not in str(err.value)
    # BAD_PROOF that verifies: the acceptor holds our key, so the proof was altered on the way
    d, a = dialer(), acceptor()
    a.receive_data(d.data_to_send(), 0.0)
    d.receive_data(a.data_to_send(), 0.0)
    prf = bytearray(d.data_to_send())
    prf[-1] ^= 1
    with pytest.raises(AuthError):
        a.receive_data(bytes(prf), 0.0)
    with pytest.raises(HandshakeError) as err:
        d.receive_data(a.data_to_send(), 0.0)
    assert not isinstance(err.value, AuthError) and "unverified" not in str(err.value)


def test_a_key_mismatch_is_reported_as_unverified_with_both_causes():
    """The dialer cannot verify a REJECT made with another key: a key
    mismatch stays an AuthError (start-up stops, naming the rank), worded
    as what it knows."""
    d, a = dialer(key=b"one key, not the other one......"), acceptor(key=b"the other key, not the one......")
    with pytest.raises(AuthError):
        a.receive_data(d.data_to_send(), 0.0)
    with pytest.raises(UnverifiedReject) as err:
        d.receive_data(a.data_to_send(), 0.0)
    assert isinstance(err.value, AuthError) and err.value.peer == 0 and "unverified" in str(err.value)


def test_the_hello_mac_is_the_key_over_every_field():
    d = dialer()
    hello = Hello.unpack(d.data_to_send())
    assert hello.mac == hello_mac(KEY, hello) != hello_mac(b"x" * 32, hello)
    assert hello.mac != hello_mac(KEY, Hello(hello.src, hello.dst, hello.rail, hello.epoch + 1, hello.expected,
                                             hello.job, hello.nonce))


def test_a_route_check_rejects_a_misrouted_dial_and_the_dialer_verifies_it():
    seen = []

    def route(hello):
        seen.append((hello.src, hello.rail))
        if hello.rail != 0:
            raise RailMismatch(f"rail {hello.rail} on the rail-0 listener", peer=hello.src, rail=hello.rail)

    d = dialer(rail=1)
    a = AcceptorHandshake(KEY, JOB, 0, 4, 2, 10.0, route=route)
    with pytest.raises(RailMismatch):
        a.receive_data(d.data_to_send(), 0.0)
    out = a.data_to_send()
    assert REJECT.unpack(out)[2:4] == (Msg.REJECT, Reject.BAD_ROUTE) and seen == [(2, 1)]
    with pytest.raises(RailMismatch) as err:
        d.receive_data(out, 0.0)
    assert (err.value.peer, err.value.rail) == (0, 1) and not isinstance(err.value, AuthError)
    # the check runs only for a HELLO that showed the key: a stranger learns nothing from it
    stranger = dialer(key=b"x" * 32, rail=1)
    with pytest.raises(AuthError):
        AcceptorHandshake(KEY, JOB, 0, 4, 2, 10.0, route=route).receive_data(stranger.data_to_send(), 0.0)
    assert seen == [(2, 1)]
    # a dial on the right rail goes through
    d_est, a_est, _, _ = run(dialer(rail=0), AcceptorHandshake(KEY, JOB, 0, 4, 2, 10.0, route=route))
    assert d_est.rail == a_est.rail == 0
