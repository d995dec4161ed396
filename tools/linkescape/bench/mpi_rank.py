"""One Open MPI rank of ``linkescape bench --backend ...,mpi`` (started by ``mpirun``).

Run as a script, not a module, so that it needs only ``mpi4py`` and ``numpy``:
``mpirun ... PYTHON .../linkescape/bench/mpi_rank.py --spec JSON``. Where
PYTHON can import linkescape too (the project's virtual environment with the
``mpi`` extra), the buffers and the check of the results are those of the
other backends (``linkescape.bench.cases``); with a Python that has only
mpi4py and numpy (Debian's ``python3-mpi4py``), the buffers are zeros and
``#wrong`` reads N/A.

The launcher takes turns with the other backends' ranks: before each
(operation, size) step, rank 0 waits for a line on its standard input (mpirun
passes the launcher's to rank 0), and every rank waits in a non-blocking
barrier it tests every ``GATE_POLL_S`` (a blocking MPI call would spin and
take the CPU from the backends measured meanwhile). Then the measurement is
the runner's (``runner.Rank.measure``): one checked run, warm-up, a barrier,
``iters`` timed calls back to back (or, with ``isolated``, each after a
barrier), and per call the process's CPU time and context switches
(getrusage). Rank 0 writes one JSON line per step, prefixed ``EVENT_PREFIX``,
with every rank's times; the launcher builds the record as for the others.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time

EVENT_PREFIX = "@@linkescape-bench-mpi "
GATE_POLL_S = 0.02
SIZELESS = ("barrier",)
SPLIT = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")


def emit(event: dict) -> None:
    sys.stdout.write(EVENT_PREFIX + json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw


class ZeroCase:
    """Buffers of the right shapes, zeros, no check (a Python without linkescape)."""

    def __init__(self, op: str, rank: int, n: int, size: int, dtype: str, redop: str, root: int) -> None:
        import numpy as np

        dt = np.dtype(dtype)
        self.op, self.rank, self.n, self.root = op, rank, n, root
        if op in SIZELESS:
            count = block = 0
        elif op in SPLIT:
            block = max(1, size // (dt.itemsize * n))
            count = block * n
        else:
            count = block = max(1, size // dt.itemsize)
        self.nbytes, self.count, self.block = count * dt.itemsize, count, block
        z = lambda *shape: np.zeros(shape, dt)  # noqa: E731
        a = {"buf": None, "inp": None, "out": None, "tmp": None}
        if op in ("all_reduce", "reduce", "broadcast"):
            a["buf"] = z(count)
        elif op in ("all_gather", "all_to_all"):
            a["inp"], a["out"] = z(block) if op == "all_gather" else z(n, block), z(n, block)
        elif op == "gather":
            a["inp"], a["out"] = z(block), z(n, block) if rank == root else None
        elif op == "scatter":
            a["inp"], a["out"] = z(n, block) if rank == root else None, z(block)
        elif op == "reduce_scatter":
            a["inp"], a["out"] = z(n, block), z(block)
        elif op == "send_recv":
            a["buf"] = z(count) if rank == 0 else None
            a["tmp"] = z(count) if rank in (0, 1) else None
        self.arrays = a

    def check(self):
        return None

    def settle(self) -> None:
        pass


def make_case(spec: dict, op: str, rank: int, n: int, size: int):
    try:
        from linkescape.bench.cases import Case
    except Exception:  # noqa: BLE001 - a Python without linkescape or its dependencies
        return ZeroCase(op, rank, n, size, spec["dtype"], spec["redop"], spec["root"])
    return Case(op, rank, n, size, spec["dtype"], spec["redop"], spec["root"])


def call_of(MPI, comm, case, redop: str, root: int):
    """The operation once, on the case's buffers, as a zero-argument function."""
    a, op, rank = case.arrays, case.op, case.rank
    mop = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}.get(redop)
    if op == "barrier":
        return comm.Barrier
    if op == "all_reduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, a["buf"], mop)
    if op == "broadcast":
        return lambda: comm.Bcast(a["buf"], root)
    if op == "reduce":
        if rank == root:
            return lambda: comm.Reduce(MPI.IN_PLACE, a["buf"], mop, root)
        return lambda: comm.Reduce(a["buf"], None, mop, root)
    if op == "all_gather":
        return lambda: comm.Allgather(a["inp"], a["out"])
    if op == "reduce_scatter":
        return lambda: comm.Reduce_scatter_block(a["inp"], a["out"], mop)
    if op == "all_to_all":
        return lambda: comm.Alltoall(a["inp"], a["out"])
    if op == "gather":
        return lambda: comm.Gather(a["inp"], a["out"], root)
    if op == "scatter":
        return lambda: comm.Scatter(a["inp"], a["out"], root)
    if op == "send_recv":
        if rank == 0:
            def ping():
                comm.Send(a["buf"], 1)
                comm.Recv(a["tmp"], 1)
            return ping
        if rank == 1:
            def pong():
                comm.Recv(a["tmp"], 0)
                comm.Send(a["tmp"], 0)
            return pong
        return lambda: None
    raise ValueError(f"unknown operation {op!r}")


