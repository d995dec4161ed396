"""Frame MACs (LINKESCAPE_FRAME_AUTH), sans I/O: a tag binds a frame's bytes
to its place on one link, in one direction. The keys come from real
handshakes (``handshake.link_keys``, HKDF, one key per direction)."""

from __future__ import annotations

import pytest

from linkescape.protocol.framemac import TAG_SIZE, FrameMac
from linkescape.protocol.frames import ACK, DATA, pack_header
from linkescape.protocol.handshake import AcceptorHandshake, DialerHandshake, FrameKeys, hkdf

KEY = b"k" * 32
JOB = b"0123456789abcdef0123456789abcdef"


def handshake(src=1, dst=0, rail=0, epoch=1):
    """One whole handshake between rank ``src`` (dialer) and ``dst``: both
    sides' frame keys."""
    d = DialerHandshake(KEY, JOB, src, dst, rail, epoch, 0, 10.0)
    a = AcceptorHandshake(KEY, JOB, dst, 4, 2, 10.0)
    a.receive_data(d.data_to_send(), 0.0)
    d.receive_data(a.data_to_send(), 0.0)
    a.receive_data(d.data_to_send(), 0.0)
    a_est = a.admit(0)
    d_est = d.receive_data(a.data_to_send(), 0.0)
    return d_est.link_key, a_est.link_key


def test_a_frame_verifies_in_its_place_only():
    kd, ka = handshake()
    a, b = FrameMac(kd), FrameMac(ka)
    h1, h2 = pack_header(DATA, 1, 0, length=3), pack_header(ACK, 0, 1)
    t1, t2 = a.seal(h1, b"xyz"), a.seal(h2)
    assert len(t1) == TAG_SIZE
    assert b.check(t1, h1, b"xyz") and b.check(t2, h2)
    # and the other way
    t3 = b.seal(h2)
    assert a.check(t3, h2)


def test_a_frame_reflected_to_its_sender_fails():
    """An on-path attacker feeds rank A the frames A sent to B: both counters
    start at 0, so with one key per link every tag verified (A+A)."""
    kd, ka = handshake()
    a, b = FrameMac(kd), FrameMac(ka)
    h = pack_header(DATA, 1, 0, length=8)
    for side in (a, b):
        tags = [side.seal(h, b"contrib!") for _ in range(3)]
        assert not any(side.check(t, h, b"contrib!") for t in tags)


def test_a_frame_replayed_on_a_re_dial_fails():
    kd1, ka1 = handshake(epoch=1)
    kd2, ka2 = handshake(epoch=1)  # the same link re-dialed: fresh nonces
    h = pack_header(DATA, 1, 0, length=3)
    t = FrameMac(kd1).seal(h, b"abc")
    assert FrameMac(ka1).check(t, h, b"abc")
    assert not FrameMac(ka2).check(t, h, b"abc")
    assert not FrameMac(kd2).check(t, h, b"abc")


def test_a_frame_moved_to_another_link_fails():
    h = pack_header(DATA, 1, 0, length=3)
    kd, _ka = handshake(rail=0)
    t = FrameMac(kd).seal(h, b"abc")
    for other in (handshake(rail=1), handshake(src=2), handshake(src=1, dst=0, rail=0, epoch=2)):
        for keys in other:
            assert not FrameMac(keys).check(t, h, b"abc")


def test_altered_replayed_reordered_or_foreign_frames_fail():
    kd, ka = handshake()
    h = pack_header(DATA, 1, 0, length=3)
    a = FrameMac(kd)
    t0, t1 = a.seal(h, b"abc"), a.seal(h, b"abc")
    assert t0 != t1  # the same bytes in another place carry another tag
    assert not FrameMac(ka).check(t0, h, b"abd")  # altered payload
    assert not FrameMac(ka).check(t0, pack_header(DATA, 2, 0, length=3), b"abc")  # altered header
    b = FrameMac(ka)
    assert b.check(t0, h, b"abc") and not b.check(t0, h, b"abc")  # replayed
    assert not FrameMac(ka).check(t1, h, b"abc")  # out of order


def test_forged_tags_never_verify():
    _kd, ka = handshake()
    b = FrameMac(ka)
    h = pack_header(ACK, 0, 1 << 40)
    assert not b.check(bytes(TAG_SIZE), h)


def test_one_key_for_both_directions_is_refused():
    with pytest.raises(TypeError):
        FrameMac(KEY)
    with pytest.raises(ValueError):
        FrameKeys(KEY, KEY)
    assert "k" not in repr(FrameKeys(b"a" * 32, b"b" * 32)) and "aaaa" not in repr(FrameKeys(b"a" * 32, b"b" * 32))


def test_hkdf_matches_rfc_5869_test_case_1():
    ikm = bytes.fromhex("0b" * 22)
    salt = bytes.fromhex("000102030405060708090a0b0c")
    info = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9")
    okm = ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
           "34007208d5b887185865")
    assert hkdf(ikm, salt, info, 42).hex() == okm
