"""End-to-end MACs of relayed frames (protocol/relaymac.py, issue 48): the
pair's key comes from the pair's own handshake, which a relay never sees."""

from __future__ import annotations

import pytest

from linkescape.errors import ProtocolError
from linkescape.protocol.frames import BYE, DATA, pack_header
from linkescape.protocol.handshake import AcceptorHandshake, DialerHandshake
from linkescape.protocol.relaymac import NO_KEY, TRAILER, WINDOW, PairKeys, Unknown

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
    nokey = TRAILER.pack(NO_KEY, 0, 0, bytes(16)) + pack_header(BYE, 0, 0)
    assert bytes(PairKeys(0, 1).open(memoryview(nokey))) == pack_header(BYE, 0, 0)  # neither end has a key
    zero, one = _ends(_pair_key())
    # we hold a key: never taken (a downgrade), but no verdict either: the origin's frames sent
    # before it adopted the pair's first link are in flight (it adopts on reading ACCEPT)
    with pytest.raises(Unknown, match="without a key"):
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


def _hb(n=0):
    return pack_header(BYE, 0, 0, arg=n)


def test_a_relayed_frame_is_taken_once():
    """Issue 48 review: a relay that replays a frame (a NOTIFY_SILENT or NOTIFY_DOWN tears down a
    healthy direct link each time it is taken) gets no verdict; frames reordered across the
    relay's rails within the window are taken once each."""
    zero, one = _ends(_pair_key())
    sealed = [one.seal(_hb(i)) + _hb(i) for i in range(WINDOW + 5)]  # counters 1, 2, ...
    assert bytes(zero.open(memoryview(sealed[0]))) == _hb(0)
    with pytest.raises(Unknown, match="replay"):
        zero.open(memoryview(sealed[0]))
    assert bytes(zero.open(memoryview(sealed[2]))) == _hb(2)  # 1 still to come (reordered)
    assert bytes(zero.open(memoryview(sealed[1]))) == _hb(1)
    for frame in sealed[:3]:
        with pytest.raises(Unknown):
            zero.open(memoryview(frame))
    assert bytes(zero.open(memoryview(sealed[WINDOW + 4]))) == _hb(WINDOW + 4)
    with pytest.raises(Unknown):  # below the window: too old to tell, dropped
        zero.open(memoryview(sealed[3]))
    assert bytes(zero.open(memoryview(sealed[4]))) == _hb(4)  # the oldest counter in the window
    # the counter is under the tag: a relay cannot move a frame to a fresh counter
    rail, epoch, counter, tag = TRAILER.unpack_from(sealed[0])
    moved = TRAILER.pack(rail, epoch, counter + 1000, tag) + sealed[0][TRAILER.size:]
    with pytest.raises(ProtocolError, match="end-to-end MAC"):
        zero.open(memoryview(moved))


def test_the_origin_seals_with_a_key_the_peer_has_shown_it_holds():
    """Issue 48 review: the acceptor adopts a link when it sends ACCEPT; when the ACCEPT is lost,
    the dialer never holds that key. Before, the acceptor sealed with its first key for good and
    every relayed frame of it was dropped at the dialer ('that direction never works'). Now it
    seals with the newest key of a link that has carried a frame of the peer's."""
    lost = _pair_key(epoch=1)  # the first dial: the dialer (1) never read ACCEPT
    acceptor, dialer = PairKeys(0, 1), PairKeys(1, 0)
    heard = {1: False, 2: False}
    acceptor.add(0, 1, lost, heard=lambda: heard[1])
    with pytest.raises(Unknown):  # sealed with the only key it holds: no verdict at the dialer
        dialer.open(memoryview(acceptor.seal(_hb()) + _hb()))
    again = _pair_key(epoch=2)  # the re-dial: both adopt it
    acceptor.add(0, 2, again, heard=lambda: heard[2])
    dialer.add(0, 2, again)
    heard[2] = True  # a frame of the dialer's came on it
    assert acceptor.sealing() == (0, 2)
    assert bytes(dialer.open(memoryview(acceptor.seal(_hb(1)) + _hb(1)))) == _hb(1)
    # the dialer's first key is that one; a frame of the acceptor's verified under a key confirms it too
    assert dialer.sealing() == (0, 2) and dialer.confirmed == [(0, 2)]
    assert bytes(acceptor.open(memoryview(dialer.seal(_hb(2)) + _hb(2)))) == _hb(2)
