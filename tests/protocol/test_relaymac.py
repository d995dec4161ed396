"""End-to-end MACs of relayed frames (protocol/relaymac.py, issue 48): the
pair's key comes from the pair's own handshake, which a relay never sees."""

from __future__ import annotations

import pytest

from linkescape.errors import ProtocolError
from linkescape.protocol.frames import BYE, DATA, pack_header
from linkescape.protocol.handshake import AcceptorHandshake, DialerHandshake
from linkescape.protocol.relaymac import NO_KEY, TRAILER, PairKeys, Unknown

KEY = b"k" * 32
JOB = b"0123456789abcdef0123456789abcdef"


def _pair_key(src=1, dst=0, rail=0, epoch=1):
    d = DialerHandshake(KEY, JOB, src, dst, rail, epoch, 0, 10.0)
    a = AcceptorHandshake(KEY, JOB, dst, 4, 2, 10.0)
    a.receive_data(d.data_to_send(), 0.0)
    d.receive_data(a.data_to_send(), 0.0)
    a.receive_data(d.data_to_send(), 0.0)
    a_est = a.admit(0)
    d_est = d.receive_data(a.data_to_send(), 0.0)
    assert d_est.link_key.pair == a_est.link_key.pair  # both ends hold the same pair key
    return d_est.link_key.pair


def _ends(key):
    zero, one = PairKeys(0, 1), PairKeys(1, 0)
    zero.add(0, 1, key)
    one.add(0, 1, key)
    return zero, one


def test_a_frame_sealed_by_one_end_opens_at_the_other_only():
    key = _pair_key()
    zero, one = _ends(key)
    frame = pack_header(DATA, 3, 0, msg=1, length=4, arg=4) + b"abcd"
    sealed = one.seal(frame[:48], frame[48:]) + frame
    assert bytes(zero.open(memoryview(sealed))) == frame
    with pytest.raises(ProtocolError):  # reflected to its sender as the other's
        one.open(memoryview(sealed))
    altered = bytearray(sealed)
    altered[-1] ^= 1
    with pytest.raises(ProtocolError, match="end-to-end MAC"):
        zero.open(memoryview(bytes(altered)))
    # a relay holds the job's key, not the nonces of the pair's handshake: another handshake's key fails
    relay = PairKeys(1, 0)
    relay.add(0, 1, _pair_key())
    with pytest.raises(ProtocolError):
        zero.open(memoryview(relay.seal(pack_header(BYE, 0, 0)) + pack_header(BYE, 0, 0)))


def test_a_pair_without_a_key_and_an_unknown_key_id():
    nokey = TRAILER.pack(NO_KEY, 0, bytes(16)) + pack_header(BYE, 0, 0)
    assert bytes(PairKeys(0, 1).open(memoryview(nokey))) == pack_header(BYE, 0, 0)  # neither end has a key
    zero, one = _ends(_pair_key())
    with pytest.raises(ProtocolError, match="without a key"):  # a downgrade: we share one
        zero.open(memoryview(nokey))
    later = PairKeys(1, 0)
    later.add(1, 7, b"x" * 32)
    with pytest.raises(Unknown):  # a link we have not adopted yet: no verdict
        zero.open(memoryview(later.seal(pack_header(BYE, 0, 0)) + pack_header(BYE, 0, 0)))


def test_the_first_key_is_kept_and_sealed_with_across_re_dials():
    key = _pair_key()
    zero, one = _ends(key)
    for epoch in range(2, 9):
        zero.add(0, epoch, _pair_key(epoch=epoch))
    assert zero.primary == (0, 1) and sorted(zero.keys[0]) == [1, 8]
    hb = pack_header(BYE, 0, 0)
    assert bytes(one.open(memoryview(zero.seal(hb) + hb))) == hb
    assert "k" * 8 not in repr(zero)
