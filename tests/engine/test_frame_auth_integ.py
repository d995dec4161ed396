"""LINKESCAPE_FRAME_AUTH=1: every frame carries a MAC keyed per link from
its handshake. A frame an attacker on the path writes into a link (a
forged ACK, BYE, PEER_LOST, rail word or DATA with the expected sequence
number) fails its MAC at the receiver: a protocol error of that link,
which is re-dialed and replayed. The job goes on, every result exact."""

from __future__ import annotations

import time

import numpy as np

from linkescape import Config
from linkescape.protocol.frames import ACK, BYE, DATA, HEARTBEAT, PEER_LOST, pack_header
from linkescape.testing import raise_first, run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")


def _forgeries():
    tag = bytes(16)
    return {
        "ack": pack_header(ACK, 0, 1 << 30) + tag,  # releases frames never received
        "bye": pack_header(BYE, 0, 0) + tag,  # would end the job
        "peer_lost": pack_header(PEER_LOST, 0, 0, arg=2) + tag,  # would name a live rank lost
        "rails": pack_header(HEARTBEAT, 0, 0, rails=(200 << 8) | 3) + tag,  # both rails down
        "data": pack_header(DATA, 0, 0, msg=1 << 40, offset=0, length=8, arg=8) + b"\xff" * 8 + tag,
    }


def _write(comm, peer: int, data: bytes) -> bool:
    """Write ``data`` into our link to ``peer`` on rail 0, between two frames
    (what an attacker on the path can do)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with comm._driver.locked() as eng:
            link = eng.peers[peer].links[0]
            if link is not None and not link.out:
                link.sock.send(data)
                return True
        time.sleep(0.02)
    return False


def _job(comm, kinds):
    n, r = comm.world_size, comm.rank
    ok = True

    def check(i):
        buf = np.arange(5000, dtype=np.float64) + r + i
        comm.all_reduce(buf)
        return bool(np.array_equal(buf, n * np.arange(5000, dtype=np.float64) + sum(range(n)) + n * i))

    for i in range(5):
        ok &= check(i)
    for k, kind in enumerate(kinds):
        if r == 1:
            assert _write(comm, 0, _forgeries()[kind])
        for i in range(10 + 20 * k, 30 + 20 * k):
            ok &= check(i)
        time.sleep(0.4)  # re-dialed meanwhile
    comm.barrier()
    downs = [(e["event"], e.get("cause"), e.get("peer"), e.get("rail")) for e in comm.events.recent()
             if e["event"] == "link_down"]
    return ok, downs


def test_forged_frames_cost_a_link_never_the_job_nor_a_result():
    kinds = ["ack", "bye", "peer_lost", "rails", "data"]
    cfg = Config(frame_auth=True, timeout=60, failback_holddown=0.2)
    results = raise_first(run_ranks(3, _job, kinds, rails=RAILS, config=cfg, timeout=180))
    for ok, _downs in results:
        assert ok
    downs0 = results[0][1]
    # each forgery took rank 0's link to rank 1 on rail 0 down, as a protocol error
    assert [d for d in downs0 if d == ("link_down", "protocol_error", 1, 0)].__len__() == len(kinds), downs0
