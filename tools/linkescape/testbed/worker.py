"""One rank of a workload on the testbed, for fault tests and the failover benchmark.

``python -m linkescape.testbed.worker --rank R --world N --store DIR --op all_reduce ...``
runs ``--iters`` operations on inputs every rank can recompute, checks every
result bit for bit against an exact numpy reference, and prints JSON lines:
``ready``, ``start``/``done`` per iteration (with wall times), and ``exit`` with
the number of wrong results and the error, if any.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import traceback

import numpy as np

from ..common.jsonl import say
from . import exact

OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
       "sendrecv")


def inputs(it: int, shape) -> exact.Inputs:
    """Every rank's input of iteration ``it`` (small integers: exact in every reduction)."""
    return lambda rank: exact.ints([rank, it, int(np.prod(shape))], shape)


def run_op(comm, op: str, it: int, count: int, dtype) -> tuple:
    """Run ``op`` (root: ``it`` mod world); returns (what this rank holds, what it must hold)."""
    n, r = comm.world_size, comm.rank
    kind = "ring" if op == "sendrecv" else op  # sendrecv: to rank + 1, from rank - 1
    shape = exact.in_shape(kind, count, n)
    values = inputs(it, shape)
    works, out = exact.post(comm, kind, exact.cast(values(r), dtype), root=it % n, tag=it)
    for w in works:
        w.wait()
    ref = exact.expected(kind, r, n, values, dtype, root=it % n)
    if ref is None:  # a gather's non-root holds nothing
        return np.zeros(1), np.zeros(1)
    return out, ref


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--op", default="all_reduce", choices=OPS)
    p.add_argument("--count", type=int, default=1 << 20)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--gap", type=float, default=0.0, help="idle seconds between operations")
    p.add_argument("--duration", type=float, default=0.0, help="run until this many seconds passed")
    p.add_argument("--async-depth", type=int, default=0, help="also keep this many async all_reduces in flight")
    args = p.parse_args(argv)
    import faulthandler
    import signal

    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the controller asks before killing a hung rank

    from linkescape import Communicator, FileStore

    dtype = np.dtype(args.dtype)
    wrong = 0
    error = None
    digest = hashlib.sha256()
    try:
        comm = Communicator(FileStore(args.store, timeout=60), args.rank, args.world)
        say(event="ready", rank=args.rank, rails=comm.rails)
        t_end = time.time() + args.duration if args.duration else None
        it = 0
        while (t_end is None and it < args.iters) or (t_end is not None and not _time_up(comm, t_end)):
            say(event="start", iter=it)
            t0 = time.perf_counter()
            extra = []
            for k in range(args.async_depth):
                values = inputs(1000 + it * 10 + k, (4096,))
                b = exact.cast(values(args.rank), dtype)
                extra.append((b, comm.all_reduce(b, async_op=True), values))
            out, ref = run_op(comm, args.op, it, args.count, dtype)
            for b, w, values in extra:
                w.wait()
                wrong += exact.count_wrong(b, exact.expected("all_reduce", args.rank, args.world, values, dtype))
            dt = time.perf_counter() - t0
            bad = exact.count_wrong(out, ref)
            wrong += bad
            digest.update(out.tobytes())
            say(event="done", iter=it, dt=dt, wrong=bad, nbytes=int(out.nbytes))
            it += 1
            if args.gap:
                time.sleep(args.gap)
        comm.barrier()
        comm.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the controller
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    say(event="exit", rank=args.rank, wrong=wrong, error=error, error_type=None if error is None else error.split(":")[0],
        digest=digest.hexdigest())
    sys.stdout.flush()
    os._exit(0 if error is None and wrong == 0 else 1)


def _time_up(comm, t_end: float) -> bool:
    """Every rank stops after the same iteration: a rank that decided alone
    would post a barrier where its peer posts another operation."""
    flag = np.array([time.time() >= t_end], np.int32)
    from linkescape import ReduceOp

    comm.all_reduce(flag, ReduceOp.MAX)
    return bool(flag[0])


if __name__ == "__main__":
    sys.exit(main())
