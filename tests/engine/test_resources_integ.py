"""Bounded resources: fds, threads and memory return to their warmed-up
levels after 10^4 operations (a fresh buffer each) and 100 real cable
cut-and-repair cycles; after close() no fd or thread of linkescape is left.
And the RSS of a job that hands every all_reduce a fresh multi-chunk buffer
stays flat, against the same loop on one reused buffer (issue 18)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(__file__), "resources_worker.py")
ITERS = 10_000
CYCLES = 100


def _kinds(fds: dict) -> dict:
    out: dict = {}
    for target in fds.values():
        kind = target.split(":")[0] if ":" in target else target
        out[kind] = out.get(kind, 0) + 1
    return out


@pytest.mark.testbed
def test_resources_return_to_warm_levels_and_close_leaves_nothing(testbed_factory):
    tb = testbed_factory(2, 2)
    store = tempfile.mkdtemp(prefix="linkescape-res-")  # (0700: a FileStore refuses one others can write)
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
        assert end["links_up"], (rank, "a link was not back 20 s after the last repair")
        # re-opened links get new descriptor numbers: count them by kind
        assert _kinds(end["fds"]) == _kinds(warm["fds"]), (rank, _kinds(warm["fds"]), _kinds(end["fds"]))
        assert end["threads"] == warm["threads"], (rank, warm["threads"], end["threads"])
        # RSS: no growth with the operations and cycles (allocator noise aside)
        assert end["rss"] - warm["rss"] < 48 << 20, (rank, warm["rss"], end["rss"])
        before = closed["before"]
        assert closed["threads"] == before["threads"], (rank, before["threads"], closed["threads"])
        assert _kinds(closed["fds"]) == _kinds(before["fds"]), (rank, before["fds"], closed["fds"])


# ---------------------------------------------------------------- issue 18: fresh 4 MiB buffers
SERIES_NBYTES = 4 << 20  # four 1 MiB chunks: the shape whose buffers a finished op kept alive
SERIES_OPS = 18_000  # fresh buffers, measured after the warm-up: 20k operations in all
CONTROL_OPS = 6_000  # the reused buffer: enough to show the allocator's own noise and slope
SERIES_WARMUP = 2_000  # the flight recorder's ring (2000 slots) is full by then
SERIES_EVERY = 500  # 37 samples (13 for the control)
MiB = 1 << 20
#: allocator noise a fresh buffer may legitimately add: what glibc keeps at the top of its heap
#: (it trims beyond twice its mmap threshold) -- 8 MiB plus two buffers
ALLOWANCE = 8 * MiB + 2 * SERIES_NBYTES


def _series(mode: str, ops: int) -> list:
    """Both ranks of the loop on loopback rails: each rank's ``series`` record."""
    store = os.path.join(tempfile.mkdtemp(prefix="linkescape-series-"), "store")
    env = dict(os.environ, LINKESCAPE_RAILS="127.0.0.1,127.0.0.2", PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), "2", store, str(ops), "--series", mode,
                               "--nbytes", str(SERIES_NBYTES), "--warmup", str(SERIES_WARMUP), "--every",
                               str(SERIES_EVERY)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    recs = []
    for (out, err), p in zip(outs, procs):
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        series = [r for r in lines if r["event"] == "series"]
        assert p.returncode == 0 and series, (mode, p.returncode, err[-3000:])
        recs.append(series[0])
    return recs


def _fit(rec: dict) -> dict:
    x, y = np.array(rec["ops"], float), np.array(rec["rss"], float)
    slope = float(np.polyfit(x, y, 1)[0])  # bytes per operation
    return {"slope_per_1k_MiB": slope * 1000 / MiB, "slope": slope, "band": float(y.max() - y.min()),
            "warm_MiB": y[0] / MiB, "end_MiB": y[-1] / MiB, "peak_MiB": y.max() / MiB}


@pytest.mark.timeout(900)  # 28k operations of 4 MiB: about 2 minutes alone, more beside other tests
def test_fresh_4mib_buffers_keep_rss_flat_against_a_reused_buffer(capsys):
    """20k all_reduces of 4 MiB, each on a freshly allocated buffer, 2 ranks: RSS after the warm-up is flat.

    Flat: per rank, RSS sampled every 500 operations after a warm-up of 2000; the least-squares line of the
    fresh run rises over its 18k operations by at most ``ALLOWANCE`` more than the control's slope gives
    over as many (the control: the same loop writing the same values into one reused buffer, 6k operations
    after its warm-up), and the fresh run's band (highest minus lowest sample) is at most the control's plus
    ``ALLOWANCE``. The band is what finds buffers freed only by Python's cycle collector: RSS climbs until a
    full collection, then drops (a saw tooth whose fitted slope is about zero)."""
    control = _series("reused", CONTROL_OPS)
    fresh = _series("fresh", SERIES_OPS)
    report = []
    for rank in range(2):
        f, c = _fit(fresh[rank]), _fit(control[rank])
        report.append((rank, f, c))
        assert fresh[rank]["wrong"] == 0 and control[rank]["wrong"] == 0
    with capsys.disabled():
        for rank, f, c in report:
            print(f"\nrank {rank}: fresh {f['warm_MiB']:.1f} -> {f['end_MiB']:.1f} MiB (peak {f['peak_MiB']:.1f}), "
                  f"slope {f['slope_per_1k_MiB']:+.3f} MiB/1k ops, band {f['band'] / MiB:.1f} MiB; control "
                  f"{c['warm_MiB']:.1f} -> {c['end_MiB']:.1f} MiB, slope {c['slope_per_1k_MiB']:+.3f} MiB/1k ops, "
                  f"band {c['band'] / MiB:.1f} MiB; {fresh[rank]['seconds']:.0f} s / {control[rank]['seconds']:.0f} s")
    for rank, f, c in report:
        # the fitted lines, over the fresh run's span
        assert (f["slope"] - c["slope"]) * SERIES_OPS <= ALLOWANCE, (rank, f, c, fresh[rank]["rss"])
        assert f["band"] <= c["band"] + ALLOWANCE, (rank, f, c, fresh[rank]["rss"])


# ---------------------------------------------------------------- a timed-out wait keeps nothing alive
def _timed_out_wait(comm):
    import gc
    import weakref

    from linkescape.errors import CommTimeout

    buf = np.ones(1024, np.float32)
    if comm.rank == 1:
        time.sleep(0.5)  # rank 0's first wait runs out meanwhile
        comm.all_reduce(buf)
        return None

    class Marker:
        pass

    def waiter(work):
        marker = Marker()  # a local of the frame that waits, as a caller's buffers would be
        try:
            work.wait(timeout=0.01)
        except CommTimeout:
            pass
        return weakref.ref(marker)

    work = comm.all_reduce(buf, async_op=True)
    gc.disable()  # only reference counting: what a job sees between two runs of the cycle collector
    try:
        ref = waiter(work)
        kept = ref() is not None
    finally:
        gc.enable()
    work.wait(timeout=30)
    return kept


def test_a_timed_out_wait_leaves_no_reference_cycle():
    from linkescape.testing import raise_first, run_ranks

    kept = raise_first(run_ranks(2, _timed_out_wait, rails=("127.0.0.1", "127.0.0.2"), timeout=60))[0]
    assert kept is False, "the waiting frame's locals outlived it: a reference cycle through the CommTimeout"
