"""A caller that drove its op to completion hands nothing to the progress thread when nothing is left.

After a synchronous all_reduce the peer's frame of the *next* one has often
arrived already, and it is parked (no receive is posted for it yet). That
frame waits for the next call, not for a reader: counting it as work woke the
progress thread after every other call (a pipe write, a thread switch and the
lock handed back and forth, on each rank), for nothing.
"""

from __future__ import annotations

import numpy as np

from linkescape.testing import raise_first, run_ranks


def _after_each_call(comm, n):
    buf = np.ones(1, np.float32)
    eng = comm._engine
    for _ in range(50):
        comm.all_reduce(buf)
    parked = busy = 0
    for _ in range(n):
        comm.all_reduce(buf)
        # one round of the engine, as the progress thread would make: the peer's next frame, if it
        # came, is read and parked (no receive is posted for it yet)
        comm._driver.call(lambda: eng.progress_once(0.005))
        if any(link is not None and link.parked and link.hdr is not None
               for p in eng.peers.values() for link in p.links):
            parked += 1
            busy += eng.async_work()
    return parked, busy


def test_a_parked_frame_is_not_work_for_the_progress_thread():
    n = 400
    results = raise_first(run_ranks(2, _after_each_call, n, rails=("127.0.0.1", "127.0.0.2"), timeout=120))
    assert sum(parked for parked, _ in results) >= 20, results  # the situation happened
    assert all(busy == 0 for _, busy in results), results  # every time, before the fix
