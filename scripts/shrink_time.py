#!/usr/bin/env python3
"""How long Communicator.shrink takes, by world size, on loopback (docs/torchft.md, "Shrink").

Each run: N ranks on 127.0.0.1, one all_reduce, then one rank (the middle one) is killed
(SIGKILL); each survivor's next all_reduce fails (PeerLost), it calls ``shrink([victim])`` and
makes one all_reduce of 4 bytes on the new group. Per run, the slowest survivor's

- ``shrink_ms``: the ``shrink`` call itself, wall time (with N ranks on 2 cores, mostly the
  time the rank waits for a core);
- ``shrink_cpu_ms``: the CPU time of that call on its thread (the survivors' median): its cost;
- ``ready_ms``: from its ``shrink`` call to its first all_reduce on the new group done (the
  group works; includes waiting for the survivors that shrink later than it).

Prints one JSON line per world size: the median of ``--repeat`` runs, the runs, and the load.

``--one-at-a-time``: the survivors shrink in turn, ``--gap`` apart (after every rank has seen the
victim gone), so that one call's wall time is not the wait for a core that the N - 2 other
survivors, shrinking at the same moment on 2 cores, hold: the call's own time, by N.

    python scripts/shrink_time.py --ranks 4 8 16 32 --repeat 5
    python scripts/shrink_time.py --ranks 4 8 16 32 --repeat 5 --one-at-a-time
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import time

import numpy as np

from linkescape import LinkEscapeError, ReduceOp
from linkescape.testing import RankError, run_ranks


def _rank(comm, victim, gap=0.0):
    comm.all_reduce(np.ones(4, np.float32))
    # one reference time for every rank (the latest clock): turns are counted from it
    base = np.array([time.time()], np.float64)
    comm.all_reduce(base, op=ReduceOp.MAX)
    if comm.rank == victim:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    killed = time.time()
    try:
        comm.all_reduce(np.ones(4, np.float32))
    except LinkEscapeError:
        pass
    failed = time.time() - killed
    if gap:
        turn = comm.rank - (comm.rank > victim)
        time.sleep(max(0.0, base[0] + 3.0 + turn * gap - time.time()))
    t0, c0 = time.perf_counter(), time.thread_time()
    new = comm.shrink([victim])
    t1, c1 = time.perf_counter(), time.thread_time()
    buf = np.ones(1, np.float32)
    new.all_reduce(buf)
    t2 = time.perf_counter()
    assert buf[0] == comm.world_size - 1
    new.close()
    return {"shrink_s": t1 - t0, "shrink_cpu_s": c1 - c0, "ready_s": t2 - t0, "failed_s": failed}


def measure(n: int, repeat: int, gap: float = 0.0) -> dict:
    runs = []
    for _ in range(repeat):
        out = run_ranks(n, _rank, n // 2, gap, timeout=300)
        surv = [o for o in out if not isinstance(o, RankError)]
        bad = [o for o in surv if isinstance(o, BaseException)]
        if bad:
            raise bad[0]
        runs.append({"shrink_ms": round(max(o["shrink_s"] for o in surv) * 1e3, 2),
                     "shrink_cpu_ms": round(statistics.median(o["shrink_cpu_s"] for o in surv) * 1e3, 3),
                     "ready_ms": round(max(o["ready_s"] for o in surv) * 1e3, 1)})
    return {"ranks": n, "one_at_a_time": bool(gap), "shrink_ms_median": statistics.median(r["shrink_ms"] for r in runs),
            "shrink_cpu_ms_median": statistics.median(r["shrink_cpu_ms"] for r in runs),
            "ready_ms_median": statistics.median(r["ready_ms"] for r in runs), "runs": runs,
            "load1": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--one-at-a-time", action="store_true", help="the survivors shrink in turn, --gap apart")
    ap.add_argument("--gap", type=float, default=0.05, help="seconds between two survivors' turns")
    args = ap.parse_args()
    for n in args.ranks:
        print(json.dumps(measure(n, args.repeat, args.gap if args.one_at_a_time else 0.0)), flush=True)


if __name__ == "__main__":
    main()
