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
    errs = [open(os.path.join(work, f"stderr-{r}.txt"), "w") for r in range(RANKS)]
    procs = [tb.popen(host_of[r], [sys.executable, WORKER, str(r), str(RANKS), master, str(PORT), stop], env=env,
                      stdout=subprocess.PIPE, stderr=errs[r], text=True) for r in range(RANKS)]
    recs: dict = {r: [] for r in range(RANKS)}

    def pump(r, proc):
        for line in proc.stdout:
            recs[r].append(json.loads(line))
    pumps = [threading.Thread(target=pump, args=(r, p), daemon=True) for r, p in enumerate(procs)]
    for t in pumps:
        t.start()

    def have(event):
        return all(any(x["event"] == event for x in recs[r]) for r in range(RANKS))

    def tail(r):
        with open(os.path.join(work, f"stderr-{r}.txt")) as f:
            return f.read()[-2000:]
    try:
        deadline = time.monotonic() + 600
        while not have("checked") and time.monotonic() < deadline:
            dead = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
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
        for f in errs:
            f.close()
    for r in range(RANKS):
        by = {x["event"]: x for x in recs[r]}
        assert procs[r].returncode == 0, (r, tail(r))
        assert by["checked"]["wrong"] == 0, (r, by)
        assert by["end"]["wrong"] == 0 and by["end"]["iters"] >= 5, (r, by)
    # the cut really took links down: every rank on host 1 lost rail 0 to every peer off it
    for r in range(RANKS):
        if host_of[r] == 1:
            assert {x["event"]: x for x in recs[r]}["end"]["links_failed"] >= RANKS - RANKS // HOSTS, r
