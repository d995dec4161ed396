"""What a rank process spends on a call: CPU time and context switches, from getrusage.

``RUSAGE_SELF`` (the whole process, every thread), not ``RUSAGE_THREAD``: a
call's work is split between the caller and the backend's own threads
(linkescape's progress and receive threads, Gloo's and Open MPI's), and what a
rank costs its core is all of it. Background threads idle in the same window
(a beacon, a watchdog) are counted too; they are measured alone by
``--scale``'s idle CPU column.

- ``cpu_us``: user + system CPU microseconds;
- ``vcsw``: voluntary context switches (the process blocked: a wait on a
  socket, a lock, a condition; each a sleep and a wake-up);
- ``ivcsw``: involuntary ones (the scheduler took the core away: more ranks
  than cores).
"""

from __future__ import annotations

import resource
from typing import Dict, NamedTuple


class Usage(NamedTuple):
    cpu_s: float
    vcsw: int
    ivcsw: int


def now() -> Usage:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return Usage(r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw)


def per_call(before: Usage, after: Usage, calls: int) -> Dict[str, float]:
    """The difference of two readings, per call: ``cpu_us``, ``vcsw``, ``ivcsw``."""
    calls = max(1, calls)
    return {"cpu_us": (after.cpu_s - before.cpu_s) * 1e6 / calls, "vcsw": (after.vcsw - before.vcsw) / calls,
            "ivcsw": (after.ivcsw - before.ivcsw) / calls}


def add(total: Dict[str, float], before: Usage, after: Usage) -> None:
    """Adds one call's usage (``after - before``) into ``total``."""
    total["cpu_us"] = total.get("cpu_us", 0.0) + (after.cpu_s - before.cpu_s) * 1e6
    total["vcsw"] = total.get("vcsw", 0) + after.vcsw - before.vcsw
    total["ivcsw"] = total.get("ivcsw", 0) + after.ivcsw - before.ivcsw


KEYS = ("cpu_us", "vcsw", "ivcsw")
