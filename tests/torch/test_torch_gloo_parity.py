"""Every argument form of the C++ ``ProcessGroup`` API, called the same way
on a linkescape group and on a Gloo group in the same processes: both must
succeed with the same results (bit-identical at 2 ranks, allclose at 3).

Covers single tensor vs list, keyword ``root``/``op``/``timeout``, options
objects or none, several tensors per rank (all_reduce across tensors and
ranks, all_gather with several inputs), all_gather_coalesced, uneven
reduce_scatter, sparse COO all_reduce, split sizes as numpy arrays and
tuples, and collectives under ``torch.inference_mode()``.

Run as a script, this file is the rank program; pytest launches it.
"""

from __future__ import annotations

import datetime
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

T = datetime.timedelta(seconds=30)


def _vals(shape, r, salt=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * r + salt)
    return torch.randn(shape, generator=g).to(dtype)


# Each case: fn(pg, r, n) -> a list of tensors (the results to compare).
def c_broadcast_tensor_root_kw(pg, r, n):
    t = _vals(5, r, 1)
    pg.broadcast(t, root=n - 1).wait()
    return [t]


def c_broadcast_tensor_root_positional(pg, r, n):
    t = _vals(5, r, 2)
    pg.broadcast(t, 0, timeout=T).wait()
    return [t]


def c_broadcast_list_opts(pg, r, n):
    opts = dist.BroadcastOptions()
    opts.rootRank = 1
    a, b = _vals((2, 2), r, 3), _vals((2, 2), r, 4)
    pg.broadcast([a, b], opts).wait()
    return [a, b]


def c_broadcast_list_no_opts(pg, r, n):
    t = _vals(4, r, 5)
    pg.broadcast([t]).wait()
    return [t]


def c_allreduce_tensor(pg, r, n):
    t = _vals(6, r, 6)
    pg.allreduce(t).wait()
    return [t]


def c_allreduce_tensor_op_kw(pg, r, n):
    t = _vals(6, r, 7)
    pg.allreduce(t, op=dist.ReduceOp.MAX, timeout=T).wait()
    return [t]


def c_allreduce_list_op_positional(pg, r, n):
    t = _vals(6, r, 8)
    pg.allreduce([t], dist.ReduceOp.MIN).wait()
    return [t]


def c_allreduce_multi_tensor(pg, r, n):
    # Gloo reduces across the tensors and the ranks: every tensor gets the total
    ts = [_vals((2, 3), r, 10 + i) for i in range(3)]
    pg.allreduce(ts).wait()
    return ts


def c_allreduce_multi_tensor_max_opts(pg, r, n):
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    ts = [_vals(4, r, 20 + i) for i in range(2)]
    pg.allreduce(ts, opts).wait()
    return ts


def c_allreduce_multi_int(pg, r, n):
    ts = [torch.arange(5, dtype=torch.int64) * (r + 1) + i for i in range(4)]
    pg.allreduce(ts, op=dist.ReduceOp.SUM).wait()
    return ts


def c_allreduce_coalesced(pg, r, n):
    ts = [_vals(3, r, 30), _vals((2, 2), r, 31)]
    pg.allreduce_coalesced(ts).wait()
    return ts


def c_reduce_tensor_root_op(pg, r, n):
    t = _vals(4, r, 40)
    pg.reduce(t, root=1, op=dist.ReduceOp.SUM).wait()
    return [t] if r == 1 else []  # non-root buffers: undefined (Gloo uses them as scratch)


def c_reduce_positional(pg, r, n):
    t = _vals(4, r, 41)
    pg.reduce(t, 0, dist.ReduceOp.MAX).wait()
    return [t] if r == 0 else []


def c_reduce_list_opts(pg, r, n):
    opts = dist.ReduceOptions()
    opts.rootRank = n - 1
    opts.reduceOp = dist.ReduceOp.MIN
    t = _vals(4, r, 42)
    pg.reduce([t], opts).wait()
    return [t] if r == n - 1 else []


def c_allgather_tensor(pg, r, n):
    outs = [torch.empty(3) for _ in range(n)]
    pg.allgather(outs, _vals(3, r, 50)).wait()
    return outs


