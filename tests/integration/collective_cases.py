"""The collective matrix shared by the integration tests: inputs, the calls a
rank makes, and numpy references computed independently of linkescape."""

from __future__ import annotations

import numpy as np

from linkescape import ReduceOp
from linkescape.ops import BFLOAT16

DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BFLOAT16,
          np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint8)]
# 0, 1, a prime, not divisible by any world size tested, and many chunks
SIZES = [0, 1, 7, 1003, 20011]


def make(rank: int, dtype, count: int, salt: int, kind: str = "sum") -> np.ndarray:
    """Small integer values: every reduction of them is exact in every dtype, so
    the reference does not depend on summation order."""
    rng = np.random.default_rng([rank, count, salt, int(dtype.itemsize), dtype.kind.encode()[0]])
    if kind == "prod":
        choices = np.array([1, 2] if dtype.kind == "u" else [-1, 1, 2, 1])
        vals = rng.choice(choices, size=count)
    elif dtype.kind == "u":
        vals = rng.integers(0, 4, size=count)
    else:
        vals = rng.integers(-3, 4, size=count)
    return vals.astype(np.float64).astype(dtype) if dtype == BFLOAT16 else vals.astype(dtype)


def reduce_ref(arrays, op: ReduceOp):
    dtype = arrays[0].dtype
    wide = [a.astype(np.float64) if dtype.kind == "f" or dtype == BFLOAT16 else a.astype(np.int64) for a in arrays]
    if op in (ReduceOp.SUM, ReduceOp.AVG):
        acc = np.sum(wide, axis=0)
    elif op is ReduceOp.PROD:
        acc = np.prod(wide, axis=0)
    elif op is ReduceOp.MIN:
        acc = np.min(wide, axis=0)
    elif op is ReduceOp.MAX:
        acc = np.max(wide, axis=0)
    elif op is ReduceOp.BAND:
        acc = np.bitwise_and.reduce(wide, axis=0)
    elif op is ReduceOp.BOR:
        acc = np.bitwise_or.reduce(wide, axis=0)
    else:
        acc = np.bitwise_xor.reduce(wide, axis=0)
    if op is ReduceOp.AVG:
        n = len(arrays)
        if dtype.kind in "iu":
            return (np.trunc(acc / n)).astype(dtype)  # C division toward zero
        return (acc.astype(np.float64) / n).astype(np.float32).astype(dtype) if dtype in (np.float16, BFLOAT16) \
            else (acc.astype(dtype) / dtype.type(n)).astype(dtype)
    if dtype.kind in "iu":
        return acc.astype(np.int64).astype(dtype)  # wraps like the fixed-width arithmetic
    return acc.astype(dtype)


def ops_for(dtype):
    ops = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX]
    if dtype.kind in "iu":
        ops += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    if dtype.kind == "f" or dtype == BFLOAT16 or dtype == np.int32:
        ops.append(ReduceOp.AVG)
    return ops


