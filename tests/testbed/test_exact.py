"""The workloads' values and exact results (linkescape.testbed.exact): one generator and one reference
for the fault tests' worker, the failover benchmark's worker and the chaos soak."""

from __future__ import annotations

import numpy as np
import pytest

from linkescape.testbed import exact, worker
from linkescape.testing import raise_first, run_ranks

KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
         "ring")


def test_values_are_small_integers_drawn_from_their_key_alone():
    a = exact.ints([1, 2, 3], (4, 50))
    assert a.dtype == np.int64 and a.shape == (4, 50) and a.min() >= -8 and a.max() <= 8
    assert np.array_equal(a, exact.ints([1, 2, 3], (4, 50)))
    assert np.array_equal(a.reshape(-1), exact.ints([1, 2, 3], 200))  # the shape does not change the draw
    assert not np.array_equal(a, exact.ints([1, 2, 4], (4, 50)))
    assert exact.ints([5], 1000, unsigned=True).min() >= 0
    bf = exact.cast(a, "bfloat16")
    assert np.array_equal(bf.astype(np.float64), a.astype(np.float64))


def _naive(kind, rank, world, inputs, root, shift):
    """The result by definition, rank by rank, in float64 (exact for these values)."""
    x = [inputs(q).astype(np.float64) for q in range(world)]
    if kind == "all_reduce":
        return sum(x)
    if kind == "reduce":
        return sum(x) if rank == root else x[rank]
    if kind == "broadcast":
        return x[root]
    if kind in ("all_gather", "gather"):
        return np.stack(x) if kind == "all_gather" or rank == root else None
    if kind == "reduce_scatter":
        return sum(x)[rank]
    if kind == "all_to_all":
        return np.stack([x[q][rank] for q in range(world)])
    if kind == "scatter":
        return x[root][rank]
    return x[(rank - shift) % world]


@pytest.mark.parametrize("kind", KINDS)
def test_expected_is_the_definition_of_each_collective(kind):
    world, count = 5, 7
    shape = exact.in_shape(kind, count, world)
    inputs = lambda q: exact.ints([9, q], shape)  # noqa: E731
    for rank in range(world):
        got = exact.expected(kind, rank, world, inputs, "float32", root=2, shift=2)
        want = _naive(kind, rank, world, inputs, 2, 2)
        assert (got is None) == (want is None)
        if got is not None:
            assert got.dtype == np.float32 and np.array_equal(got.astype(np.float64), want)
    assert exact.expected("barrier", 0, world, inputs, "float32") is None


def test_compare_counts_wrong_elements_by_their_bits_and_names_the_first():
    ref = np.arange(10, dtype=np.float32)
    assert exact.compare(ref.copy(), ref) == {"wrong": 0} and exact.compare(None, None) == {"wrong": 0}
    got = ref.copy()
    got[3], got[7] = -1.0, np.nan
    assert exact.compare(got, ref) == {"wrong": 2, "first": 3, "got": "-1.0", "want": "3.0"}
    assert exact.count_wrong(got, ref) == 2
    neg0 = np.zeros(4, np.float32)
    neg0[1] = -0.0
    assert exact.count_wrong(neg0, np.zeros(4, np.float32)) == 1  # equal values, other bits
    assert exact.compare(got[:5], ref)["wrong"] == 10  # a wrong shape: every element


def _testbed_worker_ops(comm):
    out = {}
    for op in worker.OPS:
        for it in range(3):
            got, ref = worker.run_op(comm, op, it, 33, np.dtype("float32"))
            out[(op, it)] = exact.count_wrong(got, ref)
    comm.barrier()  # as the worker does: no rank closes while a peer still receives from it
    return out


def test_the_testbed_workers_operations_are_exact_on_three_ranks():
    results = raise_first(run_ranks(3, _testbed_worker_ops, timeout=180))
    for wrong in results:
        assert set(op for op, _ in wrong) == set(worker.OPS)
        assert not any(wrong.values()), wrong
