"""After an outage a rank's work goes back to nothing: the lower rank of a pair whose links all
ended with FIN/RST probes the peer's listeners while it has no path, and stops once the path is
back. (A peer once stayed in the wanted set for good: its listeners were connected to twice a
second for the rest of the job, on every rail, by every rank that had seen one such outage.)"""

from __future__ import annotations

import time

import numpy as np

from linkescape import Config
from linkescape.testing import raise_first, run_ranks

RAILS = ("127.0.0.1", "127.0.0.2")


def _outage_then_idle(comm):
    buf = np.ones(1024, np.float32)
    comm.all_reduce(buf)
    rec = comm._recovery
    probed = np.zeros(1, np.int32)
    for _attempt in range(4):
        if comm.rank == 1:
            for rail in range(2):  # closes its links (rank 0 reads FIN) and holds its rails down
                comm.inject_fault(rail, "blackhole")
            time.sleep(1.5)
            for rail in range(2):
                comm.inject_fault(rail, "restore")
        comm.all_reduce(buf)  # through once the path is back
        # (rank 0 probes only when every link ended with FIN/RST: when rank 0 moved traffic onto
        # rail 1 first and that link went down otherwise, it did not; then the outage is played again)
        probed[0] = len(rec._probed) if comm.rank == 0 else 0
        comm.all_reduce(probed)
        if probed[0]:
            break
    time.sleep(1.0)  # settled
    w0 = rec.wakeups
    time.sleep(3.0)
    comm.barrier()
    return {"recovery_wakeups": rec.wakeups - w0, "probed": int(probed[0]),
            "wanted": comm._engine.probes_wanted()}


def test_listener_probes_end_when_the_path_is_back():
    res = raise_first(run_ranks(2, _outage_then_idle, rails=RAILS, config=Config(timeout=30), timeout=90))
    assert res[0]["probed"] == 1, res  # rank 0 (it accepts rank 1's links) did probe rank 1's listeners
    for r in res:
        assert r["wanted"] == [] and r["recovery_wakeups"] <= 2, res