def run_matrix(comm, dtypes, sizes):
    """Every operation for every dtype and size; returns {case: array}."""
    n, r = comm.world_size, comm.rank
    out = {}
    for dtype in dtypes:
        for count in sizes:
            for op in ops_for(dtype):
                kind = "prod" if op is ReduceOp.PROD else "sum"
                buf = make(r, dtype, count, 1, kind)
                comm.all_reduce(buf, op)
                out[("all_reduce", dtype.name, count, op.name)] = buf
            root = count % n
            buf = make(r, dtype, count, 2)
            comm.broadcast(buf, root)
            out[("broadcast", dtype.name, count, root)] = buf
            for op in (ReduceOp.SUM, ReduceOp.MAX):
                buf = make(r, dtype, count, 3)
                orig = buf.copy()
                comm.reduce(buf, (root + 1) % n, op)
                out[("reduce", dtype.name, count, op.name)] = buf
                if r != (root + 1) % n:
                    assert np.array_equal(buf.view(np.uint8), orig.view(np.uint8)), "reduce modified a non-root buffer"
            inp = make(r, dtype, count, 4)
            res = np.empty((n, count), dtype)
            comm.all_gather(res, inp)
            out[("all_gather", dtype.name, count)] = res
            inp = make(r, dtype, n * count, 5).reshape(n, count)
            res = np.empty(count, dtype)
            comm.reduce_scatter(res, inp, ReduceOp.SUM)
            out[("reduce_scatter", dtype.name, count)] = res
            inp = make(r, dtype, n * count, 6).reshape(n, count)
            res = np.empty((n, count), dtype)
            comm.all_to_all(res, inp)
            out[("all_to_all", dtype.name, count)] = res
            inp = make(r, dtype, count, 7)
            res = np.empty((n, count), dtype) if r == root else None
            comm.gather(res, inp, root)
            if r == root:
                out[("gather", dtype.name, count)] = res
            inp = make(r, dtype, n * count, 8).reshape(n, count) if r == root else None
            res = np.empty(count, dtype)
            comm.scatter(res, inp, root)
            out[("scatter", dtype.name, count)] = res
            if n > 1:
                # a ring of send/recv, even ranks send first
                buf = make(r, dtype, count, 9)
                got = np.empty(count, dtype)
                right, left = (r + 1) % n, (r - 1) % n
                w = comm.send(buf, right, tag=count, async_op=True)
                comm.recv(got, left, tag=count)
                w.wait()
                out[("sendrecv", dtype.name, count)] = got
    comm.barrier()
    return out


def check_matrix(results, n, dtypes, sizes):
    """Compare every rank's results with the references; returns failures."""
    bad = []

    def same(a, b):
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))

    for r, res in enumerate(results):
        for dtype in dtypes:
            for count in sizes:
                for op in ops_for(dtype):
                    kind = "prod" if op is ReduceOp.PROD else "sum"
                    ref = reduce_ref([make(q, dtype, count, 1, kind) for q in range(n)], op)
                    if not same(res[("all_reduce", dtype.name, count, op.name)], ref):
                        bad.append((r, "all_reduce", dtype.name, count, op.name))
                root = count % n
                ref = make(root, dtype, count, 2)
                if not same(res[("broadcast", dtype.name, count, root)], ref):
                    bad.append((r, "broadcast", dtype.name, count))
                for op in (ReduceOp.SUM, ReduceOp.MAX):
                    if r == (root + 1) % n:
                        ref = reduce_ref([make(q, dtype, count, 3) for q in range(n)], op)
                        if not same(res[("reduce", dtype.name, count, op.name)], ref):
                            bad.append((r, "reduce", dtype.name, count, op.name))
                ref = np.stack([make(q, dtype, count, 4) for q in range(n)]) if n else None
                if not same(res[("all_gather", dtype.name, count)], ref.reshape(n, count)):
                    bad.append((r, "all_gather", dtype.name, count))
                ref = reduce_ref([make(q, dtype, n * count, 5).reshape(n, count)[r] for q in range(n)], ReduceOp.SUM)
                if not same(res[("reduce_scatter", dtype.name, count)], ref):
                    bad.append((r, "reduce_scatter", dtype.name, count))
                ref = np.stack([make(q, dtype, n * count, 6).reshape(n, count)[r] for q in range(n)])
                if not same(res[("all_to_all", dtype.name, count)], ref.reshape(n, count)):
                    bad.append((r, "all_to_all", dtype.name, count))
                if r == root:
                    ref = np.stack([make(q, dtype, count, 7) for q in range(n)])
                    if not same(res[("gather", dtype.name, count)], ref.reshape(n, count)):
                        bad.append((r, "gather", dtype.name, count))
                ref = make(root, dtype, n * count, 8).reshape(n, count)[r]
                if not same(res[("scatter", dtype.name, count)], ref):
                    bad.append((r, "scatter", dtype.name, count))
                if n > 1:
                    ref = make((r - 1) % n, dtype, count, 9)
                    if not same(res[("sendrecv", dtype.name, count)], ref):
                        bad.append((r, "sendrecv", dtype.name, count))
    return bad
