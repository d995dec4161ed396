"""Reduction operations and the dtypes they accept.

Half types (float16, bfloat16) are reduced through float32: the exact sum or
product of two half values, rounded once to the half type, is what float32
arithmetic rounded to half gives (float32 has more than 2p+2 bits), so results
equal a native half reduction while running ~50x faster in numpy.
"""

from __future__ import annotations

import enum
import threading
from typing import Callable, Dict

import numpy as np

from .errors import UnsupportedDtype

_BFLOAT16 = []


def bfloat16():
    """numpy's bfloat16 dtype (``ml_dtypes``), or None without it. Imported
    on first use, not with linkescape: importing ml_dtypes costs ~1.2 s of
    CPU, which every rank process of a numpy-only job paid at start."""
    if not _BFLOAT16:
        try:
            import ml_dtypes

            _BFLOAT16.append(np.dtype(ml_dtypes.bfloat16))
        except ImportError:  # pragma: no cover - ml_dtypes is a dependency
            _BFLOAT16.append(None)
    return _BFLOAT16[0]


def __getattr__(name: str):
    if name == "BFLOAT16":  # (the name it had when it was imported eagerly)
        return bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ReduceOp(enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


_UFUNC = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,
    ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}

Reducer = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


#: what is_half, signature_dtype and check_op found, per dtype and per (op, dtype): every operation
#: asks, and a job uses a few dtypes (bounded: a dtype past the bound is judged afresh each time)
_HALF: Dict[np.dtype, bool] = {}
_SIG_DTYPE: Dict[np.dtype, str] = {}
_CHECKED: set = set()
_MEMO_MAX = 256


def _kept(table: dict, key, value):
    """``value``, remembered under ``key`` while the table is below its bound."""
    if len(table) < _MEMO_MAX:
        table[key] = value
    return value


def _is_half(dtype: np.dtype) -> bool:
    # an array of bfloat16 exists only where ml_dtypes was imported already: its name says it
    return dtype == np.float16 or (dtype.kind == "V" and dtype.name == "bfloat16" and dtype == bfloat16())


def is_half(dtype: np.dtype) -> bool:
    half = _HALF.get(dtype)
    return half if half is not None else _kept(_HALF, dtype, _is_half(dtype))


def supported_dtype(dtype: np.dtype) -> bool:
    return dtype.kind in "biufc" or is_half(dtype)


def check_op(op: ReduceOp, dtype: np.dtype) -> None:
    """UnsupportedDtype unless ``op`` reduces ``dtype``."""
    try:
        if (op, dtype) in _CHECKED:
            return
    except TypeError:  # (not hashable: not a ReduceOp; _check_op says so)
        pass
    _check_op(op, dtype)
    if len(_CHECKED) < _MEMO_MAX:
        _CHECKED.add((op, dtype))


def _check_op(op: ReduceOp, dtype: np.dtype) -> None:
    if not isinstance(op, ReduceOp):
        raise UnsupportedDtype(f"{op!r} is not a linkescape.ReduceOp")
    if not supported_dtype(dtype):
        raise UnsupportedDtype(f"dtype {dtype} cannot be reduced")
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and dtype.kind not in "biu":
        raise UnsupportedDtype(f"{op.name} needs an integer or bool dtype, not {dtype}")
    if op in (ReduceOp.MIN, ReduceOp.MAX) and dtype.kind == "c":
        raise UnsupportedDtype(f"{op.name} is undefined for complex dtype {dtype}")
    if op is ReduceOp.AVG and dtype.kind == "b":
        raise UnsupportedDtype("AVG is undefined for bool")


def reducer(op: ReduceOp, dtype: np.dtype, max_elems: int) -> Reducer:
    """``f(out, a, b)`` computes ``out = a OP b`` elementwise, allocating nothing
    per call (half types widen through float32 scratch: up to
    ``_CACHED_HALF_ELEMS`` values, the calling thread's; more, the reducer's own)."""
    if is_half(dtype) and max_elems > _CACHED_HALF_ELEMS:
        check_op(op, dtype)
        return _make_reducer(op, dtype, max_elems)  # large scratch: not kept
    key = (op, dtype)
    red = _REDUCERS.get(key)
    if red is None:
        check_op(op, dtype)
        red = _make_reducer(op, dtype, 0)
        _REDUCERS[key] = red  # bounded: one per (op, dtype)
    return red


#: half-type reductions of up to this many values widen through the calling thread's scratch
#: (2 x 128 KiB, made on its first such reduction); larger ones bring their own, not kept
_CACHED_HALF_ELEMS = 1 << 15

#: reducers by (op, dtype): they hold no per-operation state and no scratch of their own, so one
#: serves every call of every communicator in the process. (They once kept scratch sized to the
#: calls that made them, one reducer per op, dtype and power of two: under chaos's random shapes
#: the cache grew for an hour, and two communicators shared the scratch across threads.)
_REDUCERS: Dict[tuple, Reducer] = {}

_scratch = threading.local()


def _thread_scratch() -> tuple:
    pair = getattr(_scratch, "pair", None)
    if pair is None:
        pair = _scratch.pair = (np.empty(_CACHED_HALF_ELEMS, np.float32), np.empty(_CACHED_HALF_ELEMS, np.float32))
    return pair


def _make_reducer(op: ReduceOp, dtype: np.dtype, own_elems: int) -> Reducer:
    """``own_elems`` > 0: a reducer with scratch of its own for that many values."""
    ufunc = _UFUNC[op]
    if not is_half(dtype):
        def native(out, a, b):
            ufunc(a, b, out=out)
        return native
    own = (np.empty(own_elems, np.float32), np.empty(own_elems, np.float32)) if own_elems > 0 else None

    def half(out, a, b):
        n = out.shape[0]
        s1, s2 = own if own is not None else _thread_scratch()
        x = s1[:n]
        y = s2[:n]
        x[...] = a  # exact widening
        y[...] = b
        ufunc(x, y, out=x)
        out[...] = x  # one rounding, to nearest even
    return half


def finish_avg(buf: np.ndarray, world_size: int) -> None:
    """AVG = SUM then divide, identically on every rank."""
    if world_size == 1:
        return
    if buf.dtype.kind == "i":
        # C semantics (truncation toward zero), as NCCL does for integers
        q = np.abs(buf) // world_size
        buf[...] = np.where(buf < 0, -q, q)
    elif buf.dtype.kind == "u":
        buf //= world_size
    elif is_half(buf.dtype):
        tmp = buf.astype(np.float32)
        tmp /= world_size
        buf[...] = tmp
    else:
        np.divide(buf, world_size, out=buf, casting="unsafe")


def signature_dtype(dtype: np.dtype) -> str:
    """What the ranks must agree on of a dtype (in the operation's signature)."""
    sig = _SIG_DTYPE.get(dtype)
    if sig is None:
        sig = _kept(_SIG_DTYPE, dtype, "bfloat16" if dtype.kind == "V" and is_half(dtype) else dtype.str)
    return sig


__all__ = ["ReduceOp", "reducer", "check_op", "finish_avg", "bfloat16", "is_half"]
