"""Every operation x world size x dtype x size, in separate processes, against
numpy references; one and two rails (127.0.0.1 and 127.0.0.2)."""

from __future__ import annotations

import sys
import os

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from collective_cases import DTYPES, SIZES, check_matrix, run_matrix  # noqa: E402

from linkescape import Config  # noqa: E402
from linkescape.algorithms.base import gloo_blocks  # noqa: E402
from linkescape.ops import BFLOAT16  # noqa: E402
from linkescape.testing import raise_first, run_ranks  # noqa: E402

# Small segments so that small inputs reach the multi-chunk and ring paths.
SMALL_CHUNKS = Config(chunk_bytes=4096, small_bytes=2048, copy_bytes=1024, timeout=60)

RAILS = {1: ("127.0.0.1",), 2: ("127.0.0.1", "127.0.0.2")}


@pytest.mark.parametrize("rails", [1, 2])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_matrix(world_size, rails):
    sizes = SIZES if world_size <= 4 else [0, 1, 7, 1003, 5003]
    results = raise_first(run_ranks(world_size, run_matrix, DTYPES, sizes, rails=RAILS[rails],
                                    config=SMALL_CHUNKS, timeout=240))
    bad = check_matrix(results, world_size, DTYPES, sizes)
    assert not bad, f"{len(bad)} wrong results, first: {bad[:10]}"


def _random_all_reduce(comm, seed):
    out = []
    for dtype, count in ((np.float32, 300_001), (np.float32, 1000), (np.float16, 5001), (np.float64, 77)):
        rng = np.random.default_rng([seed, comm.rank, count])
        buf = rng.standard_normal(count).astype(dtype)
        comm.all_reduce(buf)
        out.append(buf)
    return out


@pytest.mark.parametrize("world_size,tree_ranks,radix", [(3, 16, 8), (4, 16, 8), (8, 16, 8), (8, 8, 8), (8, 8, 2),
                                                         (7, 2, 3)])  # tree_ranks <= world_size: the tree
def test_bit_identical_across_ranks_and_runs(world_size, tree_ranks, radix):
    """Random floats, where order matters: every rank and every run agree bit for bit."""
    cfg = Config(chunk_bytes=8192, small_bytes=4096, timeout=60, tree_ranks=tree_ranks, tree_radix=radix)
    first = raise_first(run_ranks(world_size, _random_all_reduce, 7, config=cfg))
    second = raise_first(run_ranks(world_size, _random_all_reduce, 7, config=cfg,
                                   rails=("127.0.0.1", "127.0.0.2")))
    for results in (first, second):
        for rank_res in results[1:]:
            for a, b in zip(results[0], rank_res):
                assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    for a, b in zip(first[0], second[0]):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _barrier_after_sleeps(comm, rounds):
    """Each round the ranks arrive at the barrier in a different order, up to 60 ms apart: no
    rank may leave it before the last one arrived."""
    import time

    out = []
    for k in range(rounds):
        time.sleep(0.06 * ((comm.rank + k) % comm.world_size) / comm.world_size)
        arrived = time.time()
        comm.barrier()
        out.append((arrived, time.time()))
    return out


@pytest.mark.parametrize("world_size,tree_ranks,radix", [(6, 16, 8), (6, 4, 8), (9, 4, 3), (5, 2, 2)])
def test_no_rank_leaves_the_barrier_before_the_last_arrived(world_size, tree_ranks, radix):
    """The barrier is recursive doubling below tree_ranks and the small all_reduce's k-nomial
    tree from it on (the same partners as the calls around it)."""
    cfg = Config(timeout=60, tree_ranks=tree_ranks, tree_radix=radix)
    results = raise_first(run_ranks(world_size, _barrier_after_sleeps, 6, config=cfg))
    for k in range(6):
        last_in = max(res[k][0] for res in results)
        first_out = min(res[k][1] for res in results)
        assert first_out >= last_in, (k, first_out - last_in)


def _half_sums(comm):
    out = []
    for dtype in (np.float16, BFLOAT16):
        for count in (1, 3, 10, 37, 5001, 70_001):
            rng = np.random.default_rng([count, comm.rank])
            buf = ((rng.random(count) * 2 - 1) * 65504 / comm.world_size).astype(np.float32).astype(dtype)
            mine = buf.copy()
            comm.all_reduce(buf)
            out.append((mine, buf))
    return out


