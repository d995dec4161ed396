"""What the link handshake costs: start-up and re-dial times, medians over repeats.

Not a test (pytest does not collect it): a benchmark, run on a quiet machine.
It measures whatever ``linkescape`` is importable, so the same script times
an older tree too::

    .venv/bin/python tests/transport/bench_handshake.py --repeats 11
    git archive <commit> src | tar -x -C /tmp/le-before
    PYTHONPATH=/tmp/le-before/src .venv/bin/python tests/transport/bench_handshake.py --repeats 11

- start-up: N ranks released at the same instant build a Communicator on two
  loopback rails; the time until the last rank has every link open and
  authenticated (``links_up``: the store exchange and the handshakes), and
  until the last ``Communicator()`` returned (``communicator_up``: that plus
  the engine, recovery and observers).
- re-dial: rank 0 cuts rail 0 and restores it (in-process fault); rank 1
  re-dials rank 0. The time of each re-dial's connect + handshake, measured
  around ``transport.tcp.connect`` in rank 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import linkescape
from linkescape import Communicator, Config, FileStore
from linkescape.testing import raise_first, run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")


def _startup(rank, n, store_dir, start_at):
    from linkescape import rendezvous

    linked = []
    real = rendezvous.LinkSetup.connect_all

    def timed(self, *args, **kw):
        try:
            return real(self, *args, **kw)
        finally:
            linked.append(time.time())
    rendezvous.LinkSetup.connect_all = timed
    time.sleep(max(0.0, start_at - time.time()))
    comm = Communicator(FileStore(store_dir, timeout=60), rank, n, rails=RAILS,
                        config=Config(timeout=60, failback_holddown=0.2))
    up = time.time()
    comm.barrier()
    comm.close()
    return start_at, linked[0], up


def startup(n: int, repeats: int):
    """(links up, communicator up) per repeat: until the last rank had every
    link open, and until the last rank's Communicator() returned."""
    links, comms = [], []
    for _ in range(repeats):
        res = raise_first(run_ranks(n, _startup, time.time() + 0.5, make_comm=False, timeout=120))
        start = res[0][0]
        links.append(max(linked for _s, linked, _up in res) - start)
        comms.append(max(up for _s, _linked, up in res) - start)
    return links, comms


def _redial(rank, n, store_dir, cycles):
    from linkescape.transport import tcp

    times = []
    real = tcp.connect

    def timed(*args, **kw):
        t0 = time.perf_counter()
        try:
            return real(*args, **kw)
        finally:
            times.append(time.perf_counter() - t0)
    comm = Communicator(FileStore(store_dir, timeout=60), rank, n, rails=RAILS,
                        config=Config(timeout=60, failback_holddown=0.2))
    tcp.connect = timed  # from here on only re-dials connect
    buf = np.ones(1024, np.float32)
    for _ in range(cycles):
        if rank == 0:
            comm.inject_fault(0, "cut")
        comm.all_reduce(buf)
        if rank == 0:
            comm.inject_fault(0, "restore")
        while True:  # collectively: every rail-0 link back
            links = [l for info in comm.snapshot()["peers"].values() for l in info["links"] if l["rail"] == 0]
            flag = np.array([int(all(l["usable"] for l in links))], np.int32)
            comm.all_reduce(flag)
            if flag[0] == n:
                break
            time.sleep(0.01)
    comm.barrier()
    comm.close()
    return times


def redial(cycles: int):
    res = raise_first(run_ranks(2, _redial, cycles, make_comm=False, timeout=300))
    return res[1]


def _ms(values):
    return {"median_ms": round(statistics.median(values) * 1e3, 3), "min_ms": round(min(values) * 1e3, 3),
            "max_ms": round(max(values) * 1e3, 3), "n": len(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--cycles", type=int, default=30)
    ap.add_argument("--world-sizes", default="2,4")
    args = ap.parse_args()
    report = {"linkescape": linkescape.__file__}
    for n in (int(x) for x in args.world_sizes.split(",")):
        links, comms = startup(n, args.repeats)
        report[f"links_up_{n}_ranks"] = _ms(links)
        report[f"communicator_up_{n}_ranks"] = _ms(comms)
    report["redial_connect_handshake"] = _ms(redial(args.cycles))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