def gate(MPI, comm) -> bool:
    """Waits for the launcher's turn (a line on rank 0's stdin); False at its end."""
    go = 1
    if comm.rank == 0:
        go = 1 if sys.stdin.readline().strip() == "go" else 0
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(GATE_POLL_S)
    flag = comm.bcast(go, root=0)
    return bool(flag)


def measure(MPI, comm, spec: dict, op: str, size: int) -> None:
    rank, n = comm.rank, comm.size
    case = make_case(spec, op, rank, n, size)
    call = call_of(MPI, comm, case, spec["redop"], spec["root"])
    wrong = None
    if spec["check"]:
        call()
        wrong = case.check()
        case.settle()
    for _ in range(spec["warmup"]):
        call()
    gc.collect()
    comm.Barrier()
    times = []
    clock = time.perf_counter
    if spec.get("isolated"):
        cpu = vcsw = ivcsw = 0.0
        for _ in range(spec["iters"]):
            comm.Barrier()
            u0 = usage()
            t0 = clock()
            call()
            t1 = clock()
            u1 = usage()
            times.append(t1 - t0)
            cpu, vcsw, ivcsw = cpu + u1[0] - u0[0], vcsw + u1[1] - u0[1], ivcsw + u1[2] - u0[2]
    else:
        u0 = usage()
        t0 = clock()
        for _ in range(spec["iters"]):
            call()
            t1 = clock()
            times.append(t1 - t0)
            t0 = t1
        u1 = usage()
        cpu, vcsw, ivcsw = u1[0] - u0[0], u1[1] - u0[1], u1[2] - u0[2]
    if op == "send_recv":
        times = [t / 2 for t in times]  # one way of the round trip
    k = spec["iters"]
    mine = {"times": times, "wrong": wrong, "cpu": cpu / k, "vcsw": vcsw / k, "ivcsw": ivcsw / k}
    every = comm.gather(mine, root=0)
    if rank == 0:
        emit({"event": "result", "op": op, "size": size, "nbytes": case.nbytes, "count": case.count,
              "ranks": every})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mpi_rank.py")
    ap.add_argument("--spec", required=True, help="the BenchSpec as JSON")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec)
    from mpi4py import MPI

    import numpy as np

    np.seterr(all="ignore")
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        emit({"event": "ready", "world_size": comm.size, "library": MPI.Get_library_version().splitlines()[0].strip(),
              "python": sys.executable})
    for op in spec["ops"]:
        if op == "send_recv" and comm.size < 2:
            continue
        for size in ([0] if op in SIZELESS else spec["sizes"]):
            if not gate(MPI, comm):
                return 0  # the launcher ended the run
            measure(MPI, comm, spec, op, size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
