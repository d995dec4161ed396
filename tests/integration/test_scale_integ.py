"""64 ranks on this machine (numpy only, a TCPStore): every collective is
exact, and a real cut of one host's rail (carrier loss) is survived with
nothing wrong. 4 testbed hosts x 16 ranks, 2 rails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

pytestmark = [pytest.mark.testbed, pytest.mark.slow]
pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(__file__), "scale_worker.py")
RANKS, HOSTS, PORT = 64, 4, 29631


@pytest.mark.timeout(900)
def test_64_ranks_every_collective_exact_and_a_rail_cut_survived(testbed_factory):
    tb = testbed_factory(HOSTS, 2)
    work = tempfile.mkdtemp(prefix="linkescape-scale-")
    stop = os.path.join(work, "stop")
    env = dict(os.environ, LINKESCAPE_RAILS=",".join(tb.rail_nics), PYTHONUNBUFFERED="1",
               TORCH_DEVICE_BACKEND_AUTOLOAD="0", OMP_NUM_THREADS="1")
    master = tb.mgmt_addr(0)
    host_of = [r * HOSTS // RANKS for r in range(RANKS)]
    # one launcher per host forks that host's ranks (see scale_worker.py)
    procs = [tb.popen(h, [sys.executable, WORKER, ",".join(str(r) for r in range(RANKS) if host_of[r] == h),
                          str(RANKS), master, str(PORT), stop, work], env=env, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True) for h in range(HOSTS)]
    recs: dict = {r: [] for r in range(RANKS)}

    def pump(proc):
        for line in proc.stdout:
            rec = json.loads(line)
            recs[rec["rank"]].append(rec)
    pumps = [threading.Thread(target=pump, args=(p,), daemon=True) for p in procs]
    for t in pumps:
        t.start()

    def have(event):
        return all(any(x["event"] == event for x in recs[r]) for r in range(RANKS))

    def exited(r):
        return next((x["code"] for x in recs[r] if x["event"] == "exit"), None)

    def tail(r):
        try:
            with open(os.path.join(work, f"stderr-{r}.txt")) as f:
                return f.read()[-2000:]
        except FileNotFoundError:
            return "(no stderr file: the launcher failed)\n" + "".join(
                p.stderr.read()[-2000:] for p in procs if p.poll() is not None)
    try:
        deadline = time.monotonic() + 600
        while not have("checked") and time.monotonic() < deadline:
            dead = [r for r in range(RANKS) if exited(r) not in (None, 0)]
            dead += [r for r in range(RANKS) if procs[host_of[r]].poll() not in (None, 0)][:1]
            assert not dead, (dead, tail(dead[0]))
            time.sleep(0.2)
        assert have("checked"), [r for r in range(RANKS) if not recs[r]]
        tb.cut(1, 0)  # host 1 (16 ranks) loses rail 0's carrier under traffic
        time.sleep(3.0)
        tb.restore(1, 0)
        time.sleep(3.0)  # the rail is back and in use again after the hold-down
        open(stop, "w").close()
        for p in procs:
            p.wait(timeout=300)
        for t in pumps:
            t.join(timeout=5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r in range(RANKS):
        by = {x["event"]: x for x in recs[r]}
        assert exited(r) == 0, (r, tail(r))
        assert by["checked"]["wrong"] == 0, (r, by)
        assert by["end"]["wrong"] == 0 and by["end"]["iters"] >= 5, (r, by)
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]
    # the cut really took links down: every rank on host 1 lost rail 0 to every peer off it
    for r in range(RANKS):
        if host_of[r] == 1:
            assert {x["event"]: x for x in recs[r]}["end"]["links_failed"] >= RANKS - RANKS // HOSTS, r
