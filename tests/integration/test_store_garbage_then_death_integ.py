"""Issue 48 item 6: a garbage store record costs only that record. Before,
one record the job did not write turned off store-based death detection for
the rest of the job: a rank whose process then stopped for good (its host
hung, or powered off) was waited for ``LINKESCAPE_NO_PATH_TIMEOUT`` instead
of being named lost within seconds.

A writer who does not hold the key writes garbage into ``linkescape/failed``
and into rank 1's liveness key, while rank 1 is cut off (so that the others
read the store and meet the garbage). Then rank 2 stops for good (its links
blackholed, then SIGSTOP: no frame, no refresh; its kernel still accepts on
its listeners, as a hung process's does; it is killed 15 s later). Ranks 0 and 1 name rank 2 lost (``PeerLost``) within a few
``LINKESCAPE_PEER_LOST_TIMEOUT``s, far below the no-path deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np

from linkescape import Communicator, Config, FileStore
from linkescape.errors import PeerLost
from linkescape.testing import run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")
WORLD = 3
KEY = "an-attacker-does-not-hold-this-key-0123456789"
NO_PATH = 40.0


def _attack(store_dir: str, seconds: float) -> int:
    store = FileStore(store_dir, timeout=5)
    while not store.check([f"linkescape/alive/{WORLD - 1}"]):
        time.sleep(0.01)
    writes = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        store.set("linkescape/failed", "not json at all")
        store.set("linkescape/alive/1", "garbage")
        writes += 2
        time.sleep(0.01)
    return writes


def _rank(rank: int, n: int, store_dir: str):
    if rank == WORLD:
        return _attack(store_dir, 5.0)
    cfg = Config(auth_key=KEY, timeout=90, failback_holddown=0.2, peer_lost_timeout=1.0, no_path_timeout=NO_PATH)
    with Communicator(FileStore(store_dir, timeout=60), rank, WORLD, rails=RAILS, config=cfg) as comm:
        buf = np.ones(1000, np.float32)
        for i in range(40):
            if rank == 1 and i == 20:
                comm.inject_fault(0, "blackhole")
                comm.inject_fault(1, "blackhole")
                time.sleep(2.5)  # cut off: the others read the store (and its garbage) meanwhile
                comm.inject_fault(0, "restore")
                comm.inject_fault(1, "restore")
            comm.all_reduce(buf)
        time.sleep(3.0)  # the attack is over; the garbage is still in the store
        untrusted = comm.snapshot()["store_untrusted"]
        comm.barrier()
        if rank == 2:
            subprocess.Popen(["sh", "-c", f"sleep 15; kill -9 {os.getpid()}"])
            comm.inject_fault(0, "blackhole")  # its links go (a host that hangs: nothing more from it)
            comm.inject_fault(1, "blackhole")
            os.kill(os.getpid(), signal.SIGSTOP)  # stops for good (killed by then)
        t0 = time.monotonic()
        try:
            for _ in range(100000):
                comm.all_reduce(buf)
        except PeerLost as exc:
            return "PeerLost", exc.peer, time.monotonic() - t0, untrusted
        except Exception as exc:  # noqa: BLE001
            return type(exc).__name__, getattr(exc, "peer", None), time.monotonic() - t0, untrusted
        return "no error", None, time.monotonic() - t0, untrusted


def test_a_garbage_store_record_then_a_real_death():
    results = run_ranks(WORLD + 1, _rank, make_comm=False, timeout=150)
    assert results[WORLD] > 50, results[WORLD]
    for rank in (0, 1):
        kind, peer, took, untrusted = results[rank]
        assert (kind, peer) == ("PeerLost", 2), (rank, results[rank])
        assert took < 12.0, (rank, took)  # a few peer-lost timeouts (a hung process: 4), never NO_PATH
    # the garbage was read (and ignored) by a rank that looked at the store
    assert any(results[r][3] for r in (0, 2)), results
