"""Acknowledgements ride on frames, and timers wake only when something is due.

An acknowledgement owed goes with the next frame to the peer (data or a
heartbeat); only one owed for ACK_DELAY goes alone. Before, the timers of a
busy peer ran every 40 ms whatever was due, and each run sent whatever ack
was owed at that moment: a reply that came 20 ms after the request found its
ack gone already, about every other time (two frames instead of one, and a
wake-up of the peer for the lone ack).
"""

from __future__ import annotations

import time

import numpy as np

from linkescape.engine.link import Link
from linkescape.engine.receiver import ACK_DELAY
from linkescape.protocol.frames import ACK
from linkescape.testing import run_ranks

ROUNDS = 20
GAP = 0.02  # the reply comes this long after the request (< ACK_DELAY)


def _count_acks() -> dict:
    """Count the ACK frames this rank queues (a counter on its links' class: each
    rank is a process of its own)."""
    counts = {"acks": 0}
    orig = Link.queue_control

    def counting(self, kind, *a, **k):
        if kind == ACK:
            counts["acks"] += 1
        return orig(self, kind, *a, **k)
    Link.queue_control = counting
    return counts


def _ping_pong(comm):
    buf = np.zeros(1, np.float32)
    comm.barrier()
    counts = _count_acks()
    for i in range(ROUNDS):
        if comm.rank == 0:
            comm.send(np.full(1, i, np.float32), 1)
            comm.recv(buf, 1)
            assert buf[0] == i + 0.5
        else:
            comm.recv(buf, 0)
            time.sleep(GAP)  # the reply takes a while: the ack waits for it
            comm.send(buf + 0.5, 0)
    comm.barrier()
    return counts["acks"]


def test_an_ack_owed_goes_with_the_reply():
    assert GAP < ACK_DELAY
    acks = run_ranks(2, _ping_pong, timeout=60)
    # rank 1 owes an ack for each request and replies within ACK_DELAY: the
    # reply carries it (a probe of the budget may carry one too; none goes alone)
    assert acks[1] <= 2, acks


def _one_way(comm):
    comm.barrier()
    if comm.rank == 0:
        comm.send(np.ones(4, np.float32), 1)
        peer = comm._engine.peers[1]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5.0:
            if not comm._driver.call(lambda: len(peer.outbound.unacked)):
                break
            time.sleep(0.005)
        took = time.monotonic() - t0
    else:
        comm.recv(np.zeros(4, np.float32), 0)
        took = None
    comm.barrier()
    return took


def test_an_ack_owed_with_nothing_to_carry_it_goes_alone():
    """Nothing else goes to the peer: the ack goes alone, and the sender's
    retransmit store empties (a timer wakes the receiver for it)."""
    took = run_ranks(2, _one_way, timeout=60)[0]
    assert took < 1.0, took
