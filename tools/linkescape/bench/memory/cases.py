"""The memory benchmark's cases: what a rank calls, on which buffers, and how many times.

A :class:`Case` names one way a job uses the communicator: the API (numpy's
``Communicator`` or the torch backend), the call, the size of its largest
buffer (as ``linkescape bench`` counts it: the output of all_gather and
gather, the input of reduce_scatter and scatter, the whole buffer
otherwise), sync or async (``depth`` calls in flight, waited out of order),
the policy, and the condition (``healthy``, or ``cuts``: real carrier losses
of one rail on a testbed, again and again). Every case runs twice: with
buffers allocated afresh for every call, and with the same buffers reused
(the control).

:func:`matrix` is the whole set; :func:`select` picks cases by words of
their names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, List, Sequence

KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
         "barrier", "sendrecv")
SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
APIS = ("numpy", "torch")
MODES = ("sync", "async")
POLICIES = ("active-backup", "stripe")
CONDITIONS = ("healthy", "cuts")
#: measured operations per size (the warm-up is a quarter more): about 10-20 s per run on 2 cores
OPS_BY_SIZE = {4 << 10: 20000, 64 << 10: 12000, 1 << 20: 5000, 4 << 20: 2500, 16 << 20: 640, 64 << 20: 160}
#: calls in flight in an async case
DEPTH = 8


def size_text(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


@dataclass(frozen=True)
class Case:
    api: str = "numpy"
    kind: str = "all_reduce"
    nbytes: int = 4 << 20
    mode: str = "sync"
    policy: str = "active-backup"
    condition: str = "healthy"
    #: measured operations (the samples are taken over these), and the warm-up before them
    ops: int = 0
    warmup: int = 0
    #: RSS sampled every this many operations
    every: int = 0
    depth: int = 1

    @property
    def name(self) -> str:
        size = "-" if self.kind == "barrier" else size_text(self.nbytes)
        mode = f"async{self.depth}" if self.mode == "async" else "sync"
        return f"{self.api} {self.kind} {size} {mode} {self.policy} {self.condition}"

    def step_bytes(self, world: int) -> int:
        """Bytes of fresh buffers one step allocates on a rank (a step: one call, or ``depth`` in flight)."""
        if self.kind == "barrier":
            return 0
        per_call = {"all_reduce": 1, "broadcast": 1, "reduce": 1, "sendrecv": 2}.get(self.kind)
        if per_call is None:  # an input and an output, one of them a world-th of the size
            per_call = 1 + 1 / world
        return int(self.nbytes * per_call * self.depth)


def sized(case: Case, scale: float = 1.0) -> Case:
    """``case`` with its operation counts (``OPS_BY_SIZE`` times ``scale``), warm-up and sampling step."""
    base = OPS_BY_SIZE.get(case.nbytes) or max(160, int(OPS_BY_SIZE[4 << 20] * (4 << 20) / case.nbytes))
    if case.kind == "barrier":
        base = OPS_BY_SIZE[4 << 10]
    depth = DEPTH if case.mode == "async" else 1
    if case.mode == "async" and case.nbytes >= 64 << 20:
        depth = 4
    ops = max(20 * depth, int(base * scale))
    every = max(depth, (ops // 20) // depth * depth)  # 20 samples after the warm-up
    ops = every * 20
    warmup = max(2 * depth, (ops // 4) // depth * depth)
    return dataclasses.replace(case, ops=ops, warmup=warmup, every=every, depth=depth)


def matrix(scale: float = 1.0) -> List[Case]:
    """Every shape a job uses, and each against its control.

    * numpy all_reduce at every size, sync and async; with ``stripe``, sync, and async at 4 MiB;
    * every call (collectives, barrier, send/recv) at 4 MiB, sync and async; at 64 KiB, sync;
    * the torch backend with fresh tensors: all_reduce at every size, every call at 4 MiB, async all_reduce;
    * across real cuts (testbed): all_reduce at 64 KiB, 4 MiB and 64 MiB, sync and async at 4 MiB,
      both policies, a few other calls, the torch backend.
    """
    out: List[Case] = []
    for mode in MODES:
        out += [Case(nbytes=n, mode=mode) for n in SIZES]
    out += [Case(nbytes=n, policy="stripe") for n in SIZES] + [Case(mode="async", policy="stripe")]
    for mode in MODES:
        out += [Case(kind=k, mode=mode) for k in KINDS if k != "all_reduce"]
    out += [Case(kind=k, nbytes=64 << 10) for k in KINDS if k not in ("all_reduce", "barrier")]
    out += [Case(api="torch", nbytes=n) for n in SIZES]
    out += [Case(api="torch", kind=k) for k in KINDS if k != "all_reduce"]
    out += [Case(api="torch", mode="async")]
    for policy in POLICIES:
        out += [Case(nbytes=n, policy=policy, condition="cuts") for n in (64 << 10, 4 << 20, 64 << 20)]
        out += [Case(mode="async", policy=policy, condition="cuts")]
    out += [Case(kind=k, condition="cuts") for k in ("all_to_all", "sendrecv", "broadcast")]
    out += [Case(api="torch", condition="cuts")]
    return [sized(c, scale) for c in out]


#: the subset the test runs (``--memory quick``): a few seconds a run
QUICK = (Case(mode="async"), Case(kind="all_to_all", nbytes=64 << 10), Case(kind="sendrecv", nbytes=1 << 20,
                                                                              policy="stripe"))


def quick(scale: float = 0.2) -> List[Case]:
    return [sized(c, scale) for c in QUICK]


def select(cases: Iterable[Case], words: Sequence[str]) -> List[Case]:
    """The cases whose name has every one of ``words`` among its fields (``torch``, ``4M``, ``async``...)."""
    words = [w.strip() for w in words if w.strip()]
    out = []
    for c in cases:
        fields = set(c.name.split()) | {c.mode}
        if all(w in fields for w in words):
            out.append(c)
    return out


__all__ = ["Case", "KINDS", "SIZES", "APIS", "MODES", "POLICIES", "CONDITIONS", "matrix", "quick", "select", "sized",
           "size_text"]
