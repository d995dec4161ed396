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
import json
import os
import sys
import time
import traceback

import numpy as np

OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
       "sendrecv")


def say(**record) -> None:
    record.setdefault("t", time.time())
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def value(rank: int, it: int, count: int, dtype) -> np.ndarray:
    """Small integers: exact in every reduction, so any rank can check any result."""
    rng = np.random.default_rng([rank, it, count])
    return rng.integers(-8, 9, size=count).astype(dtype)


def run_op(comm, op: str, it: int, count: int, dtype) -> tuple:
    n, r = comm.world_size, comm.rank
    root = it % n
    if op == "all_reduce":
        buf = value(r, it, count, dtype)
        comm.all_reduce(buf)
        ref = sum(value(q, it, count, np.int64) for q in range(n)).astype(dtype)
        return buf, ref
    if op == "broadcast":
        buf = value(r, it, count, dtype)
        comm.broadcast(buf, root)
        return buf, value(root, it, count, dtype)
    if op == "reduce":
        buf = value(r, it, count, dtype)
        comm.reduce(buf, root)
        ref = sum(value(q, it, count, np.int64) for q in range(n)).astype(dtype) if r == root \
            else value(r, it, count, dtype)
        return buf, ref
    if op == "all_gather":
        out = np.empty((n, count), dtype)
        comm.all_gather(out, value(r, it, count, dtype))
        return out, np.stack([value(q, it, count, dtype) for q in range(n)])
    if op == "reduce_scatter":
        out = np.empty(count, dtype)
        comm.reduce_scatter(out, value(r, it, n * count, dtype).reshape(n, count))
        ref = sum(value(q, it, n * count, np.int64).reshape(n, count)[r] for q in range(n)).astype(dtype)
        return out, ref
    if op == "all_to_all":
        out = np.empty((n, count), dtype)
        comm.all_to_all(out, value(r, it, n * count, dtype).reshape(n, count))
        return out, np.stack([value(q, it, n * count, dtype).reshape(n, count)[r] for q in range(n)])
    if op == "gather":
        out = np.empty((n, count), dtype) if r == root else None
        comm.gather(out, value(r, it, count, dtype), root)
        if r != root:
            return np.zeros(1), np.zeros(1)
        return out, np.stack([value(q, it, count, dtype) for q in range(n)])
    if op == "scatter":
        out = np.empty(count, dtype)
        comm.scatter(out, value(r, it, n * count, dtype).reshape(n, count) if r == root else None, root)
        return out, value(root, it, n * count, dtype).reshape(n, count)[r]
    if op == "sendrecv":
        out = np.empty(count, dtype)
        w = comm.send(value(r, it, count, dtype), (r + 1) % n, tag=it, async_op=True)
        comm.recv(out, (r - 1) % n, tag=it)
        w.wait()
        return out, value((r - 1) % n, it, count, dtype)
    raise SystemExit(f"unknown op {op}")


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
                b = value(args.rank, 1000 + it * 10 + k, 4096, dtype)
                extra.append((b, comm.all_reduce(b, async_op=True), 1000 + it * 10 + k))
            out, ref = run_op(comm, args.op, it, args.count, dtype)
            for b, w, seed in extra:
                w.wait()
                ref2 = sum(value(q, seed, 4096, np.int64) for q in range(args.world)).astype(dtype)
                wrong += int(np.count_nonzero(b != ref2))
            dt = time.perf_counter() - t0
            bad = int(np.count_nonzero(out.view(np.uint8) != np.ascontiguousarray(ref).view(np.uint8)))
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
