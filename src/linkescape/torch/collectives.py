"""The collectives of the backend as :class:`~linkescape.torch.plan.Plan` s.

Each function takes the communicator's view of the group (``comm``: the
Communicator; ``rank``, ``size``) and the tensors in the one form the
process group method has already brought them to, and returns the plan:
what is staged, which library calls run on it, what is copied back. The
semantics are Gloo's where Gloo defines them:

* ``all_reduce`` over several tensors reduces across the tensors and the
  ranks, and every tensor gets the result;
* ``all_gather`` with ``k`` inputs per rank fills output lists of
  ``size * k`` tensors, rank-major;
* ``all_gather_coalesced`` fills ``output_lists[rank][i]`` from every
  rank's ``input_list[i]`` (tensors of any shapes);
* ``reduce_scatter`` takes inputs whose sizes differ from one destination
  rank to the next.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from ..common.errors import UsageError
from ..common.ops import ReduceOp, finish_avg
from . import convert
from .plan import Plan


def _same(tensors: Sequence[torch.Tensor], what: str) -> None:
    first = tensors[0]
    for t in tensors[1:]:
        if t.shape != first.shape or t.dtype != first.dtype:
            raise UsageError(f"{what}: every tensor must have shape {tuple(first.shape)} and dtype {first.dtype}, "
                             f"not {tuple(t.shape)} {t.dtype}")


def _dense(tensors: Sequence[torch.Tensor], what: str) -> None:
    for t in tensors:
        if t.layout != torch.strided:
            raise UsageError(f"{what} does not take {t.layout} tensors")
        convert.check_dtype(t, what)


_LOCAL = {
    ReduceOp.SUM: lambda a, b: a.add_(b),
    ReduceOp.AVG: lambda a, b: a.add_(b),
    ReduceOp.PROD: lambda a, b: a.mul_(b),
    ReduceOp.MIN: lambda a, b: torch.minimum(a, b, out=a),
    ReduceOp.MAX: lambda a, b: torch.maximum(a, b, out=a),
    ReduceOp.BAND: lambda a, b: a.bitwise_and_(b),
    ReduceOp.BOR: lambda a, b: a.bitwise_or_(b),
    ReduceOp.BXOR: lambda a, b: a.bitwise_xor_(b),
}


# ---------------------------------------------------------------- all_reduce
def all_reduce(comm, size: int, tensors: List[torch.Tensor], op: ReduceOp) -> Plan:
    _dense(tensors, "all_reduce")
    plan = Plan(tensors)
    if len(tensors) == 1:
        arr = plan.update(tensors[0])
        plan.issue(lambda: comm.all_reduce(arr, op, async_op=True))
        return plan
    # Several tensors: reduce them here in list order (as Gloo does), then
    # across ranks; every tensor gets the result. AVG counts every tensor.
    _same(tensors, "all_reduce")
    acc = plan.buffer(tensors[0].shape, tensors[0].dtype)
    with torch.no_grad():
        acc.copy_(tensors[0].detach())
        for t in tensors[1:]:
            _LOCAL[op](acc, t.detach().to("cpu"))
    arr = convert.to_numpy(acc)
    lib_op = ReduceOp.SUM if op is ReduceOp.AVG else op
    plan.issue(lambda: comm.all_reduce(arr, lib_op, async_op=True))
    if op is ReduceOp.AVG:
        plan.then(lambda: finish_avg(arr.reshape(-1), size * len(tensors)))

    def copy_out() -> None:
        with torch.no_grad():
            for t in tensors:
                t.copy_(acc)
        convert.sync_devices(tensors)
    plan.then(copy_out)
    return plan


def all_reduce_coalesced(comm, tensors: List[torch.Tensor], op: ReduceOp) -> Plan:
    """The tensors of each dtype flattened into one buffer, one all_reduce each."""
    _dense(tensors, "all_reduce_coalesced")
    plan = Plan(tensors)
    for dtype, ts in _by_dtype(tensors).items():
        flat = plan.buffer((sum(t.numel() for t in ts),), dtype)
        _pack(flat, ts)
        arr = convert.to_numpy(flat)
        plan.issue(lambda arr=arr: comm.all_reduce(arr, op, async_op=True))
        plan.then(lambda flat=flat, ts=ts: _unpack(flat, ts))
    plan.then(lambda: convert.sync_devices(tensors))
    return plan


def _by_dtype(tensors: Sequence[torch.Tensor]) -> Dict[torch.dtype, List[torch.Tensor]]:
    out: Dict[torch.dtype, List[torch.Tensor]] = {}
    for t in tensors:
        out.setdefault(t.dtype, []).append(t)
    return out


def _pack(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    off = 0
    with torch.no_grad():
        for t in tensors:
            k = t.numel()
            flat[off:off + k].copy_(t.detach().reshape(-1))
            off += k


def _unpack(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    off = 0
    with torch.no_grad():
        for t in tensors:
            k = t.numel()
            t.copy_(flat[off:off + k].view(t.shape))
            off += k


# ---------------------------------------------------------------- rooted
def broadcast(comm, rank: int, tensors: List[torch.Tensor], root: int, root_tensor: int = 0) -> Plan:
    """The root's ``tensors[root_tensor]`` into every tensor of every rank
    (several tensors: as Gloo, one broadcast, then local copies)."""
    _dense(tensors, "broadcast")
    if not 0 <= root_tensor < len(tensors):
        raise UsageError(f"broadcast: rootTensor {root_tensor} is not an index of the {len(tensors)} tensors")
    if len(tensors) > 1:
        _same(tensors, "broadcast")
    plan = Plan(tensors)
    src = tensors[root_tensor]
    arr = plan.read(src) if rank == root else plan.write(src)
    plan.issue(lambda: comm.broadcast(arr, root, async_op=True))
    others = [t for i, t in enumerate(tensors) if i != root_tensor]
    if others:
        def copy_out() -> None:
            with torch.no_grad():
                for t in others:
                    t.copy_(src)
            convert.sync_devices(others)
        plan.then(copy_out)
    return plan


def reduce(comm, rank: int, tensors: List[torch.Tensor], root: int, op: ReduceOp) -> Plan:
    _dense(tensors, "reduce")
    plan = Plan(tensors)
    for t in tensors:
        arr = plan.update(t) if rank == root else plan.read(t)
        plan.issue(lambda arr=arr: comm.reduce(arr, root, op, async_op=True))
    return plan


def gather(comm, rank: int, size: int, outputs: List[torch.Tensor], inp: torch.Tensor, root: int) -> Plan:
    _dense([inp, *outputs], "gather")
    plan = Plan(outputs)
    src = plan.read(inp)
    out = None
    if rank == root:
        if len(outputs) != size:
            raise UsageError(f"gather: the root needs a list of {size} output tensors, got {len(outputs)}")
        convert.check_same(outputs, inp.shape, inp.dtype, "gather")
        out = plan.rows_into(outputs, inp.shape, inp.dtype)
    plan.issue(lambda: comm.gather(out, src, root, async_op=True))
    return plan


def scatter(comm, rank: int, size: int, out: torch.Tensor, inputs: List[torch.Tensor], root: int) -> Plan:
    _dense([out, *inputs], "scatter")
    plan = Plan([out])
    dst = plan.write(out)
    src = None
    if rank == root:
        if len(inputs) != size:
            raise UsageError(f"scatter: the root needs a list of {size} input tensors, got {len(inputs)}")
        convert.check_same(inputs, out.shape, out.dtype, "scatter")
        src = plan.stacked(inputs, "scatter")
    plan.issue(lambda: comm.scatter(dst, src, root, async_op=True))
    return plan


# ---------------------------------------------------------------- all_gather
def all_gather(comm, size: int, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor]) -> Plan:
    """``k`` inputs per rank; each output list gets ``size * k`` tensors:
    rank 0's inputs, then rank 1's, ..."""
    _dense(inputs, "all_gather")
    if not inputs:
        raise UsageError("all_gather: no input tensors")
    _same(inputs, "all_gather inputs")
    k, first = len(inputs), inputs[0]
    outs = [t for lst in output_lists for t in lst]
    plan = Plan(outs)
    if len(output_lists) > 1:
        plan.value = [list(lst) for lst in output_lists]  # Gloo's future holds the lists
    for lst in output_lists:
        if len(lst) != size * k:
            raise UsageError(f"all_gather: each output list needs {size * k} tensors ({k} inputs x {size} ranks), "
                             f"got {len(lst)}")
        convert.check_same(lst, first.shape, first.dtype, "all_gather (tensors of different sizes are not supported)")
    src = plan.read(first) if k == 1 else plan.stacked(inputs, "all_gather")
    host = plan.buffer((size, *src.shape), first.dtype)
    out = convert.to_numpy(host)
    plan.issue(lambda: comm.all_gather(out, src, async_op=True))
    rows = host.reshape((size * k, *first.shape))

    def copy_out() -> None:
        with torch.no_grad():
            for lst in output_lists:
                for j, t in enumerate(lst):
                    t.copy_(rows[j])
        convert.sync_devices(outs)
    plan.then(copy_out)
    return plan


def all_gather_coalesced(comm, size: int, output_lists: List[List[torch.Tensor]],
                         inputs: List[torch.Tensor]) -> Plan:
    """``output_lists[r][i]`` gets rank r's ``inputs[i]``; inputs of any
    shapes, one flat all_gather per dtype."""
    _dense(inputs, "all_gather_coalesced")
    if len(output_lists) != size:
        raise UsageError(f"all_gather_coalesced: needs {size} output lists (one per rank), got {len(output_lists)}")
    for lst in output_lists:
        if len(lst) != len(inputs):
            raise UsageError(f"all_gather_coalesced: each output list needs {len(inputs)} tensors, got {len(lst)}")
        for o, i in zip(lst, inputs):
            if o.numel() != i.numel() or o.dtype != i.dtype:
                raise UsageError(f"all_gather_coalesced: output {tuple(o.shape)} {o.dtype} does not match input "
                                 f"{tuple(i.shape)} {i.dtype}")
    outs = [t for lst in output_lists for t in lst]
    plan = Plan(outs)
    for dtype, idx in _index_by_dtype(inputs).items():
        total = sum(inputs[i].numel() for i in idx)
        flat = plan.buffer((total,), dtype)
        _pack(flat, [inputs[i] for i in idx])
        host = plan.buffer((size, total), dtype)
        src, out = convert.to_numpy(flat), convert.to_numpy(host)
        plan.issue(lambda src=src, out=out: comm.all_gather(out, src, async_op=True))
        plan.then(lambda host=host, idx=idx: [_unpack(host[r], [output_lists[r][i] for i in idx])
                                              for r in range(size)])
    plan.then(lambda: convert.sync_devices(outs))
    return plan


def _index_by_dtype(tensors: Sequence[torch.Tensor]) -> Dict[torch.dtype, List[int]]:
    out: Dict[torch.dtype, List[int]] = {}
    for i, t in enumerate(tensors):
        out.setdefault(t.dtype, []).append(i)
    return out


def all_gather_into_tensor(comm, plan: Plan, size: int, output: torch.Tensor, inp: torch.Tensor) -> None:
    _dense([output, inp], "all_gather_into_tensor")
    if output.numel() != size * inp.numel() or output.dtype != inp.dtype:
        raise UsageError(f"all_gather_into_tensor: output must hold {size} x {inp.numel()} elements of {inp.dtype}, "
                         f"not {output.numel()} of {output.dtype}")
    src = plan.read(inp)
    out = plan.write(output).reshape((size, *src.shape))
    plan.issue(lambda: comm.all_gather(out, src, async_op=True))


# ---------------------------------------------------------------- reduce_scatter
def reduce_scatter(comm, rank: int, size: int, out: torch.Tensor, inputs: List[torch.Tensor],
                   op: ReduceOp) -> Plan:
    """Block ``j`` of ``inputs`` goes to rank ``j``; blocks may differ in
    size from one rank to the next (block ``rank`` has ``out``'s shape)."""
    _dense([out, *inputs], "reduce_scatter")
    if len(inputs) != size:
        raise UsageError(f"reduce_scatter: needs {size} input tensors, got {len(inputs)}")
    for t in inputs:
        if t.dtype != out.dtype:
            raise UsageError(f"reduce_scatter: input dtype {t.dtype} does not match output {out.dtype}")
    if inputs[rank].numel() != out.numel():
        raise UsageError(f"reduce_scatter: block {rank} has {inputs[rank].numel()} elements, the output "
                         f"{out.numel()}")
    plan = Plan([out])
    if all(t.shape == out.shape for t in inputs):
        dst = plan.write(out)
        src = plan.stacked(inputs, "reduce_scatter")
        plan.issue(lambda: comm.reduce_scatter(dst, src, op, async_op=True))
        return plan
    # uneven blocks: every rank knows every block's size (they are its own
    # inputs), so pad each to the largest; padding only meets padding
    width = max(t.numel() for t in inputs)
    host = plan.buffer((size, width), out.dtype)
    with torch.no_grad():
        host.zero_()
        for j, t in enumerate(inputs):
            host[j, :t.numel()].copy_(t.detach().reshape(-1))
    res = plan.buffer((width,), out.dtype)
    src, tmp = convert.to_numpy(host), convert.to_numpy(res)
    plan.issue(lambda: comm.reduce_scatter(tmp, src, op, async_op=True))

    def copy_out() -> None:
        with torch.no_grad():
            out.copy_(res[:out.numel()].view(out.shape))
        convert.sync_devices([out])
    plan.then(copy_out)
    return plan


def reduce_scatter_tensor(comm, plan: Plan, size: int, output: torch.Tensor, inp: torch.Tensor,
                          op: ReduceOp) -> None:
    _dense([output, inp], "reduce_scatter_tensor")
    if inp.numel() != size * output.numel() or output.dtype != inp.dtype:
        raise UsageError(f"reduce_scatter_tensor: input must hold {size} x {output.numel()} elements of "
                         f"{output.dtype}, not {inp.numel()} of {inp.dtype}")
    src = plan.read(inp)
    dst = plan.write(output)
    src2 = src.reshape((size, *dst.shape))
    plan.issue(lambda: comm.reduce_scatter(dst, src2, op, async_op=True))


__all__ = ["all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "gather", "scatter", "all_gather",
           "all_gather_coalesced", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor"]
