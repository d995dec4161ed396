"""Issue 48 item 4: a DATA frame whose size disagrees with its own message
(a first frame longer than the message it announces) costs the link it came
on, never the job. Before, the MAC'd path placed it with a ``ValueError``
that the driver made fatal. Here rank 1 (a rank that holds the key, or an
on-path writer without frame MACs) sends rank 0 such a frame, sealed with the
link's real MAC, for the very receive rank 0 has posted; rank 0's link goes
down as a protocol error, is re-dialed, and the genuine message and every
later collective arrive exact."""

from __future__ import annotations

import time

import numpy as np
import pytest

from linkescape import Config
from linkescape.engine.link import WireItem
from linkescape.protocol.frames import DATA, P2P_FLAG, pack_header
from linkescape.testing import raise_first, run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")
TAG = 5


class _Payload:
    def __init__(self, data: bytes) -> None:
        self.payload = memoryview(data)
        self.length = len(data)


def _inject(comm, peer: int) -> None:
    """Rank 1: a first frame of 16 bytes for an 8-byte message, with the
    sequence number rank 0 expects next, on rail 0 (sealed when MACs are on)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with comm._driver.locked() as eng:
            p = eng.peers[peer]
            link = p.links[0]
            if link is not None and not link.out:
                header = pack_header(DATA, p.outbound.next_seq, 0, msg=P2P_FLAG | TAG, offset=0, length=16, arg=8)
                if link.mac is not None:
                    link.queue(WireItem(header, _Payload(b"\xee" * 16)))
                    link.flush()
                else:
                    link.sock.send(header + b"\xee" * 16)
                return
        time.sleep(0.02)
    raise AssertionError("rank 1's link to rank 0 never idle")


def _job(comm):
    r = comm.rank
    comm.barrier()
    if r == 0:
        buf = np.zeros(2, dtype=np.float32)
        work = comm.recv(buf, 1, tag=TAG, async_op=True)
        comm.barrier()  # posted
        comm.barrier()  # injected
        work.wait()
        got = buf.tolist()
    else:
        comm.barrier()
        _inject(comm, 0)
        comm.barrier()
        time.sleep(0.3)
        comm.send(np.array([1.5, 2.5], dtype=np.float32), 0, tag=TAG)
        got = None
    ok = True
    for i in range(10):
        x = np.arange(1000, dtype=np.float64) + r + i
        comm.all_reduce(x)
        ok &= bool(np.array_equal(x, 2 * np.arange(1000, dtype=np.float64) + 1 + 2 * i))
    comm.barrier()
    downs = [(e.get("cause"), e.get("peer"), e.get("rail")) for e in comm.events.recent() if e["event"] == "link_down"]
    return got, ok, downs


@pytest.mark.parametrize("frame_auth", [True, False], ids=["frame_auth", "no_frame_auth"])
def test_a_mis_sized_first_frame_costs_its_link_never_the_job(frame_auth):
    cfg = Config(frame_auth=frame_auth, timeout=60, failback_holddown=0.2)
    (got0, ok0, downs0), (_g1, ok1, _d1) = raise_first(run_ranks(2, _job, rails=RAILS, config=cfg, timeout=120))
    assert got0 == [1.5, 2.5]  # the genuine message, not the lie
    assert ok0 and ok1
    assert ("protocol_error", 1, 0) in downs0, downs0
