"""all_reduce of sparse COO tensors, as Gloo does it.

Gloo's sparse all_reduce sums the local tensors, coalesces, gathers every
rank's metadata (sizes, nnz), then every rank's indices and values, and sums
the ranks' sparse tensors in rank order before a final coalesce. The same
torch operations in the same order here give bit-identical results, DDP
with sparse gradients (``nn.Embedding(sparse=True)``) included.

The metadata exchange runs when the operation is called (it is small and
the index and value buffers depend on it: their size is the largest nnz of
any rank); indices and values then travel as padded all_gathers, issued at
once so that every rank posts its collectives in program order.
"""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from ..common.errors import CollectiveMismatch, UsageError
from ..common.ops import ReduceOp
from . import convert
from .plan import Plan

#: metadata per rank: nnz, sparse_dim, dense_dim, ndim, then the sizes
_MAX_DIMS = 16
_META = 4 + _MAX_DIMS


def is_sparse(tensors: List[torch.Tensor]) -> bool:
    layouts = {t.layout for t in tensors}
    if torch.sparse_coo in layouts:
        if layouts != {torch.sparse_coo}:
            raise UsageError("all_reduce: cannot mix sparse COO and dense tensors in one call")
        return True
    for layout in layouts:
        if layout != torch.strided:
            raise UsageError(f"all_reduce does not take {layout} tensors (sparse COO and dense only)")
    return False


def all_reduce(comm, rank: int, size: int, tensors: List[torch.Tensor], op: ReduceOp) -> Plan:
    if op is not ReduceOp.SUM:
        raise UsageError(f"sparse all_reduce supports ReduceOp.SUM only, not {op.name}")
    first = tensors[0]
    for t in tensors[1:]:
        if t.shape != first.shape or t.dtype != first.dtype:
            raise UsageError("sparse all_reduce: every tensor must have the same size and dtype")
    convert.check_dtype(first, "sparse all_reduce")
    if first.dim() > _MAX_DIMS:
        raise UsageError(f"sparse all_reduce supports up to {_MAX_DIMS} dimensions, not {first.dim()}")
    with torch.no_grad():
        local = first.detach().to("cpu")
        for t in tensors[1:]:
            local = local + t.detach().to("cpu")
        local = local.coalesce()
    shape = tuple(local.shape)
    sparse_dim, dense_dim, nnz = local.sparse_dim(), local.dense_dim(), local._nnz()
    meta = np.zeros(_META, np.int64)
    meta[:4] = (nnz, sparse_dim, dense_dim, len(shape))
    meta[4:4 + len(shape)] = shape
    metas = np.empty((size, _META), np.int64)
    comm.all_gather(metas, meta)  # small and synchronous: the buffers below depend on it
    for r in range(size):
        if not np.array_equal(metas[r, 1:], meta[1:]):
            raise CollectiveMismatch(f"sparse all_reduce: rank {r} has a tensor of size "
                                     f"{tuple(metas[r, 4:4 + metas[r, 3]])} (sparse_dim {metas[r, 1]}), "
                                     f"rank {rank} one of size {shape} (sparse_dim {sparse_dim})")
    counts = [int(c) for c in metas[:, 0]]
    width = max(counts)
    dense_shape = shape[sparse_dim:]
    plan = Plan(tensors)
    indices = plan.buffer((size, sparse_dim, width), torch.int64)
    values = plan.buffer((size, width, *dense_shape), local.dtype)
    if width:
        my_idx = plan.buffer((sparse_dim, width), torch.int64)
        my_val = plan.buffer((width, *dense_shape), local.dtype)
        with torch.no_grad():
            my_idx.zero_()
            my_val.zero_()
            my_idx[:, :nnz].copy_(local.indices())
            my_val[:nnz].copy_(local.values())
        pairs = [(convert.to_numpy(indices), convert.to_numpy(my_idx)),
                 (convert.to_numpy(values), convert.to_numpy(my_val))]
        plan.issue(lambda: [comm.all_gather(out, src, async_op=True) for out, src in pairs])

    def combine() -> None:
        with torch.no_grad():
            out = torch.sparse_coo_tensor(indices[0, :, :counts[0]], values[0, :counts[0]], shape,
                                          dtype=local.dtype)
            for r in range(1, size):
                out += torch.sparse_coo_tensor(indices[r, :, :counts[r]], values[r, :counts[r]], shape,
                                               dtype=local.dtype)
            out = out.coalesce()
            for t in tensors:
                t.copy_(out.to(t.device))
        convert.sync_devices(tensors)
    plan.then(combine)
    return plan


__all__ = ["all_reduce", "is_sparse"]
