"""The chaos workload: every rank derives the same steps, and every result is checked exactly."""

from __future__ import annotations

import numpy as np
import pytest

from linkescape.chaos import workload
from linkescape.chaos.workload import Op, check, expected, plan_step, value
from linkescape.testing import raise_first, run_ranks


def test_steps_depend_on_seed_and_index_only():
    a = [plan_step(3, k, 4) for k in range(300)]
    assert a == [plan_step(3, k, 4) for k in range(300)]
    assert a != [plan_step(4, k, 4) for k in range(300)]


def test_the_mix_covers_every_operation_size_and_dtype():
    steps = [plan_step(1, k, 4) for k in range(3000)]
    kinds = {s.kind for s in steps}
    ops = {n for s in steps for op in s.ops for n in workload.counts_as(op)}
    assert kinds == {"op", "burst", "ring", "barrier"}
    assert ops == set(workload.OPERATIONS)
    assert {op.dtype for s in steps for op in s.ops} == set(workload.DTYPES)
    sizes = [op.nbytes(4) for s in steps for op in s.ops if op.kind != "barrier"]
    assert min(sizes) <= 16 and max(sizes) > 2 << 20 and max(sizes) <= workload.MAX_BYTES
    assert {op.op for s in steps for op in s.ops if op.kind in workload.REDUCED} == {"SUM", "MAX", "MIN", "BXOR"}


@pytest.mark.parametrize("dtype", workload.DTYPES)
def test_references_are_exact_in_every_dtype(dtype):
    world = 4
    op = Op("all_reduce", dtype, 4096)
    ref = expected(9, 5, op, 0, world)
    ints = sum(value(9, 5, op, q, (4096,)).astype(np.float64) for q in range(world))
    assert np.array_equal(ref.astype(np.float64), ints)  # the sum is exactly representable
    mx = expected(9, 5, Op("all_reduce", dtype, 4096, op="MAX"), 0, world).astype(np.float64)
    assert np.array_equal(mx, np.max([value(9, 5, op, q, (4096,)).astype(np.float64) for q in range(world)], axis=0))


def test_a_step_waits_for_every_rank_or_its_root_or_its_sender():
    Step = workload.Step
    assert workload.waits_for(Step(1, "op", (Op("all_reduce", "int32", 4),)), 2, 4) == [0, 1, 3]
    assert workload.waits_for(Step(1, "barrier", (Op("barrier", "uint8", 1),)), 0, 3) == [1, 2]
    scatter = Step(1, "op", (Op("scatter", "float64", 1, root=3),))
    assert workload.waits_for(scatter, 0, 4) == [3]  # a receiver needs the root's data
    assert workload.waits_for(scatter, 3, 4) == [0, 1, 2]  # the root, every receiver's ack
    assert workload.waits_for(Step(1, "ring", (Op("ring", "int8", 9, peer_shift=3),)), 1, 4) == [2]
    burst = Step(1, "burst", (Op("gather", "int8", 2, root=1), Op("broadcast", "int8", 2, root=2)))
    assert workload.waits_for(burst, 0, 4) == [1, 2]
    assert workload.waits_for(burst, 1, 4) == [0, 2, 3]


def test_check_finds_one_wrong_element_and_a_wrong_shape():
    op = Op("all_gather", "float32", 100)
    good = expected(2, 1, op, 1, 3).copy()
    assert check(2, 1, op, 1, 3, good) == {"wrong": 0}
    good[2, 7] += 1
    res = check(2, 1, op, 1, 3, good)
    assert res["wrong"] == 1 and res["first"] == 2 * 100 + 7
    assert check(2, 1, op, 1, 3, good[:2])["wrong"] == 300
    neg0 = expected(2, 1, Op("broadcast", "float32", 8), 0, 3).copy()
    neg0[neg0 == 0] = -0.0  # equal as numbers, different bytes: counted wrong
    if np.any(neg0 == 0):
        assert check(2, 1, Op("broadcast", "float32", 8), 0, 3, neg0)["wrong"] > 0


def _run(comm, seed, steps):
    wrong = 0
    counts = {}
    for k in range(steps):
        step = plan_step(seed, k, comm.world_size, max_bytes=256 << 10)
        pending = []
        for op in step.ops:
            works, buf = workload.post(comm, seed, k, op, async_op=step.kind in ("burst", "ring"))
            pending.append((op, works, buf))
        for op, works, buf in pending:
            for w in works:
                w.wait(timeout=60)
            wrong += check(seed, k, op, comm.rank, comm.world_size, buf)["wrong"]
            for name in workload.counts_as(op):
                counts[name] = counts.get(name, 0) + 1
    return wrong, counts


def test_the_workload_runs_clean_on_three_ranks():
    results = raise_first(run_ranks(3, _run, 11, 80, timeout=240))
    for wrong, counts in results:
        assert wrong == 0
        assert sum(counts.values()) > 80
    assert results[0][1] == results[1][1] == results[2][1]  # the same steps everywhere
