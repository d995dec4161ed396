"""The ranks of one host of the 64-rank test: numpy only and a TCPStore. Every
collective, checked exactly, then all_reduce in a loop while the test cuts
one host's rail, until the stop file appears. Prints JSON lines, each naming
its rank.

``scale_worker.py RANKS N HOST PORT STOP ERRDIR``: RANKS (``16,17,...``) are
forked from this process once it has imported torch.distributed, numpy and
linkescape (each rank is still a process of its own; importing torch once per
host instead of once per rank spares 64 x 1.8 CPU-seconds), each with its
stderr in ``ERRDIR/stderr-RANK.txt``. Once every rank has exited, one
``exit`` line per rank gives its exit status; the launcher's own is 0 only if
every rank's is."""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import signal
import sys
import time

import numpy as np

PR_SET_PDEATHSIG = 1


def say(**rec) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def check_every_collective(comm, rank: int, n: int) -> int:
    wrong = 0
    k = 1000
    buf = np.full(k, rank, np.int64)
    comm.all_reduce(buf)
    wrong += int(np.count_nonzero(buf != n * (n - 1) // 2))
    big = np.arange(1 << 17, dtype=np.int64) + rank  # 1 MiB: the ring
    comm.all_reduce(big)
    wrong += int(np.count_nonzero(big != np.arange(1 << 17, dtype=np.int64) * n + n * (n - 1) // 2))
    b = np.full(k, rank, np.int64)
    comm.broadcast(b, 3)
    wrong += int(np.count_nonzero(b != 3))
    r = np.full(k, rank + 1, np.int64)
    comm.reduce(r, 5)
    if rank == 5:
        wrong += int(np.count_nonzero(r != n * (n + 1) // 2))
    out = np.zeros((n, 4), np.int64)
    comm.all_gather(out, np.full(4, rank, np.int64))
    wrong += int(np.count_nonzero(out != np.arange(n)[:, None]))
    rs = np.zeros(4, np.int64)
    comm.reduce_scatter(rs, np.tile(np.arange(n, dtype=np.int64)[:, None], (1, 4)))
    wrong += int(np.count_nonzero(rs != rank * n))
    a_in = np.array([[rank * 1000 + j] for j in range(n)], np.int64)
    a_out = np.zeros((n, 1), np.int64)
    comm.all_to_all(a_out, a_in)
    wrong += int(np.count_nonzero(a_out[:, 0] != np.arange(n) * 1000 + rank))
    g = np.zeros((n, 2), np.int64) if rank == 7 else None
    comm.gather(g, np.full(2, rank, np.int64), 7)
    if rank == 7:
        wrong += int(np.count_nonzero(g != np.arange(n)[:, None]))
    sc = np.zeros(2, np.int64)
    comm.scatter(sc, np.tile(np.arange(n, dtype=np.int64)[:, None], (1, 2)) if rank == 0 else None, 0)
    wrong += int(np.count_nonzero(sc != rank))
    comm.barrier()
    token = np.zeros(1, np.int64)
    if rank % 2 == 0:
        comm.send(np.array([rank], np.int64), (rank + 1) % n)
        comm.recv(token, (rank - 1) % n)
    else:
        comm.recv(token, (rank - 1) % n)
        comm.send(np.array([rank], np.int64), (rank + 1) % n)
    wrong += int(token[0] != (rank - 1) % n)
    return wrong


def rank_main(rank: int, n: int, host: str, port: int, stop: str) -> None:
    import torch.distributed as dist

    from linkescape import Communicator, ReduceOp

    store = dist.TCPStore(host, port, n, rank == 0, timeout=datetime.timedelta(seconds=300),
                          wait_for_workers=False)
    t0 = time.monotonic()
    comm = Communicator(store, rank, n)
    say(event="up", rank=rank, init_s=time.monotonic() - t0)
    wrong = check_every_collective(comm, rank, n)
    say(event="checked", rank=rank, wrong=wrong)
    i = 0
    while True:
        buf = np.full(1 << 16, rank + i, np.int64)
        comm.all_reduce(buf)
        wrong += int(np.count_nonzero(buf != n * i + n * (n - 1) // 2))
        i += 1
        if i % 5 == 0:
            flag = np.array([os.path.exists(stop)], np.int64)
            comm.all_reduce(flag, ReduceOp.MIN)
            if flag[0]:
                break
    wrong += check_every_collective(comm, rank, n)
    snap = comm.snapshot()
    failovers = sum(1 for p in snap["peers"].values() for l in p["links"] if l["failures"])
    say(event="end", rank=rank, wrong=wrong, iters=i, links_failed=failovers)
    comm.close()
    # Rank 0 holds the store's server: it goes last (the others may still be closing through it; a
    # server torn down under a client's request once ended rank 0 in std::terminate), and every rank
    # leaves without the store's C++ destructor, as torchrun's agent outlives its workers.
    store.add("closed", 1)
    deadline = time.monotonic() + 120
    while rank == 0 and int(store.add("closed", 0)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> int:
    ranks = [int(r) for r in sys.argv[1].split(",")]
    n, host, port, stop, errdir = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
    import torch.distributed  # noqa: F401 - imported once, before the ranks are forked

    import linkescape  # noqa: F401

    sys.stdout.flush()
    children = {}
    for rank in ranks:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the test kills the launcher
                fd = os.open(os.path.join(errdir, f"stderr-{rank}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 2)
                os.close(fd)
                rank_main(rank, n, host, port, stop)  # leaves with os._exit(0)
            except BaseException:  # noqa: BLE001 - the rank's failure goes to its stderr file
                import traceback

                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        children[pid] = rank
    worst = 0
    while children:
        pid, status = os.wait()
        rank = children.pop(pid, None)
        if rank is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        worst = worst or code
        say(event="exit", rank=rank, code=code)
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
