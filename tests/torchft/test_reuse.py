"""linkescape.torchft.reuse: when a quorum shrinks the current group, and when it builds one."""

from __future__ import annotations

from linkescape.torchft import reuse


def offers(*ranks, group="h:1/q0", size=4, lost=()):
    return [reuse.parse(reuse.offer(group, r, size, lost)) for r in ranks]


def test_members_that_stay_in_order_shrink():
    assert reuse.excluded(offers(0, 2, 3, lost=[1])) == [1]
    assert reuse.excluded(offers(1, 2)) == [0, 3]


def test_what_builds_a_new_group():
    assert reuse.excluded(offers(0, 1, 2, 3)) is None  # the same members: nobody to leave out
    assert reuse.excluded(offers(0, 3, 2)) is None  # out of order: shrink would number them otherwise
    assert reuse.excluded(offers(0, 0, 2)) is None  # a rank twice
    assert reuse.excluded(offers(0, 2, lost=[3, 2])) is None  # a member that stays is known gone
    assert reuse.excluded(offers(0, 5)) is None  # out of range
    mixed = offers(0, 1) + [reuse.parse(reuse.offer(None, 0, 0, ()))]  # a replica that joins
    assert reuse.excluded(mixed) is None
    other = offers(0) + offers(1, group="h:1/q9")  # members of two different groups
    assert reuse.excluded(other) is None
    assert reuse.excluded(offers(0, 1, size=3) + offers(2, size=4)) is None
    assert reuse.excluded([]) is None


def test_garbage_offers_build():
    assert reuse.parse(b"\xff") == {} and reuse.parse(b"[1]") == {} and reuse.parse(b"{") == {}
    assert reuse.excluded([reuse.parse(b'{"group": 1, "rank": 0, "size": 2}')]) is None
    assert reuse.excluded([{"group": "g", "rank": "0", "size": 2}]) is None
