"""Giving freed heap memory back to the system once an outage is over.

While a path is down a rank holds what it may have to send again (replay),
frames that arrived out of order (the stash) and frames it relays for others;
all of it is freed once the path is back. glibc keeps freed pages in its heaps,
scattered among live objects, so without help the process's resident memory
keeps the high-water mark of the worst outage so far, and over a long run of
faults it climbs: in a chaos soak (4 ranks, every fault kind) about 40 % of a
rank's RSS was free heap (92 MB resident, 56 MB after ``malloc_trim(0)``,
which took 3 ms).

So the end of an outage (a link back up, traffic back on a repaired rail)
asks for a trim, and the recovery thread does it, off the data path, at most
once every ``MIN_INTERVAL`` seconds, and no sooner than ``COST_FACTOR`` times
the last trim's duration (a training process with a heap of gigabytes trims
less often than a small one). Its cost is one heap walk per outage
(a few ms for a 100 MB heap), nothing per peer and nothing periodic; a
healthy job never trims. Not glibc (musl, macOS): nothing happens.
``LINKESCAPE_MALLOC_TRIM=0`` turns it off.

glibc also moves its own thresholds: the first time a block it had mapped on
its own (``MMAP_THRESHOLD``, 128 KiB at start) is freed, it raises that
threshold to the block's size and the heap's trim threshold to twice that
(up to 32 and 64 MiB). From then on a job's fresh large buffers come from the
heap, and up to 64 MiB freed at its top stays resident: in an hour of chaos
(seed 251) the free top chunk reached 62 MB while the live heap stayed at
10-13 MB, and the RSS's floor climbed 28-31 MB an hour as that window filled.
``pin_thresholds`` fixes them once per process when the engine starts
(``mallopt``, which also turns glibc's sliding off): the mmap threshold at
glibc's own ceiling, 32 MiB (smaller buffers are reused from the heap, as
glibc ends up doing: mapping every 4 MiB buffer afresh made a 4-rank 4 MiB
all_to_all take 5.5 ms instead of 2.8, its copy faulting in every page), and
the trim threshold at 16 MiB instead of 64: at most that much freed memory
stays at the heap's top. A process whose operator set glibc's own variables
(``MALLOC_*_``, ``GLIBC_TUNABLES=glibc.malloc.*``) is left as it is;
``LINKESCAPE_MALLOC_THRESHOLDS=0`` leaves every process as it is.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from typing import Optional

log = logging.getLogger("linkescape.engine")

#: seconds between two trims, at least (a flapping rail asks many times)
MIN_INTERVAL = 1.0
#: ... and at least this many times the last trim's duration: a process with a large
#: heap (a training job's), whose trim takes longer, trims less often (<= 1 % of the time)
COST_FACTOR = 100.0

#: blocks of this size and more are mapped on their own (glibc starts at 128 KiB and slides up to 32 MiB)
MMAP_THRESHOLD = 32 << 20
#: the heap gives its free top back above this (glibc: twice the mmap threshold, up to 64 MiB)
TRIM_THRESHOLD = 16 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc's own settings for what pin_thresholds sets: an operator's choice wins
_GLIBC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_GLIBC_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad",
                   "glibc.malloc.mmap_max")

_trim = None
_loaded = False
_pinned: Optional[str] = None


_process = None


def _own_symbols():
    """The process's own symbols (libc's among them), loaded once: each ``ctypes.CDLL``
    is a ``dlopen`` and a class of its own, at every rank's start-up."""
    global _process
    if _process is None:
        _process = ctypes.CDLL(None)
    return _process


def _load():
    global _trim, _loaded
    if not _loaded:
        _loaded = True
        try:
            # the process's own symbols (libc's among them); not ctypes.util.find_library,
            # which runs ldconfig in a subprocess: a start-up cost on every rank
            _trim = _own_symbols().malloc_trim
            _trim.argtypes = [ctypes.c_size_t]
            _trim.restype = ctypes.c_int
        except (OSError, AttributeError):
            _trim = None
    return _trim


