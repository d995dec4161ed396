"""The argument forms of the C++ ``ProcessGroup`` API, made one.

The Python bindings of ``ProcessGroup`` offer each collective in several
forms: a list of tensors with an options object (what ``torch.distributed``
calls), a single tensor with a keyword ``root`` / ``op`` and ``timeout``, or
nothing but the tensors. A Python subclass is called with whichever form the
caller used, so every method of the backend reads its arguments through
these helpers.
"""

from __future__ import annotations

import datetime
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from ..common.errors import UsageError

_REDUCE_OPS = (dist.ReduceOp, dist.ReduceOp.RedOpType)


def tensor_list(value, what: str) -> List[torch.Tensor]:
    """A tensor or a sequence of tensors as a list."""
    if value is None:
        raise UsageError(f"{what}: no tensors given")
    if isinstance(value, torch.Tensor):
        return [value]
    out = list(value)
    for t in out:
        if not isinstance(t, torch.Tensor):
            raise UsageError(f"{what}: expected tensors, got {type(t).__name__}")
    return out


def is_reduce_op(value) -> bool:
    return isinstance(value, _REDUCE_OPS)


def reduce_op_of(opts=None, op=None):
    """The reduce op from an options object, a ReduceOp given in its place,
    or the ``op`` keyword (SUM when none)."""
    if op is not None:
        return op
    if opts is None:
        return dist.ReduceOp.SUM
    if is_reduce_op(opts):
        return opts
    red = getattr(opts, "reduceOp", None)
    if red is None:
        raise UsageError(f"expected reduce options or a ReduceOp, not {type(opts).__name__}")
    return red


def root_of(opts=None, root=None) -> int:
    """The root rank from an options object, an int given in its place, or
    the ``root`` keyword (0 when none)."""
    if root is not None:
        return _int(root, "root")
    if opts is None:
        return 0
    if isinstance(opts, (int,)) or _is_integer(opts):
        return _int(opts, "root")
    r = getattr(opts, "rootRank", None)
    if r is None:
        raise UsageError(f"expected options with rootRank or an int root, not {type(opts).__name__}")
    return _int(r, "root")


def timeout_of(opts=None, timeout=None) -> Optional[float]:
    """Seconds from a ``timeout`` argument, a timedelta given in place of
    the options, or the options' ``timeout``; None when unset."""
    for value in (timeout, opts if isinstance(opts, datetime.timedelta) else None, getattr(opts, "timeout", None)):
        if value is None:
            continue
        if isinstance(value, datetime.timedelta):
            secs = value.total_seconds()
        else:
            secs = float(value) / 1000.0
        if secs > 0:
            return secs
    return None


def split_sizes(value, what: str) -> List[int]:
    """Split sizes from any sequence of integers (a list, a tuple, a numpy
    array, a tensor) or None; empty means "split evenly"."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        items = list(value)
    except TypeError:
        raise UsageError(f"{what}: split sizes must be a sequence of ints, not {type(value).__name__}") from None
    out = []
    for s in items:
        if isinstance(s, bool) or not (isinstance(s, int) or _is_integer(s)):
            raise UsageError(f"{what}: split sizes must be ints, not {s!r}")
        out.append(int(s))
    if any(s < 0 for s in out):
        raise UsageError(f"{what}: split sizes must not be negative: {out}")
    return out


def _is_integer(value) -> bool:
    try:
        import numpy as np

        return isinstance(value, np.integer)
    except ImportError:  # pragma: no cover - numpy is a dependency
        return False


def _int(value, what: str) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or _is_integer(value)):
        raise UsageError(f"{what} must be an int, not {value!r}")
    return int(value)


def flat_pairs(outputs: Sequence, inputs: Sequence, what: str):
    if len(outputs) != len(inputs):
        raise UsageError(f"{what}: {len(outputs)} outputs for {len(inputs)} inputs")
    return list(zip(outputs, inputs))


__all__ = ["tensor_list", "is_reduce_op", "reduce_op_of", "root_of", "timeout_of", "split_sizes", "flat_pairs"]
