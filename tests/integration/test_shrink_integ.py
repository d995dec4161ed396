"""Communicator.shrink on loopback: a killed rank, a rank that is still connected, operations
in flight (issue 47 item 1). The cut-off rank and the no-path deadline on real NICs:
tests/testbed/test_shrink_testbed.py."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest

from linkescape import LinkEscapeError, ReduceOp
from linkescape.errors import GroupShrunk, PeerLost, UsageError
from linkescape.testing import RankError, raise_first, run_ranks

sys.path.insert(0, os.path.dirname(__file__))
from collective_cases import check_matrix, run_matrix  # noqa: E402

DTYPES = [np.dtype(np.float32), np.dtype(np.int64)]
SIZES = [0, 7, 20011]


def _shrink_after_kill(comm, victim):
    first = np.full(4, comm.rank, np.float32)
    comm.all_reduce(first)
    if comm.rank == victim:
        time.sleep(0.5)  # the others are through the first collective: only the next one needs us
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        comm.all_reduce(np.ones(1000, np.float32))
        failed = None
    except LinkEscapeError as exc:
        failed = (type(exc).__name__, getattr(exc, "peer", None), isinstance(exc, PeerLost))
    failed_after = time.monotonic() - started
    events = []
    comm.events.subscribe(lambda rec: events.append(rec) if rec["event"] == "shrink" else None)
    new = comm.shrink([victim])
    try:
        with pytest.raises(GroupShrunk):
            comm.barrier()  # the old group is closed by the shrink
        results = run_matrix(new, DTYPES, SIZES)
        avg = np.full(3, float(new.rank), np.float32)
        new.all_reduce(avg, ReduceOp.AVG)
        return dict(failed=failed, failed_after=failed_after, rank=new.rank, size=new.world_size,
                    results=results, avg=avg, events=events, first=first)
    finally:
        new.close()


@pytest.mark.parametrize("n,victim", [(4, 2), (8, 0), (8, 5)])
def test_shrink_after_a_killed_rank_every_collective_is_exact(n, victim):
    out = run_ranks(n, _shrink_after_kill, victim, timeout=120)
    assert isinstance(out[victim], RankError)  # it died
    survivors = [o for r, o in enumerate(out) if r != victim]
    raise_first(survivors)
    for old_rank, o in zip([r for r in range(n) if r != victim], survivors):
        assert o["first"].tolist() == [sum(range(n))] * 4
        # the collective after the death failed with a typed error naming the dead rank
        assert o["failed"] == ("PeerLost", victim, True), o["failed"]
        # renumbered densely in the old order
        assert o["rank"] == old_rank - (old_rank > victim) and o["size"] == n - 1
        (ev,) = o["events"]
        assert ev["excluded"] == [victim] and ev["old_size"] == n and ev["new_size"] == n - 1
        assert 0 <= ev["duration_s"] < 1.0
    assert [o["rank"] for o in survivors] == list(range(n - 1))
    assert check_matrix([o["results"] for o in survivors], n - 1, DTYPES, SIZES) == []
    for o in survivors:
        assert np.allclose(o["avg"], sum(range(n - 1)) / (n - 1))


def _abort_in_flight(comm):
    if comm.rank == 2:
        # left out while still connected: the others' BYE reaches it, so its calls fail at once
        time.sleep(1.5)
        started = time.monotonic()
        try:
            comm.all_reduce(np.ones(8, np.float32))
            return ("result", None)
        except LinkEscapeError as exc:
            return (type(exc).__name__, time.monotonic() - started)
    big = np.ones(1 << 20, np.float32)
    work = comm.all_reduce(big, async_op=True)  # rank 2 never joins: it stays in flight
    time.sleep(0.3)
    assert not work.is_completed()
    with pytest.raises(UsageError):
        comm.shrink([2], abort=False)  # refused while an operation is in flight
    started = time.monotonic()
    new = comm.shrink([2])
    try:
        with pytest.raises(GroupShrunk) as info:
            work.wait(timeout=5)
        ended_after = time.monotonic() - started
        assert info.value.excluded == (2,)
        buf = np.full(100_003, comm.rank + 1, np.float32)
        new.all_reduce(buf)
        got = new.recv(np.empty(5, np.int64), None, tag=7) if new.rank == 0 else new.send(np.arange(5), 0, tag=7)
        return (ended_after, float(buf[0]), float(buf[-1]), got)
    finally:
        time.sleep(2.5)  # rank 2 makes its call meanwhile
        new.close()


def test_shrink_ends_what_is_in_flight_and_the_excluded_rank_gets_a_typed_error():
    out = raise_first(run_ranks(3, _abort_in_flight, timeout=60))
    for o in out[:2]:
        ended_after, first, last, _ = o
        assert ended_after < 1.0
        assert first == last == 3.0
    assert out[0][3] == 1  # any-source recv names the sender in the new group's numbering
    kind, took = out[2]
    assert kind == "PeerLost", kind  # the survivors' goodbye: "closed its communicator"
    assert took < 1.0
