"""End-to-end MACs of relayed frames (protocol/relaymac.py, issue 48): the
pair's key comes from both ranks' X25519 keys and the job's key; a relay, a
rank of the job, holds the job's key and every public key, never a private
one."""

from __future__ import annotations

import pytest

from linkescape.errors import ProtocolError
from linkescape.protocol.frames import BYE, DATA, pack_header
from linkescape.protocol.relaymac import SCHEME, TRAILER, WINDOW, RankKeys, Unknown
from linkescape.testing import job_keys

KEY = b"k" * 32
JOB = b"0123456789abcdef0123456789abcdef"


def _ends():
    zero, one = job_keys(2, KEY, JOB)
    return zero.pair(1), one.pair(0)


def test_a_frame_sealed_by_one_end_opens_at_the_other_only():
    zero, one = _ends()
    frame = pack_header(DATA, 3, 0, msg=1, length=4, arg=4) + b"abcd"
    sealed = one.seal(frame[:48], frame[48:]) + frame
    assert bytes(zero.open(memoryview(sealed))) == frame
    with pytest.raises(ProtocolError):  # reflected to its sender as the other's
        one.open(memoryview(sealed))
    altered = bytearray(sealed)
    altered[-1] ^= 1
    with pytest.raises(ProtocolError, match="end-to-end MAC"):
        zero.open(memoryview(bytes(altered)))
    assert "k" * 8 not in repr(zero) and "k" * 8 not in repr(zero._keys)


def test_a_relay_with_the_jobs_key_and_every_public_key_cannot_forge():
    """Rank 2 relays for ranks 0 and 1, whether or not they ever shared a link: it holds the job's
    key and both public keys (it read the store), and makes a key 'of rank 1' with its own private
    key: rank 0 refuses what it seals. A pair key made with another job's key fails too (a store
    writer who swapped a public key without holding the job's key)."""
    zero, one, two = job_keys(3, KEY, JOB)
    bye = pack_header(BYE, 0, 0)
    posing = RankKeys(1, KEY, JOB)  # rank 2's doing: its own X25519 key under rank 1's name
    posing.learn(0, zero.public)
    to_zero = zero.pair(1)
    with pytest.raises(ProtocolError, match="end-to-end MAC"):
        to_zero.open(memoryview(posing.pair(0).seal(bye) + bye))
    stranger = RankKeys(1, b"s" * 32, JOB, private=b"\x07" * 32)  # another key, a key pair it made
    stranger.learn(0, zero.public)
    zero_swapped = RankKeys(0, KEY, JOB)
    zero_swapped.learn(1, stranger.public)  # the store said rank 1's key is the stranger's
    with pytest.raises(ProtocolError):
        zero_swapped.pair(1).open(memoryview(stranger.pair(0).seal(bye) + bye))
    # the genuine pair: both ends derive the same key; another job's token gives another
    assert zero.derive(1) == one.derive(0) != two.derive(0)
    other_job = job_keys(2, KEY, b"another job")
    assert other_job[0].derive(1) != zero.derive(1)
    assert bytes(to_zero.open(memoryview(one.pair(0).seal(bye) + bye))) == bye


def test_no_mac_another_scheme_a_small_order_key_and_an_unknown_peer():
    zero, one = _ends()
    bye = pack_header(BYE, 0, 0)
    for trailer in (bytes(TRAILER.size), TRAILER.pack(SCHEME + 1, 1, bytes(16))):
        with pytest.raises(ProtocolError):  # a frame without an end-to-end MAC is a forgery
            zero.open(memoryview(trailer + bye))
    with pytest.raises(ProtocolError, match="no trailer"):
        zero.open(memoryview(b"\x01" * 8))
    k = RankKeys(0, KEY, JOB)
    k.learn(1, bytes(32))  # a public key of small order (a forger's pick): no key, never a fixed one
    assert not k.pair(1).can_seal()  # no relay is chosen for the pair
    with pytest.raises(Unknown, match="small order"):  # no verdict on its frames: not the relay's doing
        k.pair(1).open(memoryview(one.seal(bye) + bye))
    with pytest.raises(ValueError):
        k.learn(2, b"short")
    lone = RankKeys(0, KEY, JOB)  # a peer whose record had no public key: no verdict, and nothing sealed
    assert not lone.pair(1).can_seal()
    with pytest.raises(Unknown, match="no public key"):
        lone.pair(1).open(memoryview(one.seal(bye) + bye))
    with pytest.raises(Unknown):
        lone.pair(1).seal(bye)


def _hb(n=0):
    return pack_header(BYE, 0, 0, arg=n)


def test_a_relayed_frame_is_taken_once():
    """Issue 48 review: a relay that replays a frame (a NOTIFY_SILENT or NOTIFY_DOWN tears down a
    healthy direct link each time it is taken) gets no verdict; frames reordered across the
    relay's rails within the window are taken once each."""
    zero, one = _ends()
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
    scheme, counter, tag = TRAILER.unpack_from(sealed[0])
    moved = TRAILER.pack(scheme, counter + 1000, tag) + sealed[0][TRAILER.size:]
    with pytest.raises(ProtocolError, match="end-to-end MAC"):
        zero.open(memoryview(moved))