def c_allgather_list_opts(pg, r, n):
    outs = [[torch.empty(3) for _ in range(n)]]
    pg.allgather(outs, [_vals(3, r, 51)], _c10d.AllgatherOptions()).wait()
    return outs[0]


def c_allgather_multi_input(pg, r, n):
    # two inputs per rank: each output list has 2 * n tensors, rank-major
    ins = [_vals((2, 2), r, 52), _vals((2, 2), r, 53)]
    outs = [[torch.empty(2, 2) for _ in range(2 * n)] for _ in range(2)]
    pg.allgather(outs, ins).wait()
    return outs[0] + outs[1]


def c_allgather_coalesced(pg, r, n):
    ins = [_vals(1, r, 54), _vals((2, 2), r, 55), torch.ones(0), _vals((3, 1, 2), r, 56)]
    outs = [[torch.empty_like(t) for t in ins] for _ in range(n)]
    pg.allgather_coalesced(outs, ins).wait()
    return [t for lst in outs for t in lst]


def c_allgather_into_tensor(pg, r, n):
    out = torch.empty(n * 4)
    pg._allgather_base(out, _vals(4, r, 57)).wait()
    return [out]


def c_gather_tensor_root(pg, r, n):
    outs = [torch.empty(3) for _ in range(n)] if r == 1 else []
    pg.gather(outs, _vals(3, r, 60), 1).wait()
    return outs


def c_gather_list_opts(pg, r, n):
    opts = dist.GatherOptions()
    opts.rootRank = 0
    outs = [[torch.empty(3) for _ in range(n)]] if r == 0 else []
    pg.gather(outs, [_vals(3, r, 61)], opts).wait()
    return outs[0] if outs else []


def c_scatter_tensor_root(pg, r, n):
    out = torch.empty(3)
    ins = [_vals(3, j, 62) for j in range(n)] if r == n - 1 else []
    pg.scatter(out, ins, n - 1).wait()
    return [out]


def c_scatter_list_opts(pg, r, n):
    opts = dist.ScatterOptions()
    opts.rootRank = 0
    out = torch.empty(3)
    ins = [[_vals(3, j, 63) for j in range(n)]] if r == 0 else []
    pg.scatter([out], ins, opts).wait()
    return [out]


def c_reduce_scatter_even(pg, r, n):
    out = torch.empty(3)
    dist.reduce_scatter(out, [_vals(3, r, 70 + j) for j in range(n)], group=pg)
    return [out]


def c_reduce_scatter_tensor_op(pg, r, n):
    out = torch.empty(3)
    pg.reduce_scatter(out, [_vals(3, r, 75 + j) for j in range(n)], op=dist.ReduceOp.MAX).wait()
    return [out]


def c_reduce_scatter_uneven(pg, r, n):
    # block j (for rank j) has j + 1 rows: sizes differ from rank to rank
    ins = [_vals((j + 1, 2), r, 80 + j) for j in range(n)]
    out = torch.empty(r + 1, 2)
    dist.reduce_scatter(out, ins, group=pg)
    return [out]


def c_reduce_scatter_tensor(pg, r, n):
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, _vals(2 * n, r, 85), group=pg)
    return [out]


