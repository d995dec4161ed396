"""Issue 48 item 1, end to end: an on-path attacker feeds rank 0 the frames
rank 0 itself sent to rank 1 (reflection). Rank 1's process plays the
attacker on its own link: it taps the bytes rank 0 sends it on rail 0
(sealed frames, each with its tag) and writes one back into that link, the
one whose place on the link rank 0 expects next (with one key per link, as
before handshake version 4, its tag verified there, and a 2-rank all_reduce
could return A+A). With a key per direction it fails its MAC: rank 0's link
goes down as a protocol error, is re-dialed and replayed, and every result
stays exact."""

from __future__ import annotations

import time

import numpy as np

from linkescape import Config
from linkescape.protocol.framemac import TAG_SIZE
from linkescape.protocol.frames import ACK, HEADER_SIZE, unpack_header
from linkescape.testing import raise_first, run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")


class _Tap:
    """A link's socket that keeps a copy of what it reads."""

    def __init__(self, sock) -> None:
        self._sock = sock
        self.got = bytearray()

    def recv_into(self, view, nbytes=0):
        n = self._sock.recv_into(view, nbytes)
        self.got += bytes(view[:n])
        return n

    def __getattr__(self, name):
        return getattr(self._sock, name)


def _frames(data: bytes, first: int):
    """(place on the link, bytes) of each whole sealed frame in ``data``."""
    out, pos, i = [], 0, first
    while pos + HEADER_SIZE <= len(data):
        h = unpack_header(data, 1 << 30, pos)
        end = pos + HEADER_SIZE + h.length + TAG_SIZE
        if end > len(data):
            break
        out.append((i, bytes(data[pos:end])))
        pos, i = end, i + 1
    return out


def _until(comm, cond, what):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with comm._driver.locked() as eng:
            link = eng.peers[0].links[0]
            if link is not None and cond(link):
                return eng, link
        time.sleep(0.01)
    raise AssertionError(what)


def _job(comm):
    n, r = comm.world_size, comm.rank
    ok = True

    def check(i):
        buf = np.arange(3000, dtype=np.float64) * (r + 1) + i
        comm.all_reduce(buf)
        return bool(np.array_equal(buf, np.arange(3000, dtype=np.float64) * 3 + 2 * i))

    ok &= check(0)
    comm.barrier()
    tap = first = None
    if r == 1:
        deadline = time.monotonic() + 10
        while tap is None and time.monotonic() < deadline:
            with comm._driver.locked():
                _eng, link = _until(comm, lambda l: l.hdr is None and not l.buffered, "a frame boundary")
                tap, first = _Tap(link.sock), link.mac.received
                link.sock = tap
    for i in range(1, 20):
        ok &= check(i)
    for k in range(20):  # rank 0 sends more than it receives: frames of its to pick from
        if r == 0:
            comm.send(np.full(4, k, dtype=np.float32), 1, tag=k)
        else:
            comm.recv(np.empty(4, dtype=np.float32), 0, tag=k)
    comm.barrier()
    reflected = None
    if r == 1:
        with comm._driver.locked():
            _eng, link = _until(comm, lambda l: not l.out and l.hdr is None, "an idle link")
            frames = _frames(bytes(tap.got), first)
            want = link.mac.sent  # the place rank 0 expects our next frame at
            later = [f for f in frames if f[0] >= want]
            assert later, ("nothing of rank 0's to reflect", want, first, len(frames))
            place, frame = later[0]
            p = _eng.peers[0]
            while link.mac.sent < place:  # acknowledgements (level state, harmless) bring us to its place
                link.queue_control(ACK, p.inbound.cumulative_ack)
                link.flush()
            assert not link.out
            reflected = link.mac.sent == place
            tap._sock.send(frame)  # rank 0's own frame, back to rank 0, where rank 0 expects rank 1's next
    time.sleep(0.3)
    for i in range(20, 40):
        ok &= check(i)
    comm.barrier()
    downs = [(e.get("cause"), e.get("peer"), e.get("rail"), str(e.get("detail"))) for e in comm.events.recent()
             if e["event"] == "link_down"]
    return ok, downs, reflected


def test_a_frame_reflected_to_its_sender_fails_its_mac_and_the_sum_stays_exact():
    cfg = Config(frame_auth=True, timeout=60, failback_holddown=0.2)
    (ok0, downs0, _), (ok1, _d1, reflected) = raise_first(run_ranks(2, _job, rails=RAILS, config=cfg,
                                                                   timeout=120))
    assert reflected
    assert ok0 and ok1  # never A+A
    # its own frame failed its MAC at rank 0 (with one key per link it verified, and was taken for rank 1's)
    assert [d for d in downs0 if d[:3] == ("protocol_error", 1, 0) and "fails its MAC" in d[3]], (downs0, reflected)
