"""In-process fault injection (what the no-root demo uses), on loopback rails."""

from __future__ import annotations

import time

import numpy as np
import pytest

from linkescape import Config, UsageError
from linkescape.testing import raise_first, run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")


def _inject(comm, kind):
    n, r = comm.world_size, comm.rank
    buf = np.full(1 << 18, r + 1, np.float32)
    comm.all_reduce(buf)
    if r == 0:
        # the backups open after start-up: on a loaded host rail 1 may not be up yet, and a cut then
        # leaves no path (no_path) instead of a failover (make test, 2026-12-06)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and not all(
                link["state"] == "up" for p in comm.snapshot()["peers"].values() for link in p["links"]):
            time.sleep(0.02)
        comm.inject_fault(0, kind)
    work = [comm.all_reduce(np.full(1 << 18, r + i, np.float32), async_op=True) for i in range(3)]
    for w in work:
        w.wait(timeout=30)
    comm.barrier()
    if r == 0:
        comm.inject_fault(0, "restore")
    time.sleep(1.0)  # hold-down (0.3 s here) then failback
    # a held rail comes back once it also carried 60 clean heartbeats (protocol/grey.Hold): on a
    # loaded host that can take longer than the sleep; rank 0 (the one asserted on) waits for it
    deadline = time.monotonic() + 10.0
    while (r == 0 and time.monotonic() < deadline
           and not any(e["event"] == "failback" for e in comm.events.recent())):
        time.sleep(0.05)
    comm.all_reduce(buf)
    events = [(e["event"], e.get("cause"), e.get("rail")) for e in comm.events.recent()]
    return events, comm.rail_bytes(), float(buf[0])


@pytest.mark.parametrize("kind", ["cut", "blackhole"])
def test_injected_fault_fails_over_and_back(kind):
    cfg = Config(failback_holddown=0.3, timeout=30)
    results = raise_first(run_ranks(3, _inject, kind, rails=RAILS, config=cfg))
    n = 3
    for rank, (events, rails, value) in enumerate(results):
        assert value == n * sum(range(1, n + 1))  # (sum of r+1) all-reduced twice
        assert rails[0]["sent"] > 0 and rails[1]["sent"] > 0, rails  # both rails carried traffic
    ev0 = results[0][0]
    cause = "carrier" if kind == "cut" else "timeout"
    assert ("link_down", cause, 0) in ev0 and any(e[0] == "failover" for e in ev0)
    assert any(e[0] == "failback" for e in ev0), ev0
    if kind == "cut":  # the peers were told
        assert any(e[:2] == ("link_down", "peer_carrier") for e in results[1][0])


def test_inject_on_single_rank_is_a_usage_error():
    from linkescape import Communicator, FileStore

    with Communicator(FileStore("/tmp/le-single-rank"), 0, 1) as comm:
        with pytest.raises(UsageError):
            comm.inject_fault(0, "cut")
