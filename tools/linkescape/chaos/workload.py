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

from ..testbed import exact
from ..testbed.exact import dtype_of, in_shape as _in_shape

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
        return per * world if self.kind in exact.PER_RANK_BUFFER else per


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
    per = dtype_of(dtype).itemsize * (world if kind in exact.PER_RANK_BUFFER else 1)
    return max(1, int(nbytes // per))


def _reduce_op(rng: np.random.Generator, kind: str, dtype: str) -> str:
    if kind not in REDUCED:
        return "SUM"
    choices = ["SUM", "SUM", "MAX", "MIN"] + (["BXOR"] if dtype_of(dtype).kind in "iu" else [])
    return str(rng.choice(choices))


# ------------------------------------------------------------ values
def inputs(seed: int, k: int, op: Op, shape: Tuple[int, ...]) -> exact.Inputs:
    """Every rank's input of ``op`` in step ``k`` (small integers as int64, see :mod:`linkescape.testbed.exact`)."""
    unsigned = dtype_of(op.dtype).kind == "u"
    return lambda rank: exact.ints([seed, k, op.salt, rank, 0x5652], shape, unsigned=unsigned)


def value(seed: int, k: int, op: Op, rank: int, shape: Tuple[int, ...]) -> np.ndarray:
    """Rank ``rank``'s input of ``op`` in step ``k``, in the op's dtype."""
    return exact.cast(inputs(seed, k, op, shape)(rank), op.dtype)


def in_shape(op: Op, world: int) -> Tuple[int, ...]:
    return _in_shape(op.kind, op.count, world)


def expected(seed: int, k: int, op: Op, rank: int, world: int) -> Optional[np.ndarray]:
    """What rank ``rank`` must hold after ``op``; None where the call leaves nothing to check."""
    shape = in_shape(op, world)
    return exact.expected(op.kind, rank, world, inputs(seed, k, op, shape), op.dtype, root=op.root, op=op.op,
                          shift=op.peer_shift)


# ------------------------------------------------------------ running
def post(comm, seed: int, k: int, op: Op, async_op: bool) -> Tuple[List[Any], Optional[np.ndarray]]:
    """Start ``op`` on ``comm``; returns the works (empty when blocking) and the buffer to check."""
    mine = value(seed, k, op, comm.rank, in_shape(op, comm.world_size))
    return exact.post(comm, op.kind, mine, root=op.root, op=op.op, shift=op.peer_shift, tag=k % 65536,
                      async_op=async_op)


def check(seed: int, k: int, op: Op, rank: int, world: int, got: Optional[np.ndarray]) -> Dict[str, Any]:
    """Compare ``got`` with the reference byte for byte: ``{"wrong": elements, ...first mismatch}``."""
    return exact.compare(got, expected(seed, k, op, rank, world))


#: collectives whose root alone needs every rank (the others need the root: its data, or its ack)
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def waits_for(step: Step, rank: int, world: int) -> List[int]:
    """The other ranks whose calls ``rank``'s part of ``step`` cannot complete without: every rank
    for a symmetric collective or a barrier, and for the root of a rooted one; the root for the
    others of a rooted one; the rank it receives from in a ring. (A lower bound: a broadcast's tree
    may also wait for ranks between; the stall judge takes a step's start from the last of these.)"""
    need: set = set()
    for op in step.ops:
        if op.kind == "ring":
            need.add((rank - op.peer_shift) % world)
        elif op.kind in ROOTED and op.root != rank:
            need.add(op.root)
        else:
            need.update(range(world))
    need.discard(rank)
    return sorted(need)


def counts_as(op: Op) -> Tuple[str, ...]:
    """The operation names one verified op counts as (a ring step is a send and a recv)."""
    return ("send", "recv") if op.kind == "ring" else (op.kind,)


__all__ = ["Op", "Step", "plan_step", "value", "expected", "post", "check", "counts_as", "waits_for", "COLLECTIVES",
           "OPERATIONS", "DTYPES", "MAX_BYTES", "dtype_of", "in_shape"]
