"""Bad input gets a typed error, across ranks too; never a hang or a wrong result."""

from __future__ import annotations

import os
import re
import socket
import time

import numpy as np
import pytest

from linkescape import (CollectiveMismatch, CommTimeout, Communicator, Config, FileStore, InvalidBuffer, InvalidRank,
                        PeerLost, ReduceOp, RendezvousError, UnsupportedDtype, UsageError)
from linkescape.testing import raise_first, run_ranks

CFG = Config(timeout=20, connect_timeout=20)


def _local_errors(comm):
    n = comm.world_size
    caught = []

    def expect(exc_type, fn, *args, **kw):
        try:
            fn(*args, **kw)
        except exc_type as exc:
            caught.append(type(exc).__name__)
        else:
            caught.append(f"no {exc_type.__name__}")

    x = np.zeros((4, 4), np.float32)
    expect(InvalidBuffer, comm.all_reduce, x[:, ::2])
    expect(InvalidBuffer, comm.all_reduce, [1.0, 2.0])
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    expect(InvalidBuffer, comm.all_reduce, ro)
    expect(UnsupportedDtype, comm.all_reduce, np.zeros(4, np.float32), ReduceOp.BAND)
    expect(UnsupportedDtype, comm.all_reduce, np.array(["a"], dtype=object))
    expect(UnsupportedDtype, comm.all_reduce, np.zeros(4, np.float32), "sum")
    expect(InvalidRank, comm.broadcast, np.zeros(4), n)
    expect(InvalidRank, comm.reduce, np.zeros(4), -1)
    expect(InvalidRank, comm.send, np.zeros(4), comm.rank)
    expect(InvalidRank, comm.recv, np.zeros(4), n + 3)
    expect(UsageError, comm.send, np.zeros(4), (comm.rank + 1) % n, tag=-1)
    expect(InvalidBuffer, comm.all_gather, np.zeros((n + 1, 4)), np.zeros(4))
    expect(InvalidBuffer, comm.all_gather, np.zeros((n, 4), np.float64), np.zeros(4, np.float32))
    expect(InvalidBuffer, comm.reduce_scatter, np.zeros(4), np.zeros((n, 5)))
    expect(InvalidBuffer, comm.all_to_all, np.zeros((n, 4)), np.zeros((n, 3)))
    expect(InvalidBuffer, comm.gather, None, np.zeros((4, 4))[:, ::2], 0)
    expect(InvalidBuffer, comm.scatter, np.zeros(4), np.zeros((n + 1, 4)) if comm.rank == 0 else None, 0) \
        if comm.rank == 0 else caught.append("InvalidBuffer")
    # after all that, the communicator still works: nothing was sent
    buf = np.full(5, comm.rank + 1.0, np.float32)
    comm.all_reduce(buf)
    return caught, buf.tolist()


def test_local_validation_errors_send_nothing():
    n = 2
    for caught, buf in raise_first(run_ranks(n, _local_errors, config=CFG)):
        assert all(not c.startswith("no ") for c in caught), caught
        assert buf == [3.0] * 5


def test_invalid_rank_and_world_size():
    with pytest.raises(InvalidRank):
        Communicator(FileStore("/tmp/nonexistent-le-store"), 3, 2)
    with pytest.raises(UsageError):
        Communicator(FileStore("/tmp/nonexistent-le-store"), 0, 0)


def _mismatch(comm, case):
    r = comm.rank
    if case == "count":
        comm.all_reduce(np.zeros(10 + r, np.float32))
    elif case == "count_large":
        comm.all_reduce(np.zeros((1 << 16) + r, np.float32))
    elif case == "dtype":
        comm.all_reduce(np.zeros(10, np.float32 if r == 0 else np.float64))
    elif case == "op":
        comm.all_reduce(np.zeros(10, np.float32), ReduceOp.SUM if r == 0 else ReduceOp.MAX)
    elif case == "root":
        comm.broadcast(np.zeros(10, np.float32), root=r)
    elif case == "reduce_root":
        comm.reduce(np.zeros(10, np.float32), root=r)
    elif case == "collective":
        if r == 0:
            comm.all_reduce(np.zeros(10, np.float32))
        else:
            comm.broadcast(np.zeros(10, np.float32), 0)
    return "no error"


