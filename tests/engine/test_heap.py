"""Heap trimming after an outage (engine/heap.py): asked for by the events
that end an outage, done at most once a second, off when configured so, and
it gives free heap pages back to the system (glibc)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from linkescape import Config
from linkescape.engine import heap
from linkescape.engine.heap import HeapTrimmer
from linkescape.testing import raise_first, run_ranks

pytestmark = pytest.mark.skipif(not heap.available(), reason="needs glibc's malloc_trim")

RAILS = ("127.0.0.1", "127.0.0.2")


def test_a_request_is_done_once_and_not_sooner_than_the_interval():
    t = HeapTrimmer(interval=1.0, trim=lambda pad: 1)  # (a quick trim: the interval rules)
    assert t.due() is None and not t.run(0.0)
    assert t.request() is True and t.request() is False  # one wake-up for requests that pile up
    assert t.run(5.0) and t.count == 1 and t.due() is None
    assert t.request() is True
    assert t.due() == 6.0 and not t.run(5.5) and t.count == 1  # within the interval: waits
    assert t.run(6.0) and t.count == 2


def test_a_slow_trim_spaces_the_next_ones_out():
    calls = []

    def slow(pad):
        calls.append(pad)
        time.sleep(0.03)  # a large heap's trim
        return 1

    t = HeapTrimmer(interval=1.0, trim=slow)
    assert t.request() and t.run(10.0) and calls == [0] and t.took >= 0.03
    assert t.request() and t.due() >= 10.0 + 100 * 0.03  # 3 s: at most 1 % of the time trimming
    assert not t.run(11.5) and t.run(t.due()) and len(calls) == 2


def test_off_means_never():
    t = HeapTrimmer(enabled=False)
    assert t.request() is False and t.due() is None and not t.run(1e9) and t.count == 0


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _outage(comm, fragment, wait):
    r = comm.rank
    buf = np.full(1 << 16, r + 1, np.float32)
    comm.all_reduce(buf)
    eng = comm._engine
    # the backups open right after start-up (link_up: a trim of its own); let that settle first
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
            eng.heap.wanted or not all(l["usable"] for p in comm.snapshot()["peers"].values() for l in p["links"])):
        time.sleep(0.02)
    before = eng.heap.count
    held = freed = 0
    keep = None
    if r == 0 and fragment:
        # What an outage leaves: frames freed between live ones, so glibc's heap keeps their pages
        # (below the mmap threshold, which a freed 2 MiB frame raises).
        big = bytes(1 << 21)
        del big
        chunks = [bytes(200_000) for _ in range(300)]
        rss_full = _rss()
        keep = chunks[1::2]
        del chunks  # every other one: 150 holes of 200 kB between live chunks
        held = _rss()
        freed = rss_full - held
    if r == 0:
        comm.inject_fault(0, "cut")
    comm.all_reduce(buf)
    comm.barrier()
    if r == 0:
        comm.inject_fault(0, "restore")
    deadline = time.monotonic() + wait
    while r == 0 and eng.heap.count == before and time.monotonic() < deadline:
        time.sleep(0.05)  # the link comes back up: an outage ended
    comm.barrier()
    after = _rss()
    del keep
    return eng.heap.count - before, held, after, freed, float(buf[0])


def test_the_end_of_an_outage_gives_the_heap_back():
    res = raise_first(run_ranks(2, _outage, True, 10.0, rails=RAILS, config=Config(failback_holddown=0.2, timeout=30)))
    trims, held, after, freed_by_free, value = res[0]
    assert value == 6.0  # (1 + 2) all-reduced twice
    assert trims >= 1
    # 150 x 200 kB (30 MB) freed between live chunks stayed resident (free() gave back little); the trim gave
    # back at least a third of it (other allocations may have taken some holes meanwhile: 20 MB of 30 in a
    # rank forked from a pytest worker of 200 MB). With the trim off, RSS does not fall at all.
    assert freed_by_free < 10e6 and held - after > 10e6, (held, after, freed_by_free)


def test_no_trim_when_turned_off():
    cfg = Config(failback_holddown=0.2, timeout=30, malloc_trim=False)
    res = raise_first(run_ranks(2, _outage, False, 1.5, rails=RAILS, config=cfg))
    assert res[0][0] == 0


def test_usage_counts_what_is_allocated_and_what_is_freed():
    """glibc's account (mallinfo2): a block held shows in ``in_use``; freed, it leaves it."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = heap.usage()
    assert before is not None and before["in_use"] > 0
    blocks = [libc.malloc(1000) for _ in range(2000)]  # 2 MB in small blocks: inside the heap, not mapped
    held = heap.usage()
    for b in blocks:
        libc.free(b)
    after = heap.usage()
    assert held["in_use"] - before["in_use"] >= 1_900_000
    assert held["in_use"] - after["in_use"] >= 1_900_000


