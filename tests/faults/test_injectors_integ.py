"""Both injectors against the real thing: communicators on loopback, and a testbed."""

from __future__ import annotations

import tempfile
import threading
import time

import numpy as np
import pytest

from linkescape import Communicator, Config, FileStore
from linkescape.faults import EmulatedInjector, ScheduleRunner, TestbedInjector, scripted
from linkescape.testbed.pytest_fixtures import require_nft, testbed  # noqa: F401

RAILS = ("127.0.0.1", "127.0.0.2")


def test_emulated_schedule_fails_over_in_process_communicators_without_a_wrong_result():
    store = tempfile.mkdtemp(prefix="le-faults-")
    comms = [None, None]
    cfg = Config(failback_holddown=0.2, timeout=30)

    def make(rank):
        comms[rank] = Communicator(FileStore(store, timeout=30), rank, 2, rails=list(RAILS), config=cfg)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(comms)
    plan = scripted([{"kind": "cut", "host": 0, "rail": 0, "at": 0.1, "hold": 0.4},
                     {"kind": "blackhole", "host": 1, "rail": 1, "at": 0.8, "hold": 0.3}], hosts=2, rails=2)
    runner = ScheduleRunner(plan, EmulatedInjector.in_process(comms)).start()
    wrong = [0, 0]
    done = threading.Event()

    def work(rank):
        comm = comms[rank]
        it = 0
        while True:
            buf = np.full(4096, rank + it, np.int64)
            comm.all_reduce(buf)
            wrong[rank] += int(np.count_nonzero(buf != 2 * it + 1))
            flag = np.array([1 if done.is_set() else 0], np.int32)
            comm.all_reduce(flag)  # both ranks stop after the same iteration
            it += 1
            if flag[0]:
                return

    workers = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in workers:
        t.start()
    assert runner.join(20)
    done.set()
    for t in workers:
        t.join(30)
    assert not any(t.is_alive() for t in workers)
    try:
        assert wrong == [0, 0] and not runner.errors()
        ev0 = [(e["event"], e["cause"], e["rail"]) for e in comms[0].events.recent()]
        ev1 = [(e["event"], e["cause"], e["rail"]) for e in comms[1].events.recent()]
        assert ("link_down", "carrier", 0) in ev0  # the cut on host 0 rail 0
        assert ("link_down", "peer_carrier", 0) in ev1  # told to its peer
        assert ("link_down", "timeout", 1) in ev1  # the blackhole on host 1 rail 1: silent
    finally:
        for c in comms:
            c.close()


@pytest.mark.testbed
def test_testbed_injector_composes_mechanisms_on_one_nic(testbed):
    require_nft()
    tb = testbed
    seen = []

    def after(rec):  # runs in the runner's thread right after each change: no timing guesses
        st = tb.link_state(rec["host"], rec["rail"])
        seen.append((rec["fault"], rec["action"], st.cut, st.blackholed, st.lossy))

    plan = scripted([{"kind": "cut", "host": 0, "rail": 1, "at": 0.0, "hold": 0.4},
                     {"kind": "blackhole", "host": 0, "rail": 1, "at": 0.2, "hold": 0.4},
                     {"kind": "lossy", "host": 0, "rail": 1, "at": 0.3, "hold": 0.4, "loss": 7.5}], hosts=2, rails=2)
    runner = ScheduleRunner(plan, TestbedInjector(tb), on_step=after).start()
    assert runner.join(20) and not runner.errors()
    assert seen == [(0, "apply", True, False, None), (1, "apply", True, True, None),
                    (2, "apply", True, True, 7.5), (0, "repair", False, True, 7.5),
                    (1, "repair", False, False, 7.5), (2, "repair", False, False, None)]
    assert tb.link_state(0, 1).usable and not tb.link_state(0, 1).degraded


@pytest.mark.testbed
def test_testbed_injector_stop_repairs_a_cut_isolated_host(testbed):
    tb = testbed
    plan = scripted([{"kind": "isolate", "targets": [[1, 0], [1, 1]], "at": 0.0, "hold": 60}], hosts=2, rails=2)
    runner = ScheduleRunner(plan, TestbedInjector(tb)).start()
    deadline = time.monotonic() + 10
    while len(runner.log) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not tb.link_state(1, 0).carrier and not tb.link_state(1, 1).carrier
    runner.stop()
    assert tb.link_state(1, 0).usable and tb.link_state(1, 1).usable
