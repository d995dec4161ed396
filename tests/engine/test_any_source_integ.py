"""Any-source receives: ``recv(buf, None, tag)`` takes the first matching
send from any rank, whether it arrived before or after the receive was
posted, in posting order against receives from a named rank."""

from __future__ import annotations

import time

import numpy as np

from linkescape import Config
from linkescape.testing import run_ranks


def _gather_any(comm):
    n = comm.world_size
    if comm.rank == 0:
        got = {}
        for _ in range(n - 1):
            buf = np.empty(1000, np.int32)
            src = comm.recv(buf, None, tag=7)
            assert (buf == src * 10).all()
            got[src] = True
        # now the sends arrive before the receives are posted (unexpected messages)
        time.sleep(0.5)
        works = []
        for _ in range(n - 1):
            buf = np.empty(1000, np.int32)
            works.append((buf, comm.recv(buf, None, tag=8, async_op=True)))
        late = []
        for buf, w in works:
            w.wait()
            assert (buf == w.source * 100).all()
            late.append(w.source)
        return sorted(got), sorted(late)
    time.sleep(0.05 * comm.rank)  # ranks come in some order
    comm.send(np.full(1000, comm.rank * 10, np.int32), 0, tag=7)
    comm.send(np.full(1000, comm.rank * 100, np.int32), 0, tag=8)
    return None


def test_any_source_receives_from_every_rank():
    results = run_ranks(4, _gather_any, config=Config(timeout=30))
    assert results[0] == ([1, 2, 3], [1, 2, 3]), results


def _named_and_any(comm):
    if comm.rank == 0:
        a, b = np.empty(4, np.int32), np.empty(4, np.int32)
        w_any = comm.recv(a, None, tag=1, async_op=True)   # posted first
        w_one = comm.recv(b, 1, tag=1, async_op=True)
        w_any.wait()
        w_one.wait()
        return w_any.source, int(a[0]), int(b[0])
    if comm.rank == 1:
        comm.send(np.full(4, 11, np.int32), 0, tag=1)
        comm.send(np.full(4, 12, np.int32), 0, tag=1)
    return None


def test_receives_match_in_posting_order():
    results = run_ranks(2, _named_and_any, config=Config(timeout=30))
    assert results[0] == (1, 11, 12), results
