"""What a benchmark run measures: sizes, operations, dtypes, bus-bandwidth factors.

Conventions follow nccl-tests (doc/PERFORMANCE.md there):

* ``size`` is the byte count of the largest buffer of the operation: the whole
  buffer for all_reduce/broadcast/reduce, the *output* for all_gather and
  gather, the *input* for reduce_scatter and scatter, the whole send buffer for
  all_to_all, the message for send_recv. Operations that split the buffer among
  the ranks round the per-rank part down to whole elements (at least one).
* ``algbw = size / time``; ``busbw = algbw * factor`` with factor
  2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter, all_to_all,
  gather and scatter, and 1 for broadcast, reduce and send_recv.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np


class SpecError(ValueError):
    """An invalid benchmark parameter (the CLI turns it into a usage error)."""


# ------------------------------------------------------------------ sizes
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"4"``, ``"64K"``, ``"256M"``, ``"1G"``, ``"64KiB"``, ``"1.5M"`` -> bytes (binary suffixes)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise SpecError(f"{text!r} is not a size (bytes, optionally with a K, M or G suffix)")
    value = float(m.group(1)) * _MULT[m.group(2).lower()]
    if value != int(value):
        raise SpecError(f"{text!r} is not a whole number of bytes")
    if value <= 0:
        raise SpecError(f"size {text!r} must be positive")
    return int(value)


def format_size(nbytes: int) -> str:
    for suffix, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{suffix}"
    return str(nbytes)


def parse_sizes(text: str, factor: float = 2.0) -> List[int]:
    """``MIN:MAX`` (multiplying by ``factor``, like nccl-tests -b/-e/-f), a
    comma-separated list ``16M,64M,256M``, or one size."""
    if factor is None or not factor > 1.0 or not math.isfinite(factor):
        raise SpecError(f"--factor must be a number greater than 1, not {factor!r}")
    text = str(text).strip()
    if not text:
        raise SpecError("no sizes given")
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 2:
            raise SpecError(f"{text!r}: a range is MIN:MAX, e.g. 4:256M")
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        if lo > hi:
            raise SpecError(f"{text!r}: MIN {lo} is larger than MAX {hi}")
        out = []
        size = lo
        while size <= hi:
            out.append(size)
            nxt = int(size * factor)
            size = nxt if nxt > size else size + 1
        if len(out) > 4096:
            raise SpecError(f"{text!r} with factor {factor} makes {len(out)} sizes; use a larger --factor")
        return out
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise SpecError("no sizes given")
    return sizes


# ------------------------------------------------------------------ operations
@dataclass(frozen=True)
class OpInfo:
    name: str
    #: bus bandwidth factor for n ranks
    factor: Callable[[int], float]
    #: the size is split among the ranks (n blocks of size/n)
    split: bool = False
    #: the op reduces (redop applies, results depend on it)
    reduces: bool = False
    rooted: bool = False
    min_ranks: int = 1
    #: has no buffer (one row, size 0)
    sizeless: bool = False


def _ring(n: int) -> float:
    return 2.0 * (n - 1) / n


def _part(n: int) -> float:
    return (n - 1) / n


def _one(n: int) -> float:
    return 1.0


OPS: Dict[str, OpInfo] = {
    "all_reduce": OpInfo("all_reduce", _ring, reduces=True),
    "broadcast": OpInfo("broadcast", _one, rooted=True),
    "reduce": OpInfo("reduce", _one, reduces=True, rooted=True),
    "all_gather": OpInfo("all_gather", _part, split=True),
    "reduce_scatter": OpInfo("reduce_scatter", _part, split=True, reduces=True),
    "all_to_all": OpInfo("all_to_all", _part, split=True),
    "gather": OpInfo("gather", _part, split=True, rooted=True),
    "scatter": OpInfo("scatter", _part, split=True, rooted=True),
    "send_recv": OpInfo("send_recv", _one, min_ranks=2),
    "barrier": OpInfo("barrier", _one, sizeless=True),
}
#: what ``all`` runs, in this order
ALL_OPS = tuple(OPS)

_ALIASES = {name.replace("_", ""): name for name in OPS}
_ALIASES.update({"alltoall": "all_to_all", "sendrecv": "send_recv", "p2p": "send_recv", "pingpong": "send_recv"})


def parse_ops(text: str) -> List[str]:
    """``all``, one op, or a comma-separated list; ``allreduce``/``all-reduce`` also work."""
    out: List[str] = []
    for part in str(text).split(","):
        key = part.strip().lower().replace("-", "_")
        if not key:
            continue
        if key == "all":
            names = list(ALL_OPS)
        elif key in OPS:
            names = [key]
        elif key.replace("_", "") in _ALIASES:
            names = [_ALIASES[key.replace("_", "")]]
        else:
            raise SpecError(f"unknown operation {part.strip()!r}; choose from all, {', '.join(OPS)}")
        out.extend(n for n in names if n not in out)
    if not out:
        raise SpecError("no operation given")
    return out


def busbw_factor(op: str, world_size: int) -> float:
    return OPS[op].factor(world_size)


def layout(op: str, size: int, itemsize: int, world_size: int) -> Tuple[int, int, int]:
    """(bytes, elements, elements per block) that a requested ``size`` becomes:
    whole elements, and for split ops a multiple of ``world_size`` blocks."""
    info = OPS[op]
    if info.sizeless:
        return 0, 0, 0
    if info.split:
        block = max(1, size // (itemsize * world_size))
        count = block * world_size
    else:
        count = block = max(1, size // itemsize)
    return count * itemsize, count, block


# ------------------------------------------------------------------ dtypes, reductions
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64")
REDOPS = ("sum", "prod", "min", "max", "avg")
BACKENDS = ("linkescape", "gloo", "mpi", "floor")
#: what the floor (bare Python over blocking sockets: floor.py) runs
FLOOR_OPS = ("all_reduce", "barrier", "send_recv")
FLOOR_REDOPS = ("sum", "prod", "min", "max")
#: what Open MPI reduces and carries here (numpy types mpi4py maps; MPI has no average)
MPI_DTYPES = ("float32", "float64", "int8", "uint8", "int32", "int64")
MPI_REDOPS = ("sum", "prod", "min", "max")


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def parse_backends(text: str) -> List[str]:
    out: List[str] = []
    for part in str(text).split(","):
        name = part.strip().lower()
        if not name:
            continue
        if name not in BACKENDS:
            raise SpecError(f"unknown backend {part.strip()!r}; choose from {', '.join(BACKENDS)}")
        if name in out:
            raise SpecError(f"backend {name!r} is named twice")
        out.append(name)
    if not out:
        raise SpecError("no backend given")
    return out


@dataclass
class BenchSpec:
    """Everything a rank needs to run the benchmark (sent to ranks as JSON)."""

    ops: List[str]
    sizes: List[int]
    backends: List[str] = field(default_factory=lambda: ["linkescape"])
    world_size: int = 2
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    iters: int = 20
    warmup: int = 5
    check: bool = True
    rails: List[str] = field(default_factory=lambda: ["127.0.0.1"])
    timeout: float = 300.0
    store: str = "tcp"  # tcp (torch TCPStore) or file (linkescape.FileStore)
    #: each timed call after a barrier of its backend (the first bucket of a step), not back to back
    isolated: bool = False
    #: the ranks wait for the launcher's turn before each (op, size): set when mpi runs beside them
    gated: bool = False

    def validate(self) -> "BenchSpec":
        if self.world_size < 1:
            raise SpecError(f"world size must be at least 1, not {self.world_size}")
        if self.iters < 1:
            raise SpecError(f"iters must be at least 1, not {self.iters}")
        if self.warmup < 0:
            raise SpecError(f"warmup must be >= 0, not {self.warmup}")
        if not 0 <= self.root < self.world_size:
            raise SpecError(f"root {self.root} is not a rank of a world of {self.world_size}")
        if self.dtype not in DTYPES:
            raise SpecError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        if self.redop not in REDOPS:
            raise SpecError(f"unknown reduction {self.redop!r}; choose from {', '.join(REDOPS)}")
        if not self.rails:
            raise SpecError("no rail given")
        if not self.timeout > 0:
            raise SpecError("timeout must be positive")
        for op in self.ops:
            if op not in OPS:
                raise SpecError(f"unknown operation {op!r}")
            if OPS[op].min_ranks > self.world_size and len(self.ops) == 1:
                raise SpecError(f"{op} needs at least {OPS[op].min_ranks} ranks (--world-size)")
        if self.redop == "avg" and self.dtype in ("int8", "uint8", "int32", "int64") and "gloo" in self.backends:
            raise SpecError("avg of integers is not comparable between linkescape and gloo; use a float dtype")
        if "floor" in self.backends:
            other = [op for op in self.ops if op not in FLOOR_OPS]
            if other:
                raise SpecError(f"backend floor runs {', '.join(FLOOR_OPS)} only, not {', '.join(other)}")
            if self.redop not in FLOOR_REDOPS:
                raise SpecError(f"backend floor: reduction {self.redop} is not one of {', '.join(FLOOR_REDOPS)}")
        if "mpi" in self.backends:
            if self.dtype not in MPI_DTYPES:
                raise SpecError(f"backend mpi: dtype {self.dtype} is not one of {', '.join(MPI_DTYPES)}")
            if self.redop not in MPI_REDOPS:
                raise SpecError(f"backend mpi: reduction {self.redop} is not one of {', '.join(MPI_REDOPS)}")
        return self

    def steps(self) -> List[Tuple[str, int]]:
        """Every (op, size) measured, in order (size 0 for barrier)."""
        return [(op, size) for op in self.runnable_ops() for size in ([0] if OPS[op].sizeless else self.sizes)]

    def python_backends(self) -> List[str]:
        """The backends that live in the benchmark's own rank processes (not Open MPI's)."""
        return [b for b in self.backends if b != "mpi"]

    def runnable_ops(self) -> List[str]:
        return [op for op in self.ops if OPS[op].min_ranks <= self.world_size]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "BenchSpec":
        return cls(**data)


def tcp_congestion_control() -> Optional[str]:
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip() or None
    except OSError:
        return None
