"""Every torch.distributed collective over the linkescape backend, on 2 and 3
real processes on loopback, checked against expected values.

Run as a script, this file is the rank program (``python test_torch_collectives.py
all``); pytest launches it with :func:`linkescape.torch.testing.launch`.
"""

from __future__ import annotations

import datetime
import os
import sys

import pytest
import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64]


# ====================================================================== rank side
def _eq(got, want, what):
    want = want.to(got.dtype) if isinstance(want, torch.Tensor) else torch.tensor(want, dtype=got.dtype)
    if got.shape != want.shape or not torch.equal(got, want):
        if got.shape != want.shape:
            raise AssertionError(f"rank {dist.get_rank()}: {what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
        bad = (got != want).nonzero()
        i = tuple(bad[0].tolist())
        raise AssertionError(f"rank {dist.get_rank()}: {what}: {len(bad)} of {got.numel()} elements differ, "
                             f"first at {i}: got {got[i].item()} want {want[i].item()}")


def _vals(k, r, dtype, mod=7, add=0):
    return ((torch.arange(k) % mod) + r + add).to(dtype)


def check_all_reduce(r, n, dtype, k=11):
    ranks = range(n)
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.AVG]
    if dtype == torch.int64:
        ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    for op in ops:
        if op == dist.ReduceOp.PRODUCT:
            per = [((torch.arange(k) % 3) + 1 + (q % 2)).to(torch.float64) for q in ranks]
        elif op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
            per = [((torch.arange(k) * 7 + q * 13) % 64).to(torch.int64) for q in ranks]
        else:
            per = [_vals(k, q, torch.float64) for q in ranks]
        t = per[r].to(dtype).clone()
        dist.all_reduce(t, op=op)
        stack = torch.stack(per)
        if op == dist.ReduceOp.SUM:
            want = stack.sum(0)
        elif op == dist.ReduceOp.PRODUCT:
            want = stack.prod(0)
        elif op == dist.ReduceOp.MIN:
            want = stack.min(0).values
        elif op == dist.ReduceOp.MAX:
            want = stack.max(0).values
        elif op == dist.ReduceOp.AVG:
            want = stack.sum(0) // n if dtype == torch.int64 else stack.sum(0) / n
        else:
            want = per[0].clone()
            for p in per[1:]:
                want = {dist.ReduceOp.BAND: want & p, dist.ReduceOp.BOR: want | p,
                        dist.ReduceOp.BXOR: want ^ p}[op]
        _eq(t, want, f"all_reduce {op} {dtype}")


def check_rooted(r, n, dtype, k=5):
    # broadcast from the last rank
    t = torch.full((k,), r, dtype=dtype)
    dist.broadcast(t, src=n - 1)
    _eq(t, torch.full((k,), n - 1), f"broadcast {dtype}")
    # reduce to rank 1 (SUM); other ranks keep their input
    t = _vals(k, r, dtype)
    dist.reduce(t, dst=1, op=dist.ReduceOp.SUM)
    want = sum(_vals(k, q, torch.float64) for q in range(n)) if r == 1 else _vals(k, r, torch.float64)
    _eq(t, want, f"reduce {dtype}")
    # gather to rank 0
    src = _vals(k, r, dtype)
    outs = [torch.empty(k, dtype=dtype) for _ in range(n)] if r == 0 else None
    dist.gather(src, outs, dst=0)
    if r == 0:
        for q in range(n):
            _eq(outs[q], _vals(k, q, torch.float64), f"gather[{q}] {dtype}")
    # scatter from the last rank
    out = torch.empty(k, dtype=dtype)
    ins = [_vals(k, q, dtype, add=10) for q in range(n)] if r == n - 1 else None
    dist.scatter(out, ins, src=n - 1)
    _eq(out, _vals(k, r, torch.float64, add=10), f"scatter {dtype}")


