"""all_to_all in every form, and point-to-point, as plans.

``all_to_all_single`` without split sizes uses ``Communicator.all_to_all``;
with split sizes (even or not), and the list form ``all_to_all``, blocks go
by send/recv pairs under a tag reserved for the backend, so blocks may have
any size (empty ones are skipped). Every rank must therefore pass split
sizes, or none.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from ..common.errors import UsageError
from . import convert
from .plan import Plan

#: p2p tags at and above this are the backend's own (all_to_all exchanges,
#: sparse all_reduce, monitored barriers); torch tags are 32-bit ints, so
#: they never reach it
RESERVED_TAG_BASE = 1 << 61
TAG_SPAN = 1 << 40


def exchange(comm, rank: int, size: int, send: List[np.ndarray], recv: List[np.ndarray], tag: int,
             what: str) -> list:
    """Block i of ``send`` to rank i, block i of ``recv`` from rank i."""
    if recv[rank].nbytes != send[rank].nbytes:
        raise UsageError(f"{what}: rank {rank} sends itself {send[rank].shape} but expects {recv[rank].shape}")
    parts = []
    for k in range(1, size):
        dst, src = (rank + k) % size, (rank - k) % size
        if recv[src].size:
            parts.append(comm.recv(recv[src], src, tag, async_op=True))
        if send[dst].size:
            parts.append(comm.send(send[dst], dst, tag, async_op=True))
    if recv[rank].size:
        recv[rank][...] = send[rank]
    return parts


def all_to_all(comm, rank: int, size: int, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
               tag: int) -> Plan:
    if len(outputs) != size or len(inputs) != size:
        raise UsageError(f"all_to_all: needs {size} input and {size} output tensors")
    for o, i in zip(outputs, inputs):
        if o.dtype != i.dtype:
            raise UsageError(f"all_to_all: dtype {i.dtype} sent into {o.dtype}")
    plan = Plan(outputs)
    send = [plan.read(t).reshape(-1) for t in inputs]
    recv = [plan.write(t).reshape(-1) for t in outputs]
    if any(np.shares_memory(a, b) for a in send for b in recv):
        send = [a.copy() for a in send]
        plan.keep.append(send)
    plan.issue(lambda: exchange(comm, rank, size, send, recv, tag, "all_to_all"))
    return plan


def all_to_all_single(comm, rank: int, size: int, output: torch.Tensor, inp: torch.Tensor,
                      out_splits: List[int], in_splits: List[int], tag: int) -> Plan:
    if output.dtype != inp.dtype:
        raise UsageError(f"all_to_all_single: dtype {inp.dtype} sent into {output.dtype}")
    plan = Plan([output])
    iarr = plan.read(inp)
    oarr = plan.write(output)
    if np.shares_memory(iarr, oarr):
        iarr = iarr.copy()
        plan.keep.append(iarr)
    if not out_splits and not in_splits:
        if inp.numel() != output.numel() or (inp.dim() and inp.shape[0] % size):
            raise UsageError(f"all_to_all_single: without split sizes, input and output must have the same "
                             f"size and dim 0 divisible by {size}")
        i2, o2 = iarr.reshape((size, -1)), oarr.reshape((size, -1))
        plan.issue(lambda: comm.all_to_all(o2, i2, async_op=True))
        return plan
    if inp.dim() == 0 or output.dim() == 0:
        raise UsageError("all_to_all_single with split sizes needs tensors of at least one dimension")
    in_splits = in_splits or _even(inp, size, "input")
    out_splits = out_splits or _even(output, size, "output")
    if len(in_splits) != size or len(out_splits) != size:
        raise UsageError(f"all_to_all_single: split sizes need {size} entries")
    send = convert.rows(iarr, in_splits, "all_to_all_single input")
    recv = convert.rows(oarr, out_splits, "all_to_all_single output")
    plan.issue(lambda: exchange(comm, rank, size, send, recv, tag, "all_to_all_single"))
    return plan


def _even(t: torch.Tensor, size: int, what: str) -> List[int]:
    if t.shape[0] % size:
        raise UsageError(f"all_to_all_single: {what} dim 0 = {t.shape[0]} not divisible by {size}")
    return [t.shape[0] // size] * size


def send(comm, tensors: List[torch.Tensor], dst: int, tag: int) -> Plan:
    plan = Plan(tensors)
    for t in tensors:
        arr = plan.read(t)
        plan.issue(lambda arr=arr: comm.send(arr, dst, tag, async_op=True))
    return plan


def recv(comm, tensors: List[torch.Tensor], src: Optional[int], tag: int) -> Plan:
    """``src=None``: from whichever rank's matching send comes first."""
    plan = Plan(tensors)
    for t in tensors:
        arr = plan.write(t)
        if src is None:
            plan.issue(lambda arr=arr: comm.recv(arr, None, tag, async_op=True))
        else:
            plan.issue(lambda arr=arr: comm.recv(arr, src, tag, async_op=True))
    return plan


__all__ = ["exchange", "all_to_all", "all_to_all_single", "send", "recv", "RESERVED_TAG_BASE", "TAG_SPAN"]
