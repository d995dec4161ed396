"""Recursive halving and doubling: exact, bit-identical on every rank and
from run to run, for any number of ranks (those beyond a power of two fold
in), whatever order the partners' parts arrive in."""

from __future__ import annotations

import numpy as np
import pytest

from linkescape import Config, ReduceOp
from linkescape.algorithms.halving import _regions
from linkescape.testing import raise_first, run_ranks

CFG = Config(halving_ranks=2, small_bytes=64, chunk_bytes=4096, copy_bytes=1024, timeout=60)


def _sum(comm, size, runs):
    out = []
    for i in range(runs):
        x = np.random.default_rng(comm.rank * 100 + i % 2).standard_normal(size)
        comm.all_reduce(x)
        out.append(x)
    y = np.arange(size, dtype=np.int64) * (comm.rank + 1)
    comm.all_reduce(y, ReduceOp.MAX)
    return out, y


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8])
def test_halving_doubling_is_exact_and_bit_identical(n):
    size = 3001
    results = raise_first(run_ranks(n, _sum, size, 4, config=CFG, timeout=120))
    first = results[0][0]
    for outs, y in results:
        for a, b in zip(outs, first):
            assert np.array_equal(a, b)  # the same bits on every rank
        assert np.array_equal(y, np.arange(size) * n)
    assert np.array_equal(first[0], first[2]) and np.array_equal(first[1], first[3])  # and from run to run
    want = sum(np.random.default_rng(r * 100).standard_normal(size) for r in range(n))
    assert np.allclose(first[0], want)


def test_regions_halve_down_to_one_owner_per_element():
    count, p2 = 1000, 8
    owned = []
    for r in range(p2):
        steps = _regions(count, r, p2)
        assert len(steps) == 3
        _partner, lo, hi, _glo, _ghi = steps[-1]
        owned.append((lo, hi))
    covered = sorted(owned)
    assert covered[0][0] == 0 and covered[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