def check_gather_scatter(r, n, dtype, k=6):
    inp = _vals(k, r, dtype)
    outs = [torch.empty(k, dtype=dtype) for _ in range(n)]
    dist.all_gather(outs, inp)
    for q in range(n):
        _eq(outs[q], _vals(k, q, torch.float64), f"all_gather[{q}] {dtype}")
    flat = torch.empty(n * k, dtype=dtype)
    dist.all_gather_into_tensor(flat, inp)
    _eq(flat, torch.cat([_vals(k, q, torch.float64) for q in range(n)]), f"all_gather_into_tensor {dtype}")
    two_d = torch.empty(n, k, dtype=dtype)
    dist.all_gather_into_tensor(two_d, inp)
    _eq(two_d, torch.stack([_vals(k, q, torch.float64) for q in range(n)]), f"all_gather_into_tensor 2d {dtype}")
    # reduce_scatter: rank q contributes block j = vals(k, q, add=j)
    ins = [_vals(k, r, dtype, add=j) for j in range(n)]
    out = torch.empty(k, dtype=dtype)
    dist.reduce_scatter(out, ins)
    _eq(out, sum(_vals(k, q, torch.float64, add=r) for q in range(n)), f"reduce_scatter {dtype}")
    big = torch.cat(ins)
    out = torch.empty(k, dtype=dtype)
    dist.reduce_scatter_tensor(out, big)
    _eq(out, sum(_vals(k, q, torch.float64, add=r) for q in range(n)), f"reduce_scatter_tensor {dtype}")
    if dtype.is_floating_point:
        out = torch.empty(k, dtype=dtype)
        dist.reduce_scatter_tensor(out, big, op=dist.ReduceOp.MAX)
        _eq(out, _vals(k, n - 1, torch.float64, add=r), f"reduce_scatter_tensor MAX {dtype}")


def _a2a_block(src, dst, rows, dtype, width=3):
    return (torch.arange(rows * width).reshape(rows, width) % 50 + 100 * src + 10 * dst).to(dtype)


def check_all_to_all(r, n, dtype):
    # list form, uneven sizes: rank r sends (r + dst + 1) rows to dst
    ins = [_a2a_block(r, d, r + d + 1, dtype) for d in range(n)]
    outs = [torch.empty(s + r + 1, 3, dtype=dtype) for s in range(n)]
    dist.all_to_all(outs, ins)
    for s in range(n):
        _eq(outs[s], _a2a_block(s, r, s + r + 1, torch.float64), f"all_to_all[{s}] {dtype}")
    # all_to_all_single, no split sizes
    inp = torch.cat([_a2a_block(r, d, 2, dtype) for d in range(n)])
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    _eq(out, torch.cat([_a2a_block(s, r, 2, torch.float64) for s in range(n)]), f"all_to_all_single {dtype}")
    # even split sizes given
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp, [2] * n, [2] * n)
    _eq(out, torch.cat([_a2a_block(s, r, 2, torch.float64) for s in range(n)]), f"all_to_all_single even {dtype}")
    # uneven split sizes, including empty blocks: rank r sends (r * d) % 3 rows to d
    sizes_in = [(r * d) % 3 for d in range(n)]
    sizes_out = [(s * r) % 3 for s in range(n)]
    inp = torch.cat([_a2a_block(r, d, sizes_in[d], dtype) for d in range(n)])
    out = torch.full((sum(sizes_out), 3), -1, dtype=dtype)
    dist.all_to_all_single(out, inp, sizes_out, sizes_in)
    _eq(out, torch.cat([_a2a_block(s, r, sizes_out[s], torch.float64) for s in range(n)]),
        f"all_to_all_single uneven {dtype}")
    # async, 1-d
    inp = torch.arange(2 * n, dtype=dtype) + 100 * r
    out = torch.empty_like(inp)
    w = dist.all_to_all_single(out, inp, async_op=True)
    w.wait()
    _eq(out, torch.cat([torch.arange(2 * r, 2 * r + 2) + 100 * s for s in range(n)]), f"all_to_all_single 1d {dtype}")


