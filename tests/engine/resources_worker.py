"""One rank of the bounded-resources tests.

``resources_worker.py RANK WORLD STORE ITERS``: the cut-cycle test (run
inside a testbed host). A fresh 1 MiB buffer every all_reduce until ITERS
operations are done and the stop file exists. Prints JSON lines: ``warm`` and
``end`` with the fds, threads and RSS of the process, then ``closed`` after
``Communicator.close()``.

``resources_worker.py RANK WORLD STORE ITERS --series fresh|reused``: the
memory series (loopback rails, from ``LINKESCAPE_RAILS``). ITERS all_reduces
of ``--nbytes`` float32 after ``--warmup`` more, each on a freshly allocated
buffer (``buf = base + (i % 97) + rank``, the issue's loop) or, for the
control, the same values written into one reused buffer. RSS is sampled every
``--every`` operations after the warm-up. Prints ``series`` (``ops``, ``rss``:
the samples; ``wrong``: elements that differ from the exact sum), then
``closed``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import numpy as np


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def state() -> dict:
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return {"fds": fds, "threads": sorted(t.name for t in threading.enumerate()), "rss": rss()}


def say(**rec) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def cycles(rank: int, world: int, store: str, iters: int) -> None:
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
    # every link back before the count: the re-dial after the last repair may still be under way on a
    # loaded machine (make soak runs this beside other tests: once rank 0 counted 2 sockets fewer)
    up_by = time.monotonic() + 20
    while True:
        links = [link for info in comm.snapshot()["peers"].values() for link in info["links"]]
        links_up = bool(links) and all(link["usable"] for link in links)
        if links_up or time.monotonic() > up_by:
            break
        time.sleep(0.05)
    time.sleep(1.5)  # dial threads of the last repairs end
    say(event="end", wrong=wrong, iters=i, links_up=links_up, **state())
    comm.close()
    time.sleep(0.5)
    say(event="closed", before=before, **state())


def series(rank: int, world: int, store: str, iters: int, mode: str, nbytes: int, warmup: int, every: int) -> None:
    from linkescape import Communicator, FileStore

    comm = Communicator(FileStore(store, timeout=60), rank, world)
    base = (np.arange(nbytes // 4) % 1024).astype(np.float32)  # exact in float32, and so are the sums
    reused = np.empty_like(base)
    shift = sum(range(world))
    ops, samples, wrong = [], [], 0
    t0 = None
    for i in range(warmup + iters):
        if i == warmup:
            t0 = time.perf_counter()
        if mode == "fresh":
            # a new array every operation, as a training step's tensors (the issue's
            # ``base + (i % 97) + rank``, with one temporary instead of two)
            buf = base + ((i % 97) + rank)
        else:
            buf = np.add(base, (i % 97) + rank, out=reused)  # the same values, into the same memory
        comm.all_reduce(buf)
        want = world * (i % 97) + shift
        if buf[0] != want or buf[-1] != base[-1] * world + want:
            wrong += 1
        elif i % 251 == 0:  # now and then the whole buffer
            wrong += int(np.count_nonzero(buf != base * world + want))
        del buf
        done = i + 1 - warmup
        if done >= 0 and done % every == 0:
            ops.append(done)
            samples.append(rss())
    seconds = time.perf_counter() - t0
    say(event="series", mode=mode, nbytes=nbytes, ops=ops, rss=samples, wrong=wrong, seconds=seconds)
    comm.close()
    say(event="closed")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rank", type=int)
    ap.add_argument("world", type=int)
    ap.add_argument("store")
    ap.add_argument("iters", type=int)
    ap.add_argument("--series", choices=("fresh", "reused"))
    ap.add_argument("--nbytes", type=int, default=4 << 20)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--every", type=int, default=500)
    a = ap.parse_args()
    if a.series:
        series(a.rank, a.world, a.store, a.iters, a.series, a.nbytes, a.warmup, a.every)
    else:
        cycles(a.rank, a.world, a.store, a.iters)


if __name__ == "__main__":
    main()