@pytest.mark.parametrize("case", ["count", "count_large", "dtype", "op", "root", "collective"])
def test_mismatch_across_ranks_is_a_typed_error(case):
    results = run_ranks(2, _mismatch, case, config=Config(timeout=10))
    assert any(isinstance(r, CollectiveMismatch) for r in results), results
    for r in results:
        assert isinstance(r, (CollectiveMismatch, CommTimeout, PeerLost)), r


def test_reduce_with_different_roots_times_out_with_a_typed_error():
    # both ranks wait to receive: nothing is sent, so only the deadline can tell
    results = run_ranks(2, _mismatch, "reduce_root", config=Config(timeout=2))
    assert any(isinstance(r, CommTimeout) for r in results), results
    for r in results:  # the rank that timed out first closed: the other may see that
        assert isinstance(r, (CommTimeout, CollectiveMismatch, PeerLost)), r


def _lonely(rank, n, store_dir):
    t0 = time.monotonic()
    try:
        Communicator(FileStore(store_dir, timeout=5), rank, n, config=Config(connect_timeout=1.5))
    except RendezvousError as exc:
        return ("RendezvousError", exc.missing, time.monotonic() - t0)
    return ("no error",)


def _lonely_of_two(rank, n, store_dir):
    return _lonely(rank, 2, store_dir)


def test_peer_that_never_arrives_names_it():
    name, missing, took = raise_first(run_ranks(1, _lonely_of_two, make_comm=False, timeout=30))[0]
    assert name == "RendezvousError" and 1 in missing and took < 10


def _dies(comm):
    buf = np.ones(1000, np.float32)
    comm.all_reduce(buf)
    if comm.rank == 1:
        os._exit(3)  # the process dies: its links end with FIN/RST
    t0 = time.monotonic()
    try:
        comm.all_reduce(buf)
    except PeerLost as exc:
        return ("PeerLost", exc.peer, time.monotonic() - t0)
    return ("no error",)


def test_dead_peer_process_raises_peer_lost_quickly():
    results = run_ranks(3, _dies, config=Config(timeout=30))
    for rank in (0, 2):
        name, peer, took = results[rank]
        assert name == "PeerLost" and took < 2.0, results[rank]
    assert peer in (1, 0, 2)


def _late(comm):
    if comm.rank == 1:
        time.sleep(3)
        return "slept"
    try:
        comm.all_reduce(np.zeros(4, np.float32))
    except CommTimeout as exc:
        return ("CommTimeout", exc.peers, str(exc))
    return "no error"


def test_operation_timeout_names_the_peer():
    res = run_ranks(2, _late, config=Config(timeout=1))
    assert res[0][0] == "CommTimeout" and 1 in res[0][1]
    # ... and says what this rank knew of its path to it: a working path, a peer elsewhere
    assert re.search(r"waiting for ranks \[1\] \(rank 1: on rail 0, links up on rails \[0\], "
                     r"(last read \d+\.\ds ago|nothing read yet), \d+ of our frames unacknowledged\)$",
                     res[0][2]), res[0][2]


def _garbage_handshake(comm):
    # Connect to every peer's listeners with garbage; the job must not notice.
    if comm.rank == 0:
        for peer, addrs in comm.peer_addresses.items():
            for host, port in addrs:
                s = socket.create_connection((host, port))
                s.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(100))
                s.close()
    buf = np.full(100_000, comm.rank + 1, np.float32)
    comm.all_reduce(buf)
    comm.barrier()
    return float(buf[0])


def test_bad_handshake_never_disturbs_the_job():
    assert raise_first(run_ranks(3, _garbage_handshake, config=CFG)) == [6.0] * 3


def _too_big(comm):
    huge = np.empty((1 << 32) + 8, np.uint8)  # 4 GiB of address space, never touched
    out = []
    for call in (lambda: comm.broadcast(huge, 0), lambda: comm.send(huge, 1 - comm.rank),
                 lambda: comm.recv(huge, 1 - comm.rank)):
        try:
            call()
            out.append("no error")
        except InvalidBuffer:
            out.append("InvalidBuffer")
    small = np.ones(4, np.float32)
    comm.all_reduce(small)  # nothing was sent: the ranks still agree
    return out, float(small[0])


def test_a_message_beyond_4_gib_is_a_typed_error_and_nothing_is_lost():
    for res in run_ranks(2, _too_big):
        assert res == (["InvalidBuffer"] * 3, 2.0), res