def check_p2p(r, n, dtype, k=7):
    nxt, prv = (r + 1) % n, (r - 1) % n
    # blocking ring; even ranks send first
    got = torch.empty(k, dtype=dtype)
    if r % 2 == 0:
        dist.send(_vals(k, r, dtype), nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(_vals(k, r, dtype), nxt)
    _eq(got, _vals(k, prv, torch.float64), f"send/recv {dtype}")
    # isend / irecv with tags, received in reverse tag order
    a = torch.empty(k, dtype=dtype)
    b = torch.empty(k, dtype=dtype)
    rb = dist.irecv(b, prv, tag=2)
    ra = dist.irecv(a, prv, tag=1)
    s1 = dist.isend(_vals(k, r, dtype, add=1), nxt, tag=1)
    s2 = dist.isend(_vals(k, r, dtype, add=2), nxt, tag=2)
    for w in (ra, rb, s1, s2):
        w.wait()
    _eq(a, _vals(k, prv, torch.float64, add=1), f"isend/irecv tag 1 {dtype}")
    _eq(b, _vals(k, prv, torch.float64, add=2), f"isend/irecv tag 2 {dtype}")
    # batch_isend_irecv (recv listed first)
    got = torch.empty(k, dtype=dtype)
    ops = [dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, _vals(k, r, dtype, add=3), nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    _eq(got, _vals(k, prv, torch.float64, add=3), f"batch_isend_irecv {dtype}")


def check_large(r, n):
    # above small_bytes (64 KiB): ring / chain algorithms, several chunks
    k = 300_000
    t = torch.arange(k, dtype=torch.float32) % 1000 + r
    dist.all_reduce(t)
    _eq(t, (torch.arange(k, dtype=torch.float64) % 1000) * n + n * (n - 1) / 2, "large all_reduce")
    t = torch.full((k,), float(r))
    dist.broadcast(t, src=1)
    _eq(t, torch.full((k,), 1.0), "large broadcast")
    flat = torch.empty(n * k // 4)
    dist.all_gather_into_tensor(flat, torch.full((k // 4,), float(r)))
    _eq(flat, torch.cat([torch.full((k // 4,), float(q)) for q in range(n)]), "large all_gather")
    out = torch.empty(k // 4)
    dist.reduce_scatter_tensor(out, torch.arange(n * (k // 4), dtype=torch.float32) % 100)
    _eq(out, ((torch.arange(n * (k // 4), dtype=torch.float64) % 100) * n)[r * (k // 4):(r + 1) * (k // 4)],
        "large reduce_scatter")
    t = (torch.arange(k) % 8 + r).to(torch.bfloat16)
    dist.all_reduce(t)
    _eq(t, (torch.arange(k, dtype=torch.float64) % 8) * n + n * (n - 1) / 2, "large bf16 all_reduce")


def check_noncontiguous(r, n):
    base = torch.zeros(4, 6)
    view = base[:, ::2]  # 4x3, not contiguous
    view.copy_(torch.arange(12, dtype=torch.float32).reshape(4, 3) + r)
    dist.all_reduce(view)
    _eq(view, (torch.arange(12, dtype=torch.float64).reshape(4, 3)) * n + n * (n - 1) / 2, "non-contiguous all_reduce")
    _eq(base[:, 1::2], torch.zeros(4, 3), "non-contiguous all_reduce leaves the gaps alone")
    t = torch.full((3, 5), float(r)).t()  # transposed
    dist.broadcast(t, src=0)
    _eq(t, torch.zeros(5, 3), "transposed broadcast")
    outs = [torch.empty(6, 2).t() for _ in range(n)]
    dist.all_gather(outs, (torch.ones(2, 6) * r))
    for q in range(n):
        _eq(outs[q], torch.full((2, 6), float(q)), "all_gather into transposed tensors")
    # requires_grad leaf tensors are handled under no_grad
    p = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        dist.all_reduce(p)
    _eq(p.detach(), torch.full((3,), float(n)), "all_reduce of a requires_grad tensor")


def check_async_and_future(r, n):
    t = torch.ones(8) * (r + 1)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future().then(lambda f: f.value()[0] * 2)
    res = fut.wait()
    _eq(res, torch.full((8,), float(n * (n + 1))), "future then()")
    assert w.is_completed() and w.is_success() and w.exception() is None
    w.wait()
    # several in flight at once
    ts = [torch.full((1000,), float(r + i)) for i in range(6)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    for i, (x, w) in enumerate(zip(ts, works)):
        w.wait()
        _eq(x, torch.full((1000,), float(sum(q + i for q in range(n)))), f"in-flight all_reduce {i}")
    dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait()


def check_coalescing(r, n):
    a = torch.full((3,), float(r))
    b = torch.full((5,), float(r + 1))
    c = torch.full((2,), r, dtype=torch.int64)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
        dist.all_reduce(c)
    cm.wait()
    s = n * (n - 1) / 2
    _eq(a, torch.full((3,), s), "coalesced all_reduce a")
    _eq(b, torch.full((5,), s + n), "coalesced all_reduce b")
    _eq(c, torch.full((2,), s), "coalesced all_reduce c")
    outs = [torch.empty(2 * n), torch.empty(3 * n)]
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(r)))
        dist.all_gather_into_tensor(outs[1], torch.full((3,), float(r + 10)))
    _eq(outs[0], torch.cat([torch.full((2,), float(q)) for q in range(n)]), "coalesced all_gather 0")
    _eq(outs[1], torch.cat([torch.full((3,), float(q + 10)) for q in range(n)]), "coalesced all_gather 1")
    rs = [torch.empty(2), torch.empty(4)]
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(rs[0], torch.ones(2 * n))
        dist.reduce_scatter_tensor(rs[1], torch.ones(4 * n) * 2)
    _eq(rs[0], torch.full((2,), float(n)), "coalesced reduce_scatter 0")
    _eq(rs[1], torch.full((4,), 2.0 * n), "coalesced reduce_scatter 1")


def check_objects(r, n):
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "pad": "x" * (r * 100)})
    assert [o["rank"] for o in objs] == list(range(n)), objs
    lst = [None, None] if r else [{"hello": [1, 2, 3]}, "world" * 50]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [{"hello": [1, 2, 3]}, "world" * 50], lst


def check_new_group(r, n):
    sub = dist.new_group([0, 1])
    if r in (0, 1):
        assert dist.get_backend(sub) == "linkescape"
        t = torch.full((4,), float(r + 1))
        dist.all_reduce(t, group=sub)
        _eq(t, torch.full((4,), 3.0), "new_group all_reduce")
        outs = [torch.empty(2) for _ in range(2)]
        dist.all_gather(outs, torch.full((2,), float(r)), group=sub)
        _eq(torch.stack(outs), torch.tensor([[0.0, 0.0], [1.0, 1.0]]), "new_group all_gather")
        # group-local vs global ranks in p2p
        got = torch.empty(3)
        if r == 0:
            dist.send(torch.arange(3.0), group_dst=1, group=sub)
        else:
            dist.recv(got, group_src=0, group=sub)
            _eq(got, torch.arange(3.0), "new_group send/recv")
    else:
        assert sub == dist.GroupMember.NON_GROUP_MEMBER
    # a group whose group ranks differ from the global ones: [0, 2]
    odd = dist.new_group([0, n - 1])
    if r in (0, n - 1):
        assert dist.get_group_rank(odd, r) == (0 if r == 0 else 1)
        t = torch.full((2,), float(r))
        dist.broadcast(t, group_src=1, group=odd)  # group rank 1 = global rank n-1
        _eq(t, torch.full((2,), float(n - 1)), "broadcast in group [0, n-1]")
    dist.barrier()


def check_device_mesh(r, n):
    from torch.distributed.device_mesh import init_device_mesh
    import torch.distributed._functional_collectives as funcol

    mesh = init_device_mesh("cpu", (n,))
    t = torch.full((4,), float(r + 1))
    out = funcol.all_reduce(t, "sum", mesh)
    out = funcol.wait_tensor(out) if hasattr(funcol, "wait_tensor") else out
    _eq(out, torch.full((4,), float(n * (n + 1) / 2)), "funcol all_reduce")
    g = funcol.all_gather_tensor(torch.full((2,), float(r)), 0, mesh)
    _eq(g, torch.cat([torch.full((2,), float(q)) for q in range(n)]), "funcol all_gather_tensor")
    rs = funcol.reduce_scatter_tensor(torch.ones(2 * n), "sum", 0, mesh)
    _eq(rs, torch.full((2,), float(n)), "funcol reduce_scatter_tensor")
    b = funcol.broadcast(torch.full((3,), float(r)), 0, mesh)
    _eq(b, torch.zeros(3), "funcol broadcast")
    a2a = funcol.all_to_all_single(torch.arange(n, dtype=torch.float32) + 10 * r, None, None, mesh)
    _eq(a2a, torch.tensor([10.0 * q + r for q in range(n)]), "funcol all_to_all_single")


def check_errors(r, n):
    from linkescape.errors import UsageError

    t = torch.ones(2)
    try:
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
    except ValueError as exc:
        assert isinstance(exc, UsageError) and "PREMUL_SUM" in str(exc), exc
    else:
        raise AssertionError("PREMUL_SUM did not raise")
    try:
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)
    except ValueError:
        pass
    else:
        raise AssertionError("BAND on float32 did not raise")
    # the group is still in step after refused calls
    t = torch.ones(2)
    dist.all_reduce(t)
    _eq(t, torch.full((2,), float(n)), "all_reduce after refused calls")


def main_all(n_expected=None):
    dist.init_process_group("linkescape", timeout=datetime.timedelta(seconds=30))
    r, n = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    assert type(pg).__name__ == "ProcessGroupLinkEscape", type(pg)
    assert dist.get_backend() == "linkescape"
    for dtype in DTYPES:
        check_all_reduce(r, n, dtype)
        check_rooted(r, n, dtype)
        check_gather_scatter(r, n, dtype)
        check_all_to_all(r, n, dtype)
        check_p2p(r, n, dtype)
    check_large(r, n)
    check_noncontiguous(r, n)
    check_async_and_future(r, n)
    check_coalescing(r, n)
    check_objects(r, n)
    if n >= 3:
        check_new_group(r, n)
    check_device_mesh(r, n)
    check_errors(r, n)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: ok")


# ====================================================================== pytest side
@pytest.mark.parametrize("nprocs", [2, 3])
def test_every_collective(nprocs):
    from linkescape.torch.testing import failures, launch

    res = launch([os.path.abspath(__file__), "all"], nprocs, timeout=120)
    bad = failures(res)
    assert not bad, bad
    for r in res:
        assert f"rank {r.rank}: ok" in r.stdout


if __name__ == "__main__":
    if sys.argv[1:] == ["all"]:
        main_all()
    else:
        raise SystemExit(f"usage: {sys.argv[0]} all")