_THRESHOLDS_JOB = r"""
import sys
import numpy as np
from linkescape import Config
from linkescape.engine import heap
from linkescape.testing import raise_first, run_ranks


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def job(comm):
    # A job's first large buffer, freed: glibc (left alone) raises its thresholds to its size.
    big = np.ones(3 << 20, np.float64)  # 24 MiB
    comm.all_reduce(big)
    del big
    keep = []
    for i in range(10):  # warm-up
        comm.all_reduce(np.full(1 << 20, i, np.float32))
    before = rss()
    for i in range(60):  # fresh 4 MiB and 16 MiB buffers, a small live object between them
        buf = np.full(1 << 20, i + comm.rank, np.float32)
        keep.append(np.ones(64))
        comm.all_reduce(buf)
        assert buf[0] == 2 * i + 1, buf[0]
        more = np.full(1 << 22, 1, np.float32)
        del more, buf
    comm.barrier()
    return rss() - before, str(heap._pinned)  # what the engine did: None when told not to


on = sys.argv[1] == "1"
res = raise_first(run_ranks(2, job, rails=("127.0.0.1",), config=Config(malloc_thresholds=on, timeout=30)))
print(max(r[0] for r in res), res[0][1])
"""


def _thresholds_job(on: bool):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    # a fresh interpreter: glibc's thresholds as a new process has them
    out = subprocess.run([sys.executable, "-c", _THRESHOLDS_JOB, "1" if on else "0"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    grown, state = out.stdout.split()
    return int(grown), state


def test_fresh_large_buffers_leave_rss_once_the_thresholds_are_pinned():
    """glibc raises its mmap threshold when a large block is freed (then up to twice that stays at the heap's top):
    fresh 4 and 16 MiB buffers after a 24 MiB one kept ~20 MB resident. The engine pins the thresholds at start-up;
    the control (``malloc_thresholds=False``, glibc left alone) shows the test can fail."""
    grown_off, state_off = _thresholds_job(False)
    grown_on, state_on = _thresholds_job(True)
    assert state_on == "pinned" and state_off == "None"
    assert grown_on < 4e6, (grown_on, grown_off)
    assert grown_off > 10e6, (grown_on, grown_off)


def test_an_operators_glibc_settings_win():
    calls = []
    heap._pinned = None
    try:
        assert heap.pin_thresholds({"MALLOC_MMAP_THRESHOLD_": "65536"}, mallopt=lambda *a: calls.append(a) or 1) \
            == "operator"
        heap._pinned = None
        assert heap.pin_thresholds({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
                                   mallopt=lambda *a: calls.append(a) or 1) == "operator"
        assert calls == []
        heap._pinned = None
        assert heap.pin_thresholds({}, mallopt=lambda *a: calls.append(a) or 1) == "pinned"
        assert calls == [(-3, heap.MMAP_THRESHOLD), (-1, heap.TRIM_THRESHOLD)]
        assert heap.pin_thresholds({}, mallopt=lambda *a: 0) == "pinned"  # once per process
    finally:
        heap._pinned = None
        heap.pin_thresholds()  # this process as the engine leaves it
