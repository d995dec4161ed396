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
