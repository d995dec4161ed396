"""Bounded resources: fds, threads and memory return to their warmed-up
levels after 10^4 operations (a fresh buffer each) and 100 real cable
cut-and-repair cycles; after close() no fd or thread of linkescape is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

pytestmark = pytest.mark.testbed

WORKER = os.path.join(os.path.dirname(__file__), "resources_worker.py")
ITERS = 10_000
CYCLES = 100


def _kinds(fds: dict) -> dict:
    out: dict = {}
    for target in fds.values():
        kind = target.split(":")[0] if ":" in target else target
        out[kind] = out.get(kind, 0) + 1
    return out


def test_resources_return_to_warm_levels_and_close_leaves_nothing(testbed_factory):
    tb = testbed_factory(2, 2)
    store = tempfile.mkdtemp(prefix="linkescape-res-")
    os.chmod(store, 0o777)
    env = dict(os.environ, LINKESCAPE_RAILS=",".join(tb.rail_nics), LINKESCAPE_FAILBACK_HOLDDOWN_MS="100",
               PYTHONUNBUFFERED="1")
    procs = [tb.popen(h, [sys.executable, WORKER, str(h), "2", store, str(ITERS)], env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for h in range(2)]
    lines = {0: [], 1: []}

    def pump(rank, proc):
        for line in proc.stdout:
            lines[rank].append(json.loads(line))
    pumps = [threading.Thread(target=pump, args=(r, p), daemon=True) for r, p in enumerate(procs)]
    for t in pumps:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while not all(lines[r] for r in range(2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(lines[r] for r in range(2)), [p.stderr.read() for p in procs if p.poll() is not None]
        for _ in range(CYCLES):  # real carrier loss and repair of host 0's rail 0, under traffic
            tb.cut(0, 0)
            time.sleep(0.03)
            tb.restore(0, 0)
            time.sleep(0.07)
        time.sleep(1.0)  # the last repair's link is back
        open(os.path.join(store, "stop"), "w").close()
        for p in procs:
            p.wait(timeout=300)
        for t in pumps:
            t.join(timeout=5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank in range(2):
        recs = {r["event"]: r for r in lines[rank]}
        assert set(recs) == {"warm", "end", "closed"}, (rank, lines[rank], procs[rank].stderr.read())
        warm, end, closed = recs["warm"], recs["end"], recs["closed"]
        assert end["wrong"] == 0 and end["iters"] >= ITERS
        # re-opened links get new descriptor numbers: count them by kind
        assert _kinds(end["fds"]) == _kinds(warm["fds"]), (rank, _kinds(warm["fds"]), _kinds(end["fds"]))
        assert end["threads"] == warm["threads"], (rank, warm["threads"], end["threads"])
        # RSS: no growth with the operations and cycles (allocator noise aside)
        assert end["rss"] - warm["rss"] < 48 << 20, (rank, warm["rss"], end["rss"])
        before = closed["before"]
        assert closed["threads"] == before["threads"], (rank, before["threads"], closed["threads"])
        assert _kinds(closed["fds"]) == _kinds(before["fds"]), (rank, before["fds"], closed["fds"])
