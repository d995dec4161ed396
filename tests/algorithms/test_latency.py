"""The k-nomial trees of the small all_reduce, the barrier, broadcast and reduce (algorithms/latency.py)."""

from __future__ import annotations

import math

import pytest

from linkescape.algorithms.latency import _tree


def _depth(n: int, root: int, radix: int) -> int:
    deepest, level, frontier = 0, 0, [root]
    while frontier:
        deepest = level
        frontier = [c for r in frontier for c in _tree(n, (r - root) % n, root, radix)[1]]
        level += 1
    return deepest


def _digits(rel: int, radix: int) -> int:
    count = 0
    while rel:
        count += rel % radix != 0
        rel //= radix
    return count


@pytest.mark.parametrize("radix", [2, 3, 4, 8, 16])
def test_every_rank_has_one_parent_and_is_reached_once(radix):
    for n in list(range(1, 70)) + [127, 128, 129, 1000]:
        for root in sorted({0, min(1, n - 1), n - 1, n // 2}):
            seen = [root]
            for r in range(n):
                parent, children = _tree(n, (r - root) % n, root, radix)
                assert (parent is None) == (r == root), (n, root, r)
                for c in children:
                    assert _tree(n, (c - root) % n, root, radix)[0] == r, (n, root, radix, r, c)
                seen.extend(children)
                # at most radix - 1 children per base-radix digit below the rank's lowest nonzero one
                assert len(children) <= (radix - 1) * max(1, math.ceil(math.log(n, radix))), (n, r, children)
            assert sorted(seen) == list(range(n)), (n, root, radix)
            # depth: a rank sits as deep as its offset from the root has nonzero base-radix
            # digits, so at most ceil(log_radix n) levels below the root
            assert _depth(n, root, radix) == max(_digits(rel, radix) for rel in range(n)), (n, root, radix)
            assert _depth(n, root, radix) <= (0 if n == 1 else math.ceil(math.log(n, radix) - 1e-9))


def test_radix_two_is_the_binomial_tree():
    """Parent: the lowest set bit cleared; children: one zero bit below it set (smallest first)."""
    for n in range(1, 40):
        for rel in range(n):
            parent, children = _tree(n, rel, 0, 2)
            assert parent == (None if rel == 0 else rel & (rel - 1))
            want, mask = [], 1
            while mask < n and not rel & mask:
                if rel | mask < n:
                    want.append(rel | mask)
                mask <<= 1
            assert list(children) == want


def test_a_wider_tree_is_shallower():
    """What the radix buys (docs/benchmarks.md): at 64 ranks, 2 levels at radix 8 against 6 binomial."""
    assert _depth(64, 0, 2) == 6 and _depth(64, 0, 8) == 2 and _depth(32, 0, 8) == 2
    assert _tree(16, 0, 0, 8)[1] == (1, 2, 3, 4, 5, 6, 7, 8)
