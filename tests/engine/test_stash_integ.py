"""A frame that cannot be placed yet (its collective is not posted here) must
not hide what follows it on the link: after a few milliseconds it is read into
the stash, and the notifications behind it get through. Here the peer's NIC
notification arrives while this rank is still seconds away from posting."""

from __future__ import annotations

import time

import numpy as np

from linkescape import Config
from linkescape.testing import run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")


def _early_then_notify(comm):
    n = 1 << 20
    buf = np.full(n, comm.rank + 1, np.float32)
    comm.barrier()
    if comm.rank == 1:
        work = comm.all_reduce(buf, async_op=True)  # its frames reach rank 0 before rank 0 posts
        time.sleep(0.3)
        t_cut = comm.inject_fault(1, "cut")  # told to rank 0 over rail 0, behind those frames
        work.wait()
        ok = bool((buf == 3).all())
        comm.inject_fault(1, "restore")
        return ok, t_cut, None
    time.sleep(3.0)
    seen = [e for e in comm.events.recent() if e["event"] == "link_down"]
    comm.all_reduce(buf)
    return bool((buf == 3).all()), None, seen


def test_a_notification_behind_an_early_frame_gets_through():
    results = run_ranks(2, _early_then_notify, rails=RAILS, config=Config(timeout=30), timeout=60)
    for res in results:
        assert not isinstance(res, BaseException), res
    (ok0, _, seen), (ok1, t_cut, _) = results
    assert ok0 and ok1
    # only rail 1 went down (rail 0, busy with the early frames, is healthy), and at once
    assert [(e["rail"], e["cause"]) for e in seen] == [(1, "peer_carrier")], seen
    assert seen[0]["ts"] - t_cut < 0.4, (seen, t_cut)
