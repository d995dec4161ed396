"""Workload values every rank can recompute, and the exact result of each collective over them.

The workloads of the fault tests (:mod:`.worker`), the failover benchmark and
the chaos soak check every result bit for bit. Their inputs are small
integers (-8..8, 0..8 for unsigned types) drawn from a seed that names the
rank and the operation (:func:`ints`): exactly representable in every dtype,
and so is every sum, minimum, maximum and xor over up to 15 ranks. Any rank
can therefore compute what any rank must hold after a collective, in int64
(:func:`expected`), and compare it byte for byte (:func:`compare`).

Kinds: ``all_reduce``, ``broadcast``, ``reduce``, ``all_gather``,
``reduce_scatter``, ``all_to_all``, ``gather``, ``scatter``, ``ring`` (every
rank sends to ``rank + shift`` and receives from ``rank - shift``) and
``barrier``. A rank's input has the shape :func:`in_shape` gives.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..common.ops import ReduceOp, bfloat16

#: kinds whose input is one chunk per rank, shape (world, count)
PER_RANK_INPUT = ("reduce_scatter", "all_to_all", "scatter")
#: kinds whose largest buffer is (world, count)
PER_RANK_BUFFER = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")
_NP_REDUCE = {"SUM": np.add, "MAX": np.maximum, "MIN": np.minimum, "BXOR": np.bitwise_xor}

Inputs = Callable[[int], np.ndarray]  # rank -> that rank's input as int64, in its input shape


def dtype_of(name) -> np.dtype:
    """A dtype by name, bfloat16 included (``ml_dtypes``)."""
    if str(name) == "bfloat16":
        dt = bfloat16()
        if dt is None:  # pragma: no cover - ml_dtypes is a dependency
            raise RuntimeError("bfloat16 needs ml_dtypes")
        return dt
    return np.dtype(name)


def ints(key: Sequence[int], shape, *, unsigned: bool = False) -> np.ndarray:
    """Small integers (-8..8, or 0..8) as int64, drawn from ``key`` alone."""
    rng = np.random.default_rng(list(key))
    return rng.integers(0 if unsigned else -8, 9, size=shape, dtype=np.int64)


def cast(values: np.ndarray, dtype) -> np.ndarray:
    """``values`` (small integers) in ``dtype``; exact in every dtype."""
    dt = dtype_of(dtype)
    if dt.name == "bfloat16":
        return values.astype(np.float32).astype(dt)
    return values.astype(dt)


def in_shape(kind: str, count: int, world: int) -> Tuple[int, ...]:
    """The shape of a rank's input of ``kind`` with ``count`` elements per chunk."""
    return (world, count) if kind in PER_RANK_INPUT else (count,)


def _reduced(inputs: Inputs, world: int, op: str) -> np.ndarray:
    acc = inputs(0)
    for q in range(1, world):
        acc = _NP_REDUCE[op](acc, inputs(q))
    return acc


def expected(kind: str, rank: int, world: int, inputs: Inputs, dtype, *, root: int = 0, op: str = "SUM",
             shift: int = 1) -> Optional[np.ndarray]:
    """What ``rank`` must hold after ``kind``; None where the call leaves it nothing to check."""
    if kind == "all_reduce":
        return cast(_reduced(inputs, world, op), dtype)
    if kind == "reduce":
        return cast(_reduced(inputs, world, op) if rank == root else inputs(rank), dtype)
    if kind == "broadcast":
        return cast(inputs(root), dtype)
    if kind == "all_gather" or (kind == "gather" and rank == root):
        return cast(np.stack([inputs(q) for q in range(world)]), dtype)
    if kind in ("gather", "barrier"):
        return None
    if kind == "reduce_scatter":
        return cast(_reduced(inputs, world, op)[rank], dtype)
    if kind == "all_to_all":
        return cast(np.stack([inputs(q)[rank] for q in range(world)]), dtype)
    if kind == "scatter":
        return cast(inputs(root)[rank], dtype)
    if kind == "ring":
        return cast(inputs((rank - shift) % world), dtype)
    raise ValueError(f"unknown operation {kind!r}")