def available() -> bool:
    """The C library can give heap memory back (glibc)."""
    return _load() is not None


def pin_thresholds(environ=None, mallopt=None) -> str:
    """Fix glibc's mmap and trim thresholds for this process, once (see the module's text).

    Returns what was done: "pinned", "operator" (glibc's own variables are set: left alone),
    or "unavailable" (not glibc). Later calls return the first call's answer.
    """
    global _pinned
    if _pinned is not None:
        return _pinned
    env = os.environ if environ is None else environ
    tunables = env.get("GLIBC_TUNABLES", "")
    if any(env.get(k) for k in _GLIBC_VARS) or any(t in tunables for t in _GLIBC_TUNABLES):
        _pinned = "operator"
        return _pinned
    fn = mallopt
    if fn is None:
        try:
            fn = _own_symbols().mallopt
            fn.argtypes = [ctypes.c_int, ctypes.c_int]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            _pinned = "unavailable"
            return _pinned
    ok = fn(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and fn(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    _pinned = "pinned" if ok else "unavailable"
    log.debug("heap thresholds: %s (mmap %d, trim %d bytes)", _pinned, MMAP_THRESHOLD, TRIM_THRESHOLD)
    return _pinned


class HeapTrimmer:
    """Trims when asked, at most once every ``interval`` seconds; a request
    that comes sooner waits for ``due``."""

    def __init__(self, enabled: bool = True, interval: float = MIN_INTERVAL, trim=None) -> None:
        self._fn = trim or _load()
        self.enabled = enabled and self._fn is not None
        self.interval = interval
        #: the last trim's duration (seconds): the next waits COST_FACTOR times that, at least
        self.took = 0.0
        self.wanted = False
        self.last: Optional[float] = None
        #: trims done (the tests read it)
        self.count = 0

    def request(self) -> bool:
        """An outage ended; True when the request is new (wake the trimming thread)."""
        if not self.enabled or self.wanted:
            return False
        self.wanted = True
        return True

    def due(self) -> Optional[float]:
        """When the wanted trim may run; None when none is wanted."""
        if not self.wanted:
            return None
        return 0.0 if self.last is None else self.last + max(self.interval, COST_FACTOR * self.took)

    def run(self, now: float) -> bool:
        """Trim if one is wanted and due (call from a thread off the data path)."""
        due = self.due()
        if due is None or now < due:
            return False
        self.wanted = False
        self.last = now
        t = time.perf_counter()
        try:
            self._fn(0)
        except Exception:  # noqa: BLE001 - memory hygiene must never break the rank
            log.debug("malloc_trim failed", exc_info=True)
            return False
        finally:
            self.took = time.perf_counter() - t
        self.count += 1
        return True


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


_mallinfo2 = None


def usage() -> Optional[dict]:
    """glibc's account of the heap (``mallinfo2``, glibc >= 2.33), in bytes, or None elsewhere.

    ``in_use``: allocated and not freed (the main arena and the threads' arenas);
    ``free``: freed but still inside the heaps (what fragmentation keeps resident, part of it);
    ``mmapped``: large blocks mapped on their own (freed straight back to the system).
    A leak grows ``in_use``; fragmentation grows ``free`` while ``in_use`` stays.
    """
    global _mallinfo2
    if _mallinfo2 is None:
        try:
            fn = _own_symbols().mallinfo2
            fn.restype = _Mallinfo2
            fn.argtypes = []
            _mallinfo2 = fn
        except (OSError, AttributeError):
            _mallinfo2 = False
    if not _mallinfo2:
        return None
    mi = _mallinfo2()
    return {"arena": mi.arena, "in_use": mi.uordblks, "free": mi.fordblks, "mmapped": mi.hblkhd,
            "top_pad": mi.keepcost}


__all__ = ["HeapTrimmer", "MIN_INTERVAL", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "available", "pin_thresholds", "usage"]
