"""The link handshake as a pure state machine: two endpoints joined by a fake
wire, bytes fed whole or one at a time, time passed in."""

from __future__ import annotations

import struct

import pytest

from linkescape.errors import AuthError, HandshakeError
from linkescape.protocol import frames
from linkescape.protocol.handshake import (ACCEPT, CHALLENGE, HELLO_SIZE, MAX_MESSAGE, PROOF, REJECT, VERSION,
                                           AcceptorHandshake, DialerHandshake, Established, Hello, LinkAuth, Msg,
                                           Proved, Reject, decode_messages)

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
    assert d_est == Established(peer=0, rail=1, epoch=5, peer_expected=9)
    assert a_est == Established(peer=2, rail=1, epoch=5, peer_expected=17)
    assert proved == Proved(peer=2, rail=1, epoch=5, peer_expected=17)
    assert d.done and a.done and d.want() == 0 and a.want() == 0
    assert [len(m) for _, m in wire] == [HELLO_SIZE, CHALLENGE.size, PROOF.size, ACCEPT.size]


def test_the_key_never_crosses_the_wire():
    key = b"a-very-recognisable-secret-key!!"
    _, _, _, wire = run(dialer(key=key), acceptor(key=key))
    blob = b"".join(m for _, m in wire)
    for i in range(len(key) - 7):
        assert key[i:i + 8] not in blob


def test_acceptor_reveals_nothing_before_the_dialer_proved_the_key():
    d, a = dialer(key=b"wrong key" * 4), acceptor()
    a.receive_data(d.data_to_send(), 0.0)
    challenge = a.data_to_send()
    # the challenge is a fresh nonce and nothing else: no epoch, no expected, no proof
    assert len(challenge) == CHALLENGE.size
    magic, version, kind, nonce = CHALLENGE.unpack(challenge)
    assert (kind, version) == (Msg.CHALLENGE, VERSION) and nonce == a.nonce_a
    d.receive_data(challenge, 0.0)
    with pytest.raises(AuthError) as err:
        a.receive_data(d.data_to_send(), 0.0)
    assert err.value.peer == 2 and err.value.rail == 1
    rest = a.data_to_send()
    assert REJECT.unpack(rest)[2:] == (Msg.REJECT, Reject.BAD_PROOF)
    # the dialer learns it was its key, naming the rank it dialed
    with pytest.raises(AuthError) as err:
        d.receive_data(rest, 0.0)
    assert err.value.peer == 0
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
                                          ("nonce", 64)])
def test_every_hello_field_is_covered_by_the_proof(field, offset):
    d, a = dialer(src=3), acceptor()
    hello = bytearray(d.data_to_send())
    hello[offset] ^= 1  # src 3 -> 2, still a valid dialer: only the proof can tell
    a.receive_data(bytes(hello), 0.0)
    d.receive_data(a.data_to_send(), 0.0)
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
    a.receive_data(d.data_to_send(), 0.0)
    d.receive_data(a.data_to_send(), 0.0)
    with pytest.raises(AuthError):
        a.receive_data(d.data_to_send(), 0.0)  # the acceptor fails the dialer first...
    # ...and were it to accept anyway, its proof would fail at the dialer
    e = AcceptorHandshake(b"other" * 8, JOB, 0, 4, 2, 10.0)
    d2 = dialer()
    e.receive_data(d2.data_to_send(), 0.0)
    d2.receive_data(e.data_to_send(), 0.0)
    e.state, e.hello = "deciding", e.hello  # skip its (failing) check of the dialer
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
    assert REJECT.unpack(out)[2:] == (Msg.REJECT, Reject.BAD_HELLO)


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
