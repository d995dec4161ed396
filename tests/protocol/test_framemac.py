"""Frame MACs (LINKESCAPE_FRAME_AUTH), sans I/O: a tag binds a frame's bytes
to its place on one link, in one direction."""

from __future__ import annotations

from linkescape.protocol.framemac import TAG_SIZE, FrameMac
from linkescape.protocol.frames import ACK, DATA, pack_header

KEY = bytes(range(32))


def test_a_frame_verifies_in_its_place_only():
    a, b = FrameMac(KEY), FrameMac(KEY)
    h1, h2 = pack_header(DATA, 1, 0, length=3), pack_header(ACK, 0, 1)
    t1, t2 = a.seal(h1, b"xyz"), a.seal(h2)
    assert len(t1) == TAG_SIZE
    assert b.check(t1, h1, b"xyz") and b.check(t2, h2)


def test_altered_replayed_reordered_or_foreign_frames_fail():
    h = pack_header(DATA, 1, 0, length=3)
    a = FrameMac(KEY)
    t0, t1 = a.seal(h, b"abc"), a.seal(h, b"abc")
    assert t0 != t1  # the same bytes in another place carry another tag
    assert not FrameMac(KEY).check(t0, h, b"abd")  # altered payload
    assert not FrameMac(KEY).check(t0, pack_header(DATA, 2, 0, length=3), b"abc")  # altered header
    b = FrameMac(KEY)
    assert b.check(t0, h, b"abc") and not b.check(t0, h, b"abc")  # replayed
    assert not FrameMac(KEY).check(t1, h, b"abc")  # out of order
    assert not FrameMac(bytes(32)).check(t0, h, b"abc")  # another link's key


def test_forged_tags_never_verify():
    b = FrameMac(KEY)
    h = pack_header(ACK, 0, 1 << 40)
    assert not b.check(bytes(TAG_SIZE), h)
