"""The flight recorder: the ring, dumps on a real timeout, mismatch and SIGUSR1, and `trace analyze`."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from linkescape import CollectiveMismatch, CommTimeout, Communicator, Config, FileStore, LinkEscapeError
from linkescape.engine.messages import Op
from linkescape.flight import FlightRecorder
from linkescape.testing import raise_first, run_ranks
from linkescape.tools.trace import analyze, load_dumps


def _op(seq, name="all_reduce", collective=True):
    return Op(seq, name, time.monotonic() + 10, collective=collective)


def _finish(op, error=None):
    op.error = error
    op.done = True
    for cb in op.callbacks:
        cb(op)


def test_ring_keeps_the_last_n_in_order_and_counts_everything():
    rec = FlightRecorder(4, rank=0, world_size=2)
    ops = []
    for seq in range(1, 8):
        op = _op(seq)
        s = rec.record(op, ("<f4", 256, "sum"), time.time())
        rec.started(s)
        ops.append(op)
    for op in ops[:-1]:
        _finish(op)
    entries = rec.entries()
    assert [e["seq"] for e in entries] == [4, 5, 6, 7]
    assert [e["state"] for e in entries] == ["done", "done", "done", "started"]
    e = entries[0]
    assert (e["op"], e["dtype"], e["count"], e["reduce_op"], e["nbytes"]) == ("all_reduce", "float32", 256, "sum", 1024)
    assert e["posted"] <= e["started"] <= e["done"]
    st = rec.stats()
    assert st["ops"] == {"all_reduce": 6} and st["bytes"] == {"all_reduce": 6 * 1024}
    assert st["collective_posted"] == 7 and st["collective_done"] == 6 and st["oldest_pending_posted"] is not None
    # an op whose slot was reused meanwhile does not overwrite the newer entry
    _finish(ops[0])
    assert [e["seq"] for e in rec.entries()] == [4, 5, 6, 7]
    _finish(ops[-1], CommTimeout("late", peers=[1], op_seq=7))
    last = rec.entries()[-1]
    assert last["state"] == "failed" and last["error"]["type"] == "CommTimeout" and last["error"]["peers"] == [1]
    assert rec.stats()["errors"] == {("all_reduce", "CommTimeout"): 1}


def test_p2p_and_no_directory_means_no_dump(tmp_path):
    rec = FlightRecorder(8, rank=1, world_size=2)
    op = _op(1, "send", collective=False)
    rec.record(op, ("<i8", 10, 0, 5), time.time())
    _finish(op, CommTimeout("x"))
    e = rec.entries()[0]
    assert (e["op"], e["collective"], e["dtype"], e["peer"], e["tag"], e["nbytes"]) == ("send", False, "int64", 0, 5, 80)
    assert rec.dump("manual") is None  # no LINKESCAPE_TRACE_DIR
    path = rec.dump("manual", directory=str(tmp_path))
    d = json.load(open(path))
    assert d["format"] == "linkescape-trace" and d["rank"] == 1 and d["reason"] == "manual"
    assert [e["op"] for e in d["entries"]] == ["send"]


# ------------------------------------------------------------------ real ranks
def _wait_for(pattern, limit=15.0):
    deadline = time.monotonic() + limit
    while not glob.glob(pattern) and time.monotonic() < deadline:
        time.sleep(0.05)


def _laggard(comm, trace_dir):
    """Rank 2 comes 2.5 s late to the 4th all_reduce; the others time out (1 s)."""
    x = np.ones(256, np.float32)
    for _ in range(3):
        comm.all_reduce(x)
    slow_dump = os.path.join(trace_dir, "*rank2*signal.json")
    if comm.rank == 2:
        time.sleep(2.5)
        try:
            comm.all_reduce(x, async_op=True).wait(timeout=2.0)
        except LinkEscapeError:
            pass
        os.kill(os.getpid(), signal.SIGUSR1)  # an operator asks the slow rank for its trace
        _wait_for(slow_dump)
        err = None
    else:
        try:
            comm.all_reduce(x)
            err = None
        except CommTimeout as exc:
            err = exc
        _wait_for(slow_dump)  # stay up while the slow rank arrives
    comm.flight_recorder.wait_dumps()
    comm.abort()
    return None if err is None else (type(err).__name__, list(err.peers))


def test_timeout_dumps_and_analyze_names_the_late_rank(tmp_path):
    d = str(tmp_path / "trace")
    cfg = Config(timeout=1.0, trace_dir=d)
    res = raise_first(run_ranks(3, _laggard, d, config=cfg, timeout=60))
    assert res[0] == ("CommTimeout", [2]) and res[1] == ("CommTimeout", [2]), res
    files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(d, "*.json")))
    assert any("rank0" in f and f.endswith("timeout.json") for f in files), files
    assert any("rank1" in f and f.endswith("timeout.json") for f in files), files
    assert any("rank2" in f and f.endswith("signal.json") for f in files), files
    dumps = load_dumps([d])
    r0 = next(x for x in dumps if x["rank"] == 0)
    e4 = next(e for e in r0["entries"] if e["seq"] == 4)
    assert e4["state"] == "failed" and e4["error"]["type"] == "CommTimeout" and e4["waiting_on"] == [2]
    assert "2" in e4["progress"] and e4["progress"]["2"]["received"] is not None
    [job] = analyze(dumps)
    assert job["behind"] == [2] and job["waiting"]["seq"] == 4 and job["waiting"]["why"] == "late", job
    # without the slow rank's dump, it is still the one the others wait on
    for f in glob.glob(os.path.join(d, "*rank2*")):
        os.remove(f)
    [job] = analyze(load_dumps([d]))
    assert job["behind"] == [2] and job["missing_ranks"] == [2] and job["waiting"]["why"] == "no_dump", job
    # the command line says the same
    out = subprocess.run([sys.executable, "-m", "linkescape.cli", "trace", "analyze", d], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "rank 2 behind: collective #4" in out.stdout, out.stdout


def _mismatch(comm, trace_dir):
    """Rank 2 all_reduces 2048 elements where the others all_reduce 1024."""
    x = np.ones(1024 if comm.rank != 2 else 2048, np.float32)
    comm.all_reduce(np.ones(8, np.float32))
    comm.all_reduce(np.ones(8, np.float32))
    try:
        comm.all_reduce(x)
        err = None
    except LinkEscapeError as exc:  # the mismatch, or a peer that failed on it first
        err = exc
    comm.flight_recorder.wait_dumps()
    deadline = time.monotonic() + 10  # every rank dumps before anyone leaves
    while len(glob.glob(os.path.join(trace_dir, "*.json"))) < comm.world_size and time.monotonic() < deadline:
        time.sleep(0.05)
    comm.abort()
    return None if err is None else type(err).__name__


def test_mismatch_dumps_and_analyze_names_the_odd_rank(tmp_path):
    d = str(tmp_path / "trace")
    cfg = Config(timeout=3.0, trace_dir=d)
    res = raise_first(run_ranks(3, _mismatch, d, config=cfg, timeout=60))
    assert "CollectiveMismatch" in res and None not in res, res
    dumps = load_dumps([d])
    assert "mismatch" in {x["reason"] for x in dumps} and len({x["rank"] for x in dumps}) == 3, \
        [(x["rank"], x["reason"]) for x in dumps]
    [job] = analyze(dumps)
    assert job["mismatch"]["seq"] == 3 and job["behind"] == [2], job
    assert "rank 2 differs" in job["verdict"]
    groups = {tuple(g["ranks"]): g["op"] for g in job["mismatch"]["groups"]}
    assert groups.get((2,)) == "all_reduce float32[2048] sum", groups


def _handler_state():
    return signal.getsignal(signal.SIGUSR1)


def _signal_lifecycle(rank, n, store_dir, d):
    import faulthandler

    before = _handler_state()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    comm = Communicator(FileStore(store_dir), rank, n, config=Config(trace_dir=d))
    during = _handler_state() is not signal.SIG_DFL
    comm.barrier()
    os.kill(os.getpid(), signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while not glob.glob(os.path.join(d, f"*rank{rank}*signal.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    comm.close()
    after = _handler_state()
    return before == after, during, bool(glob.glob(os.path.join(d, f"*rank{rank}*signal.json"))), faulthandler.unregister(signal.SIGUSR1)


def test_sigusr1_dumps_and_the_handler_goes_at_close(tmp_path):
    d = str(tmp_path / "trace")
    res = raise_first(run_ranks(2, _signal_lifecycle, d, make_comm=False, timeout=60))
    for restored, during, dumped, faulthandler_kept in res:
        assert restored and during and dumped and faulthandler_kept


def test_dump_trace_needs_a_directory_and_a_ring(tmp_path):
    from linkescape import UsageError

    with Communicator(FileStore(str(tmp_path / "s")), 0, 1, config=Config(trace_buffer=0)) as comm:
        assert comm.flight_recorder is None
        with pytest.raises(UsageError):
            comm.dump_trace(str(tmp_path))
    with Communicator(FileStore(str(tmp_path / "s2")), 0, 1) as comm:
        with pytest.raises(UsageError):
            comm.dump_trace()
        comm.barrier()
        path = comm.dump_trace(str(tmp_path / "t"))
        assert json.load(open(path))["entries"][-1]["op"] == "barrier"


def test_each_failure_kind_dumps_with_its_reason(tmp_path):
    from linkescape import LinkFailure, PeerLost

    rec = FlightRecorder(16, rank=3, world_size=4, trace_dir=str(tmp_path))
    errors = [CommTimeout("t", peers=[1]), PeerLost("p", peer=1), LinkFailure("l", peer=2, rails=[0, 1]),
              CollectiveMismatch("m", peer=0, op_seq=4), ValueError("not a trigger")]
    for seq, err in enumerate(errors, 1):
        op = _op(seq)
        rec.record(op, ("<f4", 4, "sum"), time.time())
        _finish(op, err)
    rec.close()
    reasons = sorted(json.load(open(f))["reason"] for f in glob.glob(str(tmp_path / "*.json")))
    assert reasons == ["link_failure", "mismatch", "peer_lost", "timeout"]
    d = json.load(open(glob.glob(str(tmp_path / "*link_failure.json"))[0]))
    assert d["error"] == {"type": "LinkFailure", "message": "l", "peer": 2, "rails": [0, 1]}


def _dies(comm, trace_dir):
    x = np.ones(64, np.float32)
    comm.all_reduce(x)
    comm.all_reduce(x)
    if comm.rank == 2:
        os._exit(0)  # the process is gone: no goodbye, no dump
    try:
        comm.all_reduce(x)
        err = None
    except LinkEscapeError as exc:
        err = type(exc).__name__
    comm.flight_recorder.wait_dumps()
    _wait_for(os.path.join(trace_dir, f"*rank{1 - comm.rank}*.json"))
    comm.abort()
    return err


def test_a_lost_peer_dumps_and_analyze_names_it(tmp_path):
    from linkescape.testing import RankError

    d = str(tmp_path / "trace")
    res = run_ranks(3, _dies, d, config=Config(timeout=20.0, trace_dir=d), timeout=60)
    assert res[:2] == ["PeerLost", "PeerLost"] and isinstance(res[2], (RankError, BaseException)), res
    dumps = load_dumps([d])
    assert sorted((x["rank"], x["reason"]) for x in dumps) == [(0, "peer_lost"), (1, "peer_lost")]
    [job] = analyze(dumps)
    assert job["missing_ranks"] == [2] and job["behind"] == [2], job
