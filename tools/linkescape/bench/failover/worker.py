"""One rank of the failover benchmark's workload: all_reduces in a loop, every result checked.

``python -m linkescape.bench.failover.worker --rank R --world N --store DIR ...``
keeps ``--depth`` asynchronous all_reduces in flight until the ranks agree to
stop (the stop file appears or ``--duration`` passes), checks every result
bit for bit against a precomputed exact reference, and prints JSON lines:
``ready``, ``done`` (per iteration: completion wall time ``t``, ``wrong``),
``links`` (bytes per rail and per peer), ``exit`` (iterations, wrong elements, error).
``--depth 1`` is a plain loop of blocking all_reduces (the rate phases).

The ranks stop together: every iteration carries a tiny companion
all_reduce of each rank's "want to stop" flag, so all ranks see the same sum
for the same iteration and leave the loop at the same point (a per-rank clock
would let one rank start a collective the others never join).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from typing import List

import numpy as np

from ...common.jsonl import say
from ...testbed import exact


def pattern(k: int, count: int) -> exact.Inputs:
    """Every rank's input ``k`` (small integers: every sum is exact, so results are checked bit for bit)."""
    return lambda rank: exact.ints([rank, k, count, 7], count)


def _rail_bytes(comm) -> list:
    """Bytes per rail (public API; diagnostics only)."""
    try:
        return comm.rail_bytes()
    except Exception:  # noqa: BLE001 - diagnostics only
        return []


def _peer_bytes(comm) -> dict:
    """Bytes sent to and received from each peer over the run, every rail (public API; diagnostics and
    the analysis's "does this pair exchange the job's data" only)."""
    try:
        peers = comm.snapshot()["peers"]
        return {str(p): sum(int(link["bytes_sent"]) + int(link["bytes_received"]) for link in v["links"])
                for p, v in peers.items()}
    except Exception:  # noqa: BLE001 - diagnostics only
        return {}


def run_rank(args) -> int:
    import faulthandler

    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the controller asks before killing a hung rank

    from linkescape import Communicator, FileStore

    dtype = np.dtype(args.dtype)
    n, count, depth = args.world, args.count, max(1, args.depth)
    npat = 4
    patterns = [pattern(k, count) for k in range(npat)]
    inputs = [exact.cast(p(args.rank), dtype) for p in patterns]
    refs = [exact.expected("all_reduce", args.rank, n, p, dtype) for p in patterns]
    bufs = [np.empty(count, dtype) for _ in range(depth)]
    flags = [np.zeros(1, np.int32) for _ in range(depth)]
    wrong = 0
    iters = 0
    error = None
    comm = None
    t_end = time.time() + args.duration
    try:
        comm = Communicator(FileStore(args.store, timeout=60), args.rank, n)
        say(event="ready", rank=args.rank, rails=comm.rails, nbytes=int(count * dtype.itemsize))
        inflight: List[tuple] = []  # (iteration, slot, work, flag work)
        posted = 0
        stop = False
        while True:
            while not stop and len(inflight) < depth:
                slot = posted % depth
                buf = bufs[slot]
                np.copyto(buf, inputs[posted % npat])
                want = time.time() >= t_end or (args.stop_file and os.path.exists(args.stop_file))
                flags[slot][0] = 1 if want else 0
                w = comm.all_reduce(buf, async_op=True)
                wf = comm.all_reduce(flags[slot], async_op=True)
                inflight.append((posted, slot, w, wf))
                posted += 1
            if not inflight:
                break
            it, slot, w, wf = inflight.pop(0)
            w.wait()
            wf.wait()
            t = time.time()
            bad = exact.count_wrong(bufs[slot], refs[it % npat])
            wrong += bad
            iters += 1
            say(event="done", iter=it, t=t, wrong=bad)
            if flags[slot][0] > 0:
                stop = True  # every rank sees the same sum here: all stop after the same iteration
        comm.barrier()
        say(event="links", rails=_rail_bytes(comm), peers=_peer_bytes(comm))
        comm.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the controller
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    say(event="exit", rank=args.rank, wrong=wrong, iters=iters, error=error,
        error_type=None if error is None else error.split(":")[0])
    sys.stdout.flush()
    os._exit(0 if error is None and wrong == 0 else 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--count", type=int, default=4 << 20, help="float32 elements per all_reduce")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--depth", type=int, default=2, help="all_reduces kept in flight")
    p.add_argument("--duration", type=float, default=600.0, help="stop after this many seconds at the latest")
    p.add_argument("--stop-file", default=None, help="stop (all ranks together) once this file exists")
    return run_rank(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
