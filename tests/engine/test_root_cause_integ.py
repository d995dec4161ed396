"""The root cause travels: when a rank is killed, every other rank raises
PeerLost naming it, also a rank that learns of it only from a rank that
failed on it and exited at once (issue: "root cause lost")."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import pytest

from linkescape import Config
from linkescape.errors import PeerLost
from linkescape.testing import run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")


def _killed(comm, victim):
    buf = np.ones(1000, np.float32)
    t0 = time.monotonic()
    try:
        comm.all_reduce(buf)
        if comm.rank == victim:
            os._exit(3)  # the process dies: its links end with FIN/RST, its listeners close
        t0 = time.monotonic()
        for _ in range(1000):
            comm.all_reduce(buf)
    except PeerLost as exc:
        # (also in the first all_reduce: the victim may exit with frames of ours unread, and its
        # kernel then resets the links and drops what it had not sent yet; make test, 51112d9)
        return ("PeerLost", exc.peer, time.monotonic() - t0)
    return ("no error",)


@pytest.mark.parametrize("n,victim", [(3, 1), (3, 2), (4, 0), (4, 2)])
def test_every_rank_names_the_killed_rank(n, victim):
    results = run_ranks(n, _killed, victim, rails=RAILS, config=Config(timeout=30), timeout=90)
    for rank, res in enumerate(results):
        if rank == victim:
            continue
        assert res[0] == "PeerLost" and res[1] == victim, (rank, res)
        assert res[2] < 10, (rank, res)


def _relay(comm):
    """Rank 2 dies while rank 1 is stopped (SIGSTOP: descheduled, swapped
    out); rank 0 finds rank 2 gone and exits at once. When rank 1 runs again,
    rank 0's links are closed and its listeners refuse, rank 2's too: it
    must still name rank 2, the root cause, not rank 0."""
    buf = np.ones(1000, np.float32)
    comm.all_reduce(buf)
    if comm.rank == 1:
        subprocess.Popen(["sh", "-c", f"sleep 3; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            comm.recv(buf, 0)
        except PeerLost as exc:
            return ("PeerLost", exc.peer, time.monotonic() - t0)
        return ("no error",)
    time.sleep(0.5)  # rank 1 is stopped by now
    if comm.rank == 2:
        os._exit(3)
    try:
        while True:
            comm.send(buf, 2)
            comm.recv(buf, 2)
    except PeerLost:
        os._exit(0)  # no close, no BYE: only what the library told before the error


def test_a_relayed_failure_names_the_root_cause():
    results = run_ranks(3, _relay, rails=RAILS, config=Config(timeout=30), timeout=90)
    res = results[1]
    assert res[0] == "PeerLost" and res[1] == 2, res
