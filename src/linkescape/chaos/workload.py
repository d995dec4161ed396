"""The chaos workload: a sequence of steps every rank derives from the seed, checked exactly.

Step ``k`` depends on ``(seed, k)`` only, so every rank runs the same
operations in the same order with no message about it. A step is one of:

* ``op``: one collective (all_reduce, broadcast, reduce, all_gather,
  reduce_scatter, all_to_all, gather, scatter), blocking;
* ``burst``: 2-6 collectives posted with ``async_op=True``, then waited;
* ``ring``: every rank sends to ``rank + s`` and receives from ``rank - s``
  (``s`` drawn per step), send and recv both asynchronous;
* ``barrier``.

Sizes are drawn log-uniformly from 4 B to ``max_bytes`` (4 MiB): the largest
buffer a rank passes. Dtypes are float16, bfloat16, float32, float64, int8,
uint8, int32, int64. Every input element is a small integer (-8..8, 0..8 for
unsigned), exactly representable in every dtype, and so is every sum,
minimum, maximum and xor over the ranks: the reference (:func:`expected`),
computed by numpy in int64 from every rank's input, is exact, and results are
compared byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..ops import BFLOAT16, ReduceOp

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather",
               "scatter")
#: every operation the workload verifies, as the report counts them
OPERATIONS = COLLECTIVES + ("barrier", "send", "recv")
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64")
REDUCED = ("all_reduce", "reduce", "reduce_scatter")
MIN_BYTES = 4
MAX_BYTES = 4 << 20
MAX_WORLD = 15  # int8 sums of 15 values in -8..8 still fit
_STEP_KINDS = (("op", 0.62), ("burst", 0.2), ("ring", 0.13), ("barrier", 0.05))


def dtype_of(name: str) -> np.dtype:
    if name == "bfloat16":
        if BFLOAT16 is None:  # pragma: no cover - ml_dtypes is a dependency
            raise RuntimeError("bfloat16 needs ml_dtypes")
        return BFLOAT16
    return np.dtype(name)


@dataclass(frozen=True)
class Op:
    """One operation of a step: what to call, on what shape, with which root and reduction."""

    kind: str
    dtype: str
    count: int  # elements per rank chunk (shape (world, count) where the call takes one)
    root: int = 0
    op: str = "SUM"  # ReduceOp name of reducing collectives
    peer_shift: int = 1  # ring: send to rank + shift, receive from rank - shift
    salt: int = 0  # tells inputs of the ops of one step apart

    def nbytes(self, world: int) -> int:
        """Bytes of the largest buffer a rank passes."""
        per = self.count * dtype_of(self.dtype).itemsize
        return per * world if self.kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter") else per


@dataclass(frozen=True)
class Step:
    """Step ``k``: one ``op``, a ``burst`` of async ops, a send/recv ``ring`` or a ``barrier``."""

    k: int
    kind: str
    ops: Tuple[Op, ...] = field(default_factory=tuple)

    def nbytes(self, world: int) -> int:
        return sum(op.nbytes(world) for op in self.ops)


def plan_step(seed: int, k: int, world: int, max_bytes: int = MAX_BYTES) -> Step:
    """Step ``k`` of the workload of ``seed`` (the same on every rank)."""
    if not 2 <= world <= MAX_WORLD:
        raise ValueError(f"the chaos workload needs 2..{MAX_WORLD} ranks, got {world}")
    rng = np.random.default_rng([seed, k, 0x4C45])
    u = rng.random()
    acc = 0.0
    kind = _STEP_KINDS[-1][0]
    for name, weight in _STEP_KINDS:
        acc += weight
        if u < acc:
            kind = name
            break
    if kind == "barrier":
        return Step(k, "barrier", (Op("barrier", "uint8", 1),))
    if kind == "ring":
        dt = str(rng.choice(DTYPES))
        count = _count(rng, dt, world, "send", max_bytes)
        return Step(k, "ring", (Op("ring", dt, count, peer_shift=int(rng.integers(1, world))),))
    n = int(rng.integers(2, 7)) if kind == "burst" else 1
    cap = max_bytes if kind == "op" else max(MIN_BYTES, max_bytes // 16)
    ops = []
    for salt in range(n):
        coll = str(rng.choice(COLLECTIVES))
        dt = str(rng.choice(DTYPES))
        ops.append(Op(coll, dt, _count(rng, dt, world, coll, cap), root=int(rng.integers(world)),
                      op=_reduce_op(rng, coll, dt), salt=salt))
    return Step(k, kind, tuple(ops))


def _count(rng: np.random.Generator, dtype: str, world: int, kind: str, max_bytes: int) -> int:
    nbytes = math.exp(rng.uniform(math.log(MIN_BYTES), math.log(max_bytes)))
    per = dtype_of(dtype).itemsize * (world if kind in ("all_gather", "reduce_scatter", "all_to_all", "gather",
                                                         "scatter") else 1)
    return max(1, int(nbytes // per))


def _reduce_op(rng: np.random.Generator, kind: str, dtype: str) -> str:
    if kind not in REDUCED:
        return "SUM"
    choices = ["SUM", "SUM", "MAX", "MIN"] + (["BXOR"] if dtype_of(dtype).kind in "iu" else [])
    return str(rng.choice(choices))


# ------------------------------------------------------------ values
def value(seed: int, k: int, op: Op, rank: int, shape: Tuple[int, ...]) -> np.ndarray:
    """Rank ``rank``'s input of ``op`` in step ``k``: small integers, in the op's dtype."""
    return _cast(_ints(seed, k, op, rank, shape), op.dtype)


def _cast(ints: np.ndarray, dtype: str) -> np.ndarray:
    dt = dtype_of(dtype)
    if dt == BFLOAT16:
        return ints.astype(np.float32).astype(dt)
    return ints.astype(dt)


def _ints(seed: int, k: int, op: Op, rank: int, shape: Tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([seed, k, op.salt, rank, 0x5652])
    lo = 0 if dtype_of(op.dtype).kind == "u" else -8
    return rng.integers(lo, 9, size=shape, dtype=np.int64)


_NP_REDUCE = {"SUM": np.add, "MAX": np.maximum, "MIN": np.minimum, "BXOR": np.bitwise_xor}


def _reduced(seed: int, k: int, op: Op, world: int, shape: Tuple[int, ...]) -> np.ndarray:
    acc = _ints(seed, k, op, 0, shape)
    for q in range(1, world):
        acc = _NP_REDUCE[op.op](acc, _ints(seed, k, op, q, shape))
    return _cast(acc, op.dtype)


def in_shape(op: Op, world: int) -> Tuple[int, ...]:
    if op.kind in ("reduce_scatter", "all_to_all", "scatter"):
        return (world, op.count)
    return (op.count,)


def expected(seed: int, k: int, op: Op, rank: int, world: int) -> Optional[np.ndarray]:
    """What rank ``rank`` must hold after ``op``; None where the call leaves nothing to check."""
    shape = in_shape(op, world)
    if op.kind == "all_reduce":
        return _reduced(seed, k, op, world, shape)
    if op.kind == "reduce":
        return _reduced(seed, k, op, world, shape) if rank == op.root else value(seed, k, op, rank, shape)
    if op.kind == "broadcast":
        return value(seed, k, op, op.root, shape)
    if op.kind == "all_gather" or (op.kind == "gather" and rank == op.root):
        return np.stack([value(seed, k, op, q, shape) for q in range(world)])
    if op.kind == "gather":
        return None
    if op.kind == "reduce_scatter":
        return _reduced(seed, k, op, world, shape)[rank]
    if op.kind == "all_to_all":
        return np.stack([value(seed, k, op, q, shape)[rank] for q in range(world)])
    if op.kind == "scatter":
        return value(seed, k, op, op.root, shape)[rank]
    if op.kind == "ring":
        return value(seed, k, op, (rank - op.peer_shift) % world, shape)
    if op.kind == "barrier":
        return None
    raise ValueError(f"unknown op {op.kind!r}")


# ------------------------------------------------------------ running
def post(comm, seed: int, k: int, op: Op, async_op: bool) -> Tuple[List[Any], Optional[np.ndarray]]:
    """Start ``op`` on ``comm``; returns the works (empty when blocking) and the buffer to check."""
    n, r = comm.world_size, comm.rank
    shape = in_shape(op, n)
    dt = dtype_of(op.dtype)
    mine = value(seed, k, op, r, shape)
    red = getattr(ReduceOp, op.op)
    if op.kind in ("all_reduce", "broadcast", "reduce"):
        call = {"all_reduce": lambda: comm.all_reduce(mine, red, async_op=async_op),
                "broadcast": lambda: comm.broadcast(mine, op.root, async_op=async_op),
                "reduce": lambda: comm.reduce(mine, op.root, red, async_op=async_op)}[op.kind]
        return _works(call()), mine
    if op.kind == "barrier":
        return _works(comm.barrier(async_op=async_op)), None
    if op.kind == "ring":
        out = np.empty(shape, dt)
        send = comm.send(mine, (r + op.peer_shift) % n, tag=k % 65536, async_op=True)
        recv = comm.recv(out, (r - op.peer_shift) % n, tag=k % 65536, async_op=True)
        return [send, recv], out
    if op.kind == "all_gather":
        out = np.empty((n, *shape), dt)
        return _works(comm.all_gather(out, mine, async_op=async_op)), out
    if op.kind == "reduce_scatter":
        out = np.empty(shape[1:], dt)
        return _works(comm.reduce_scatter(out, mine, red, async_op=async_op)), out
    if op.kind == "all_to_all":
        out = np.empty(shape, dt)
        return _works(comm.all_to_all(out, mine, async_op=async_op)), out
    if op.kind == "gather":
        out = np.empty((n, *shape), dt) if r == op.root else None
        return _works(comm.gather(out, mine, op.root, async_op=async_op)), out
    if op.kind == "scatter":
        out = np.empty(shape[1:], dt)
        return _works(comm.scatter(out, mine if r == op.root else None, op.root, async_op=async_op)), out
    raise ValueError(f"unknown op {op.kind!r}")


def _works(w: Any) -> List[Any]:
    return [] if w is None or w is True or w is False else [w]


def check(seed: int, k: int, op: Op, rank: int, world: int, got: Optional[np.ndarray]) -> Dict[str, Any]:
    """Compare ``got`` with the reference byte for byte: ``{"wrong": elements, ...first mismatch}``."""
    ref = expected(seed, k, op, rank, world)
    if ref is None:
        return {"wrong": 0}
    ref = np.ascontiguousarray(ref)
    if got is None or got.shape != ref.shape or got.dtype != ref.dtype:
        return {"wrong": int(ref.size), "why": f"shape/dtype {None if got is None else (got.shape, str(got.dtype))}"}
    item = ref.dtype.itemsize
    bad = np.ascontiguousarray(got).reshape(-1).view(np.uint8).reshape(-1, item) != \
        ref.reshape(-1).view(np.uint8).reshape(-1, item)
    wrong_idx = np.nonzero(bad.any(axis=1))[0]
    if not len(wrong_idx):
        return {"wrong": 0}
    i = int(wrong_idx[0])
    return {"wrong": int(len(wrong_idx)), "first": i, "got": str(got.reshape(-1)[i]),
            "want": str(ref.reshape(-1)[i])}


def counts_as(op: Op) -> Tuple[str, ...]:
    """The operation names one verified op counts as (a ring step is a send and a recv)."""
    return ("send", "recv") if op.kind == "ring" else (op.kind,)


__all__ = ["Op", "Step", "plan_step", "value", "expected", "post", "check", "counts_as", "COLLECTIVES",
           "OPERATIONS", "DTYPES", "MAX_BYTES", "dtype_of", "in_shape"]