def post(comm, kind: str, mine: Optional[np.ndarray], *, root: int = 0, op: str = "SUM", shift: int = 1,
         tag: int = 0, async_op: bool = False) -> Tuple[List[Any], Optional[np.ndarray]]:
    """Start ``kind`` on ``comm`` with this rank's input ``mine``; returns the works to wait for (none when
    blocking) and the buffer that holds the result (``mine`` itself for the in-place calls)."""
    n, r = comm.world_size, comm.rank
    red = getattr(ReduceOp, op)
    if kind == "barrier":
        return _works(comm.barrier(async_op=async_op)), None
    if kind == "all_reduce":
        return _works(comm.all_reduce(mine, red, async_op=async_op)), mine
    if kind == "broadcast":
        return _works(comm.broadcast(mine, root, async_op=async_op)), mine
    if kind == "reduce":
        return _works(comm.reduce(mine, root, red, async_op=async_op)), mine
    if kind == "ring":
        out = np.empty_like(mine)
        send = comm.send(mine, (r + shift) % n, tag=tag, async_op=True)
        recv = comm.recv(out, (r - shift) % n, tag=tag, async_op=True)
        return [send, recv], out
    if kind == "all_gather":
        out = np.empty((n, *mine.shape), mine.dtype)
        return _works(comm.all_gather(out, mine, async_op=async_op)), out
    if kind == "reduce_scatter":
        out = np.empty(mine.shape[1:], mine.dtype)
        return _works(comm.reduce_scatter(out, mine, red, async_op=async_op)), out
    if kind == "all_to_all":
        out = np.empty_like(mine)
        return _works(comm.all_to_all(out, mine, async_op=async_op)), out
    if kind == "gather":
        out = np.empty((n, *mine.shape), mine.dtype) if r == root else None
        return _works(comm.gather(out, mine, root, async_op=async_op)), out
    if kind == "scatter":
        out = np.empty(mine.shape[1:], mine.dtype)
        return _works(comm.scatter(out, mine if r == root else None, root, async_op=async_op)), out
    raise ValueError(f"unknown operation {kind!r}")


def _works(w: Any) -> List[Any]:
    return [] if w is None or w is True or w is False else [w]


def _elements(a: np.ndarray) -> np.ndarray:
    """``a`` as unsigned integers of its item size: one element compares as one word, NaN bits included."""
    a = np.ascontiguousarray(a).reshape(-1)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else \
        a.view(np.uint8).reshape(-1, a.dtype.itemsize)


def count_wrong(got: np.ndarray, ref: np.ndarray) -> int:
    """Elements of ``got`` whose bytes differ from ``ref``'s (same shape and dtype)."""
    bad = _elements(got) != _elements(ref)
    return int(np.count_nonzero(bad if bad.ndim == 1 else bad.any(axis=1)))


def compare(got: Optional[np.ndarray], ref: Optional[np.ndarray]) -> Dict[str, Any]:
    """``got`` against the reference byte for byte: ``{"wrong": elements}``, with the first mismatch if any."""
    if ref is None:
        return {"wrong": 0}
    ref = np.ascontiguousarray(ref)
    if got is None or got.shape != ref.shape or got.dtype != ref.dtype:
        return {"wrong": int(ref.size), "why": f"shape/dtype {None if got is None else (got.shape, str(got.dtype))}"}
    bad = _elements(got) != _elements(ref)
    wrong_idx = np.nonzero(bad if bad.ndim == 1 else bad.any(axis=1))[0]
    if not len(wrong_idx):
        return {"wrong": 0}
    i = int(wrong_idx[0])
    return {"wrong": int(len(wrong_idx)), "first": i, "got": str(got.reshape(-1)[i]),
            "want": str(ref.reshape(-1)[i])}


__all__ = ["ints", "cast", "dtype_of", "in_shape", "expected", "post", "compare", "count_wrong",
           "PER_RANK_INPUT", "PER_RANK_BUFFER"]
