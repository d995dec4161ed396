"""Silent-loss detection must not trip on a healthy link whose peer is busy."""

from __future__ import annotations

import time

import numpy as np

from linkescape import Config
from linkescape.testing import raise_first, run_ranks


def _busy(comm):
    buf = np.ones(1 << 20, np.float32)
    comm.all_reduce(buf)
    if comm.rank == 0:
        # Hold the GIL for a second: no Python thread of this rank runs, so no
        # heartbeat, no ack, no read. The peer meanwhile waits with 4 MiB queued.
        t0 = time.perf_counter()
        x = 0
        while time.perf_counter() - t0 < 1.0:
            x += 1
    big = np.ones(4 << 20, np.float32)
    comm.all_reduce(big)
    comm.all_reduce(buf)
    time.sleep(0.3)
    return [(e["event"], e.get("detail")) for e in comm.events.recent()], float(big[0])


def test_busy_peer_is_not_a_dead_link():
    results = raise_first(run_ranks(2, _busy, rails=("127.0.0.1", "127.0.0.2"), config=Config(timeout=30)))
    print(results)
    for events, value in results:
        assert value == 2.0
        assert "link_down" not in [e[0] for e in events], events
