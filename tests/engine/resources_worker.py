"""One rank of the bounded-resources test (run inside a testbed host).

Prints JSON lines: ``warm`` and ``end`` with the fds, threads and RSS of the
process, then ``closed`` after ``Communicator.close()``."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np


def state() -> dict:
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"fds": fds, "threads": sorted(t.name for t in threading.enumerate()), "rss": rss}


def say(**rec) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def main() -> None:
    rank, world, store, iters = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    from linkescape import Communicator, FileStore, ReduceOp

    before = state()
    comm = Communicator(FileStore(store, timeout=60), rank, world)
    wrong = 0

    def step(i: int) -> None:
        nonlocal wrong
        buf = np.full(1 << 18, rank + i, np.int32)  # a fresh 1 MiB buffer every time
        comm.all_reduce(buf)
        wrong += int(np.count_nonzero(buf != sum(r + i for r in range(world))))

    for i in range(300):
        step(i)
    say(event="warm", **state())
    i = 300
    while True:
        step(i)
        i += 1
        if i % 50 == 0:  # stop together, once both did their share and the faults are over
            flag = np.array([i >= iters and os.path.exists(os.path.join(store, "stop"))], np.int32)
            comm.all_reduce(flag, ReduceOp.MIN)
            if flag[0]:
                break
    time.sleep(1.5)  # dial threads of the last repairs end
    say(event="end", wrong=wrong, iters=i, **state())
    comm.close()
    time.sleep(0.5)
    say(event="closed", before=before, **state())


if __name__ == "__main__":
    main()
