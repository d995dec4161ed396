"""One rank of the idle-cost tests: N ranks on two loopback rails, a TCPStore
behind a wrapper that counts every call the library makes.

Prints one JSON line: the frames, wake-ups and store calls of ``--seconds``
idle seconds (after one warm-up all_reduce and a settle)."""

from __future__ import annotations

import datetime
import json
import sys
import time

import numpy as np


class CountingStore:
    """Every call the communicator makes to the store goes through here."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls += 1
            return attr(*args, **kwargs)
        return call


def main() -> None:
    rank, world, port, seconds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    import torch.distributed as dist

    from linkescape import Communicator

    tcp = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=120),
                        wait_for_workers=False)
    store = CountingStore(tcp)
    comm = Communicator(store, rank, world, rails=["127.0.0.1", "127.0.0.2"])
    buf = np.full(16, rank, np.int64)
    comm.all_reduce(buf)
    assert int(buf[0]) == world * (world - 1) // 2
    time.sleep(1.5)  # start-up settles: the first beats, the last acks
    s0, c0 = comm.snapshot(), store.calls
    t0 = time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    s1, c1 = comm.snapshot(), store.calls
    out = {"rank": rank, "seconds": dt, "store_calls": c1 - c0,
           "frames_sent": s1["frames_sent"] - s0["frames_sent"],
           "frames_received": s1["frames_received"] - s0["frames_received"],
           "wakeups": {k: s1["wakeups"][k] - s0["wakeups"][k] for k in s1["wakeups"]},
           "links": sum(1 for p in s1["peers"].values() for l in p["links"] if l["usable"])}
    buf = np.ones(4, np.float32)
    comm.all_reduce(buf)  # still works after the idle spell, and nobody leaves early
    assert float(buf[0]) == world
    print(json.dumps(out), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
