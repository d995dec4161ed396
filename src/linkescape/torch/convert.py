"""Tensors to numpy arrays, torch reduce ops to linkescape ones, timeouts.

CPU tensors that are contiguous become numpy arrays that share their memory
(bfloat16 through an int16 view, as numpy has no bfloat16 of its own). Any
other tensor (non-contiguous, CUDA or another device, conjugate or negative
view) is staged: copied into a contiguous host tensor before the operation
and copied back after it, as Gloo does for CUDA tensors.
"""

from __future__ import annotations

import datetime
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from ..common.errors import UnsupportedDtype, UsageError
from ..common.ops import ReduceOp, bfloat16

_RED = dist.ReduceOp.RedOpType
_REDUCE_OPS = {
    _RED.SUM: ReduceOp.SUM,
    _RED.AVG: ReduceOp.AVG,
    _RED.PRODUCT: ReduceOp.PROD,
    _RED.MIN: ReduceOp.MIN,
    _RED.MAX: ReduceOp.MAX,
    _RED.BAND: ReduceOp.BAND,
    _RED.BOR: ReduceOp.BOR,
    _RED.BXOR: ReduceOp.BXOR,
}

#: torch dtypes that numpy has no type for (besides bfloat16, handled apart)
_NO_NUMPY = {torch.complex32}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
              "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2", "quint8", "qint8",
              "qint32", "quint4x2", "quint2x4"):
    if hasattr(torch, _name):
        _NO_NUMPY.add(getattr(torch, _name))


def reduce_op(op) -> ReduceOp:
    """``dist.ReduceOp`` (an object or a ``RedOpType``) to ``linkescape.ReduceOp``."""
    kind = getattr(op, "op", op)
    try:
        return _REDUCE_OPS[kind]
    except (KeyError, TypeError):
        pass
    if kind == _RED.PREMUL_SUM:
        raise UsageError("ReduceOp.PREMUL_SUM is not supported by the linkescape backend (it exists for NCCL); "
                         "multiply the tensor by the factor and reduce with ReduceOp.SUM")
    raise UsageError(f"reduce op {op!r} is not supported by the linkescape backend")


def seconds(value, default: Optional[float] = None) -> Optional[float]:
    """A torch timeout (timedelta, milliseconds as int/float, None) in seconds;
    ``default`` when unset (torch uses 0 or a negative value for "unset")."""
    if value is None:
        return default
    if isinstance(value, datetime.timedelta):
        secs = value.total_seconds()
    else:
        secs = float(value) / 1000.0
    return secs if secs > 0 else default


def check_dtype(t: torch.Tensor, what: str = "tensor") -> None:
    if t.dtype in _NO_NUMPY:
        raise UnsupportedDtype(f"{what} has dtype {t.dtype}, which the linkescape backend does not support")


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """Zero-copy numpy view of a contiguous CPU tensor."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(bfloat16())
    check_dtype(t)
    return t.numpy()


def direct(t: torch.Tensor) -> bool:
    """True when ``t`` can be handed to the library without a copy."""
    return (t.device.type == "cpu" and t.is_contiguous() and not t.is_conj() and not t.is_neg()
            and t.layout == torch.strided)


class Staged:
    """A tensor as a contiguous host array, plus what puts the result back."""

    __slots__ = ("tensor", "host", "array")

    def __init__(self, tensor: torch.Tensor, load: bool = True) -> None:
        check_dtype(tensor)
        self.tensor = tensor
        if direct(tensor):
            self.host = tensor.detach()
        else:
            src = tensor.detach()
            if src.is_conj():
                src = src.resolve_conj()
            if src.is_neg():
                src = src.resolve_neg()
            if load:
                self.host = src.to("cpu", memory_format=torch.contiguous_format, copy=True)
                if not self.host.is_contiguous():
                    self.host = self.host.contiguous()
            else:
                self.host = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="cpu")
        self.array = to_numpy(self.host)

    def write_back(self) -> None:
        if not direct(self.tensor):
            with torch.no_grad():
                self.tensor.copy_(self.host)
            if self.tensor.device.type == "cuda":
                # this may run on the completer thread: make the copy visible
                # before wait() returns, whatever stream the caller uses next
                torch.cuda.current_stream(self.tensor.device).synchronize()


def stage(t: torch.Tensor, load: bool = True) -> Staged:
    return Staged(t, load)


def stack_inputs(tensors: Sequence[torch.Tensor], what: str) -> Tuple[torch.Tensor, np.ndarray]:
    """n equal tensors into one contiguous host tensor of shape (n, ...)."""
    first = tensors[0]
    for t in tensors:
        check_dtype(t, what)
        if t.shape != first.shape or t.dtype != first.dtype:
            raise UsageError(f"{what}: every tensor must have shape {tuple(first.shape)} and dtype {first.dtype}, "
                             f"not {tuple(t.shape)} {t.dtype}")
    host = torch.empty((len(tensors), *first.shape), dtype=first.dtype, device="cpu")
    with torch.no_grad():
        for i, t in enumerate(tensors):
            host[i].copy_(t.detach())
    return host, to_numpy(host)


def unstack_to(host: torch.Tensor, tensors: Sequence[torch.Tensor]) -> Callable[[], None]:
    def copy() -> None:
        with torch.no_grad():
            for i, t in enumerate(tensors):
                t.copy_(host[i])
        sync_devices(tensors)
    return copy


def sync_devices(tensors: Sequence[torch.Tensor]) -> None:
    """Wait for copies into CUDA tensors issued from this thread."""
    for dev in {t.device for t in tensors if t.device.type == "cuda"}:
        torch.cuda.current_stream(dev).synchronize()


def check_same(tensors: Sequence[torch.Tensor], shape, dtype, what: str) -> None:
    for t in tensors:
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            raise UsageError(f"{what}: expected tensors of shape {tuple(shape)} and dtype {dtype}, "
                             f"got {tuple(t.shape)} {t.dtype}")


def rows(array: np.ndarray, splits: List[int], what: str) -> List[np.ndarray]:
    """Blocks of consecutive rows (along dim 0) of sizes ``splits``."""
    total = array.shape[0] if array.ndim else 0
    if sum(splits) != total or any(s < 0 for s in splits):
        raise UsageError(f"{what}: split sizes {splits} do not add up to dim 0 = {total}")
    out, off = [], 0
    for s in splits:
        out.append(array[off:off + s])
        off += s
    return out


__all__ = ["reduce_op", "seconds", "to_numpy", "direct", "stage", "Staged", "stack_inputs", "unstack_to", "rows",
           "check_same", "check_dtype", "sync_devices"]
