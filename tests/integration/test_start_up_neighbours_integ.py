"""``LINKESCAPE_CONNECT_AT_START=neighbours`` (the default from 16 ranks on): start-up opens only
the ring neighbours' links, then a store barrier; every other link, backups included, opens right
after, off the caller's path. Real processes over a TCPStore on two loopback rails: the first
collectives are exact while links are still opening, every link comes up, nothing opened for the
first time is reported as a failover or failback, and a rank with another key still stops every
rank at start-up."""

from __future__ import annotations

import datetime
import time

import numpy as np
import pytest

from linkescape import Communicator, FileStore
from linkescape.config import Config
from linkescape.errors import AuthError, LinkEscapeError
from linkescape.testing import raise_first, run_ranks

pytest.importorskip("torch")

RAILS = ["127.0.0.1", "127.0.0.2"]
N = 6


def _tcp_store(rank, n, store_dir):
    """A TCPStore (it counts: what the neighbours mode needs); its port goes through a FileStore."""
    import torch.distributed as dist

    files = FileStore(store_dir, timeout=60)
    timeout = datetime.timedelta(seconds=60)
    if rank == 0:
        server = dist.TCPStore("127.0.0.1", 0, n, True, timeout=timeout, wait_for_workers=False)
        files.set("port", str(server.port))
        return server
    return dist.TCPStore("127.0.0.1", int(files.get("port")), n, False, timeout=timeout)


def _leave(store, rank, n):
    """Rank 0 holds the store's server: it leaves last."""
    store.add("test/left", 1)
    if rank == 0:
        while int(store.add("test/left", 0)) < n:
            time.sleep(0.01)


def _state(comm) -> str:
    """Per peer: the channel's counters and each link's state; the rank's events."""
    snap = comm.snapshot()["peers"]
    peers = {p: (info["sent"], info["acked"], info["received"], info["primary"], info["via"],
                 [(l["rail"], l["state"], l["usable"], l["failures"]) for l in info["links"]])
             for p, info in sorted(snap.items())}
    events = [(e["event"], e.get("peer"), e.get("rail"), e.get("cause")) for e in comm.events.recent()]
    return f"peers (sent, acked, received, primary, via, links) {peers}; dialing {sorted(comm._recovery.dialing)}; " \
           f"events {events}"


def _job(rank, n, store_dir):
    store = _tcp_store(rank, n, store_dir)
    cfg = Config(timeout=60, connect_timeout=60, connect_at_start="neighbours")
    comm = Communicator(store, rank, n, rails=RAILS, config=cfg)
    try:
        assert comm.started_together  # start-up ended at the store barrier (torch's group: no other)
        snap = comm.snapshot()["peers"]
        at_start = sorted(p for p, info in snap.items() if any(l["usable"] for l in info["links"]))
        results = []
        try:
            for step in range(20):  # at once: some of these pairs have no link yet
                buf = np.full(1000, rank + step, np.float32)
                comm.all_reduce(buf)
                results.append(float(buf[0]))
                big = np.full(n, rank * 100 + step, np.int64)
                out = np.empty(n, np.int64)
                comm.all_to_all(out, big)
                results.append(out.tolist())
        except LinkEscapeError as exc:  # (what the rank's links and channels were: for the next time)
            raise AssertionError(f"rank {rank}: {exc!r}; {_state(comm)}") from exc
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            peers = comm.snapshot()["peers"].values()
            if len(peers) == n - 1 and all(l["usable"] for p in peers for l in p["links"]):
                break
            time.sleep(0.05)
        snap = comm.snapshot()["peers"]
        every_link = len(snap) == n - 1 and all(l["usable"] for p in snap.values() for l in p["links"])
        # (what was not up, when not: peer, rail, state, the cause of its last failure, failures, how long,
        # whether Recovery is dialing it)
        dialing = set(comm._recovery.dialing)
        not_up = [(peer, l["rail"], l["state"], l["down_cause"], l["failures"], l["since_s"], (peer, l["rail"]) in dialing)
                  for peer, p in snap.items() for l in p["links"] if not l["usable"]]
        primaries = sorted({p["primary"] for p in snap.values()})
        # start-up's links have epoch 1; Recovery's (re-)opened ones 2 and above
        epochs = comm._driver.call(lambda: {(p, l.rail): l.epoch for p, peer in comm._engine.peers.items()
                                            for l in peer.links if l is not None})
        events = [(e["event"], e.get("peer"), e.get("rail"), e.get("cause")) for e in comm.events.recent()]
        # Every rank looks before any closes: a rank that closed says BYE, and its links drop at the
        # others (a rank whose last dial ended after its acceptor had looked and closed found that
        # link gone, and waited for it in vain: the finding in docs/testing.md).
        store.add("test/looked", 1)
        looked_by = time.monotonic() + 60  # (a rank that raised never looks)
        while int(store.add("test/looked", 0)) < n and time.monotonic() < looked_by:
            time.sleep(0.01)
        return {"at_start": at_start, "results": results, "every_link": every_link, "not_up": not_up,
                "peers": sorted(snap), "primaries": primaries,
                "events": events, "by_start_up": sorted(k for k, e in epochs.items() if e == 1)}
    finally:
        comm.close()
        _leave(store, rank, n)


def test_start_up_opens_the_neighbours_and_every_link_follows():
    res = raise_first(run_ranks(N, _job, make_comm=False, timeout=180))
    for rank, r in enumerate(res):
        assert set(r["at_start"]) >= {(rank - 1) % N, (rank + 1) % N}, (rank, r["at_start"])
        if not r["every_link"]:
            pytest.fail(f"rank {rank}: not every link up: peers {r['peers']}, not up {r['not_up']}", pytrace=False)
        # start-up opened the neighbours' primary links, and nothing else
        assert r["by_start_up"] == sorted([((rank - 1) % N, 0), ((rank + 1) % N, 0)]), (rank, r["by_start_up"],
                                                                                          r["events"])
        assert r["primaries"] == [0], (rank, r["primaries"])  # traffic on the primary rail once it is up
        assert not {e[0] for e in r["events"]} & {"failover", "failback", "no_path", "link_down"}, (rank, r["events"])
    total = sum(range(N))
    for step in range(20):
        for rank, r in enumerate(res):
            assert r["results"][2 * step] == total + N * step, (rank, step)
            assert r["results"][2 * step + 1] == [src * 100 + step for src in range(N)], (rank, step)


def _mismatch(rank, n, store_dir, odd):
    store = _tcp_store(rank, n, store_dir)
    key = "odd-key--" * 4 if rank == odd else "same-key-" * 4
    cfg = Config(timeout=30, connect_timeout=30, connect_at_start="neighbours", auth_key=key)
    t0 = time.monotonic()
    try:
        with Communicator(store, rank, n, rails=RAILS, config=cfg):
            return ("connected", None, 0.0)
    except AuthError as exc:
        return ("AuthError", exc.peer, time.monotonic() - t0)
    finally:
        _leave(store, rank, n)


def test_a_rank_with_another_key_stops_every_rank_at_start_up():
    # rank 3's ring neighbours find it; the ranks that never dial it learn it at the barrier
    res = run_ranks(N, _mismatch, 3, make_comm=False, timeout=90)
    assert [r[0] for r in res] == ["AuthError"] * N, res
    assert max(r[2] for r in res) < 20, res  # not the connect timeout (30 s)
