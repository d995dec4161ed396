"""Point-to-point matching keeps nothing per tag once its messages are
through: a job that uses a new tag for every message (a step counter, a
chaos workload's ``k % 65536``) must not keep one empty queue per tag it ever
used, on the receive side, the unexpected side or the any-source side."""

from __future__ import annotations

import time

import numpy as np
import pytest

from linkescape import CommTimeout, Config
from linkescape.testing import run_ranks

TAGS = 300


def _queues(comm):
    eng = comm._engine
    with comm._driver.locked():
        left = {"any_recvs": len(eng.matcher.any_recvs)}
        for rank, peer in eng.peers.items():
            left[f"p2p_recvs[{rank}]"] = len(peer.receiver.p2p_recvs)
            left[f"unexpected[{rank}]"] = len(peer.receiver.unexpected)
    return left


def _many_tags(comm):
    if comm.rank == 0:
        # receives posted before their sends (rank 1 waits), from a named rank and from any
        bufs = [(tag, np.empty(8, np.int32)) for tag in range(TAGS)]
        works = [comm.recv(b, 1 if tag % 2 else None, tag=tag, async_op=True) for tag, b in bufs]
        comm.barrier()
        for w in works:
            w.wait()
        for tag, b in bufs:
            assert (b == tag).all(), tag
        # sends that arrive before their receives (unexpected), taken by a named and an any-source receive
        comm.barrier()
        time.sleep(0.3)
        for tag in range(TAGS, 2 * TAGS):
            b = np.empty(8, np.int32)
            comm.recv(b, 2 if tag % 2 else None, tag=tag)
            assert (b == tag).all(), tag
        # a receive that never matches fails, and leaves nothing behind either
        for src in (1, None):
            with comm.call_timeout(0.2), pytest.raises(CommTimeout):
                comm.recv(np.empty(8, np.int32), src, tag=99999)
        left = _queues(comm)
        comm.barrier()
        return left
    if comm.rank == 1:
        comm.barrier()
        for tag in range(TAGS):
            comm.send(np.full(8, tag, np.int32), 0, tag=tag)
        comm.barrier()
    else:
        comm.barrier()
        comm.barrier()
        for tag in range(TAGS, 2 * TAGS):
            comm.send(np.full(8, tag, np.int32), 0, tag=tag)
    left = _queues(comm)
    comm.barrier()
    return left


def test_no_queue_is_kept_per_tag_once_its_messages_are_through():
    results = run_ranks(3, _many_tags, config=Config(timeout=30), timeout=120)
    for rank, left in enumerate(results):
        assert not isinstance(left, BaseException), left
        assert all(n == 0 for n in left.values()), (rank, left)
