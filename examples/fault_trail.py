"""Make an event trail with faults, without root: 4 ranks on two loopback rails,
faults emulated inside the ranks (a cut, a silent loss, a flapping backup rail).

    python examples/fault_trail.py DIR
    linkescape report DIR/events-*.jsonl --png timeline.png

This is how docs/img/report-timeline.png was made. With LINKESCAPE_METRICS_PORT
set, ``linkescape status --targets 127.0.0.1:P,...`` shows the ranks meanwhile.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from linkescape import Config
from linkescape.testing import raise_first, run_ranks

#: (seconds after the start, rank, rail, fault)
PLAN = [(1.0, 1, 0, "cut"), (3.0, 1, 0, "restore"), (5.0, 2, 0, "blackhole"), (7.0, 2, 0, "restore"),
        (9.0, 3, 1, "cut"), (9.4, 3, 1, "restore"), (9.8, 3, 1, "cut"), (10.2, 3, 1, "restore")]


def job(comm, seconds: float):
    buf = np.ones(1 << 18, np.float32)
    t0 = time.time()
    comm.barrier()
    done = set()
    flag = np.zeros(1, np.int32)
    while True:
        comm.all_reduce(buf)
        now = time.time() - t0
        for i, (t, rank, rail, kind) in enumerate(PLAN):
            if i not in done and now >= t and comm.rank == rank:
                comm.inject_fault(rail, kind)
                done.add(i)
        flag[0] = 1 if now < seconds else 0
        comm.all_reduce(flag)  # every rank stops after the same collective
        if flag[0] < comm.world_size:
            return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--seconds", type=float, default=13.0)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    cfg = Config.from_env(failback_holddown=1.0, timeout=60, events=os.path.join(args.dir, "events-{rank}.jsonl"))
    raise_first(run_ranks(4, job, args.seconds, rails=("127.0.0.1", "127.0.0.2"), config=cfg, timeout=120))
    print(f"trail: {args.dir}/events-*.jsonl")


if __name__ == "__main__":
    main()