def c_alltoall_single_numpy_splits(pg, r, n):
    inp = _vals((n * (n + 1) // 2 + r * n, 2), r, 90)
    in_splits = np.array([j + 1 + r for j in range(n)], dtype=np.int64)
    out_splits = np.array([r + 1 + j for j in range(n)], dtype=np.int64)
    out = torch.empty(int(out_splits.sum()), 2)
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=pg)
    return [out]


def c_alltoall_single_tuple_splits(pg, r, n):
    inp = _vals(n, r, 91)
    out = torch.empty(n)
    pg.alltoall_base(out, inp, (1,) * n, (1,) * n).wait()
    return [out]


def c_alltoall_list(pg, r, n):
    outs = [torch.empty(2) for _ in range(n)]
    pg.alltoall(outs, [_vals(2, r, 92 + j) for j in range(n)]).wait()
    return outs


def c_barrier_forms(pg, r, n):
    pg.barrier().wait()
    pg.barrier(dist.BarrierOptions()).wait()
    pg.barrier(timeout=T).wait()
    return []


def _sparse(r, salt, shape=(6,), nnz=4, dense=()):
    g = torch.Generator().manual_seed(100 * r + salt)
    idx = torch.randint(0, shape[0], (1, nnz), generator=g)  # duplicates on purpose: not coalesced
    if len(shape) > 1 + len(dense):
        idx = torch.cat([idx, torch.randint(0, shape[1], (1, nnz), generator=g)])
    vals = torch.randn((nnz, *dense), generator=g)
    return torch.sparse_coo_tensor(idx, vals, shape)


def c_sparse_allreduce(pg, r, n):
    t = _sparse(r, 1)
    w = pg.allreduce([t])
    w.wait()
    res = w.result()
    return [t.to_dense(), res[0].to_dense()] + list(t.coalesce().indices()) + [t.coalesce().values()]


def c_sparse_allreduce_2d_dense_dim(pg, r, n):
    t = _sparse(r, 2, shape=(5, 3), nnz=3 + r, dense=(3,))
    dist.all_reduce(t, group=pg)
    return [t.to_dense(), t.coalesce().indices(), t.coalesce().values()]


def c_sparse_allreduce_multi(pg, r, n):
    ts = [_sparse(r, 3 + i, shape=(4, 4), nnz=2 + i) for i in range(2)]
    pg.allreduce(ts).wait()
    return [t.to_dense() for t in ts]


def c_sparse_allreduce_empty_rank(pg, r, n):
    t = _sparse(r, 4, nnz=0 if r == 0 else 3)
    pg.allreduce(t).wait()
    return [t.to_dense()]


def c_inference_mode(pg, r, n):
    with torch.inference_mode():
        inp = _vals(4, r, 200)
        outs = [torch.empty(4) for _ in range(n)]
        dist.all_gather(outs, inp, group=pg)
        t = _vals(4, r, 201)
        dist.all_reduce(t, group=pg, async_op=True).wait()
        b = _vals((3, 2), r, 202).t()  # staged (not contiguous)
        dist.broadcast(b, group_src=0, group=pg)
        flat = torch.empty(4 * n)
        dist.all_gather_into_tensor(flat, inp, group=pg)
    assert all(o.is_inference() for o in outs)
    return outs + [t, b, flat]


def c_no_grad_requires_grad_leaf(pg, r, n):
    p = _vals(3, r, 210).requires_grad_()
    with torch.no_grad():
        dist.all_reduce(p, group=pg)
    return [p.detach()]


CASES = {name[2:]: fn for name, fn in globals().items() if name.startswith("c_")}


def main():
    dist.init_process_group("linkescape", timeout=T)
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo", timeout=T)
    le = dist.group.WORLD
    assert dist.get_backend(le) == "linkescape" and dist.get_backend(gloo) == "gloo"
    failed = []
    for name, fn in CASES.items():
        try:
            want = fn(gloo, r, n)
        except Exception as exc:  # noqa: BLE001 - a case Gloo refuses is not a parity case
            print(f"rank {r}: gloo refuses {name}: {type(exc).__name__}: {exc}", flush=True)
            failed.append(f"gloo:{name}")
            continue
        try:
            got = fn(le, r, n)
        except Exception as exc:  # noqa: BLE001
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if len(got) != len(want):
            failed.append(f"{name}: {len(got)} results, gloo {len(want)}")
            continue
        for i, (a, b) in enumerate(zip(got, want)):
            same = (a.shape == b.shape and a.dtype == b.dtype and
                    (torch.equal(a, b) if n == 2 or not a.is_floating_point()
                     else torch.allclose(a, b, rtol=1e-5, atol=1e-6)))
            if not same:
                failed.append(f"{name}[{i}]: got {a.tolist()} gloo {b.tolist()}")
                break
    dist.barrier()
    dist.destroy_process_group()
    if failed:
        raise SystemExit(f"rank {r}: {len(failed)} of {len(CASES)} cases differ from gloo:\n" + "\n".join(failed))
    print(f"rank {r}: ok {len(CASES)} cases", flush=True)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_every_call_form_matches_gloo(nprocs):
    from linkescape.torch.testing import launch_ok

    launch_ok([os.path.abspath(__file__)], nprocs, timeout=180, ok=f"ok {len(CASES)} cases")


if __name__ == "__main__":
    main()