def _gloo_ring(values):
    """Gloo's ring, step by step: rank r sends to r-1; at step s it sends
    chunk r+1+s (its own value at s = 0) and adds what r+1 sent into chunk
    r+2+s, rounding to the half type at every addition."""
    n = len(values)
    bufs = [v.astype(v.dtype) for v in values]
    bl = gloo_blocks(values[0].shape[0], values[0].dtype.itemsize, n)
    for st in range(n - 1):
        sent = [bufs[r][slice(*bl[(r + 1 + st) % n])].copy() for r in range(n)]
        for r in range(n):
            lo, hi = bl[(r + 2 + st) % n]
            acc = bufs[r][lo:hi].astype(np.float32) + sent[(r + 1) % n].astype(np.float32)
            bufs[r][lo:hi] = acc.astype(values[0].dtype)
    return np.concatenate([bufs[k][slice(*bl[k])] for k in range(n)])


def test_gloo_blocks():
    assert gloo_blocks(40, 2, 4) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert gloo_blocks(10, 2, 3) == [(0, 4), (4, 8), (8, 10)]
    assert gloo_blocks(1, 2, 4) == [(0, 1), (1, 1), (1, 1), (1, 1)]
    assert gloo_blocks(0, 4, 2) == [(0, 0), (0, 0)]


@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
def test_half_all_reduce_rounds_in_gloos_order(world_size):
    """float16 / bfloat16 SUM: what Gloo's ring gives, bit for bit, for sizes
    below one element per rank, on the direct and ring paths (torch's own
    comparison with Gloo: tests/torch/test_torch_gloo_exact.py)."""
    cfg = Config(chunk_bytes=8192, small_bytes=4096, timeout=60)
    results = raise_first(run_ranks(world_size, _half_sums, config=cfg))
    for i in range(len(results[0])):
        want = _gloo_ring([res[i][0] for res in results])
        for res in results:
            assert np.array_equal(res[i][1].view(np.uint8), want.view(np.uint8)), (i, res[i][1], want)


def _default_config_large(comm):
    """The default segment size and the ring on a multi-megabyte buffer."""
    buf = np.full(3 * (1 << 20) + 5, comm.rank + 1, np.float32)
    comm.all_reduce(buf)
    g = np.empty((comm.world_size, 1 << 20), np.float32)
    comm.all_gather(g, np.full(1 << 20, comm.rank, np.float32))
    b = np.full(5 << 20, comm.rank, np.uint8)
    comm.broadcast(b, 1)
    return float(buf.min()), float(buf.max()), g[:, ::4096].copy(), int(b.min()), int(b.max())


def test_default_config_large_messages():
    n = 3
    for lo, hi, g, bmin, bmax in raise_first(run_ranks(n, _default_config_large, timeout=120)):
        assert lo == hi == n * (n + 1) / 2
        assert np.array_equal(g, np.repeat(np.arange(n, dtype=np.float32)[:, None], g.shape[1], axis=1))
        assert bmin == bmax == 1


def _async_many(comm):
    bufs = [np.full(5000 + i, comm.rank + i, np.int64) for i in range(12)]
    works = [comm.all_reduce(b, async_op=True) for b in bufs]
    for w in works:
        w.wait(timeout=30)
        assert w.is_completed() and w.exception() is None
    return [int(b[0]) for b in bufs]


def test_async_ops_in_flight():
    n = 3
    cfg = Config(chunk_bytes=4096, small_bytes=2048, timeout=60)
    for res in raise_first(run_ranks(n, _async_many, config=cfg)):
        assert res == [sum(r + i for r in range(n)) for i in range(12)]


def _half_direct_past_a_chunk(comm):
    """A float16 all_reduce on the direct path (2 ranks, ``direct_bytes`` large) of more values than
    a frame holds: the direct path reduces the whole buffer at once."""
    from linkescape import ReduceOp

    buf = np.full(40_000, comm.rank + 1, np.float16)
    comm.all_reduce(buf, ReduceOp.MAX)  # (SUM combines in Gloo's order, block by block)
    return float(buf.min()), float(buf.max())


def test_the_direct_path_reduces_half_buffers_larger_than_a_frame():
    cfg = Config(chunk_bytes=16384, small_bytes=4096, direct_bytes=1 << 20, timeout=60)
    assert raise_first(run_ranks(2, _half_direct_past_a_chunk, config=cfg)) == [(2.0, 2.0)] * 2
