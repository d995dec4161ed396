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
  than cores);
- ``caller_cpu_us``, ``caller_vcsw``, ``caller_ivcsw``: the same for the
  calling thread alone (``RUSAGE_THREAD``). The rest is the backend's threads:
  a caller that sleeps once per call while a progress thread does the work
  shows a voluntary switch per call in both, one hand-off each way.
"""

from __future__ import annotations

import resource
from typing import Dict, NamedTuple


class Usage(NamedTuple):
    cpu_s: float
    vcsw: int
    ivcsw: int
    caller_cpu_s: float
    caller_vcsw: int
    caller_ivcsw: int


_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux


def now() -> Usage:
    r = resource.getrusage(resource.RUSAGE_SELF)
    t = resource.getrusage(_THREAD) if _THREAD is not None else r
    return Usage(r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw, t.ru_utime + t.ru_stime, t.ru_nvcsw, t.ru_nivcsw)


def _diff(before: Usage, after: Usage) -> Dict[str, float]:
    return {"cpu_us": (after.cpu_s - before.cpu_s) * 1e6, "vcsw": after.vcsw - before.vcsw,
            "ivcsw": after.ivcsw - before.ivcsw, "caller_cpu_us": (after.caller_cpu_s - before.caller_cpu_s) * 1e6,
            "caller_vcsw": after.caller_vcsw - before.caller_vcsw,
            "caller_ivcsw": after.caller_ivcsw - before.caller_ivcsw}


def per_call(before: Usage, after: Usage, calls: int) -> Dict[str, float]:
    """The difference of two readings, per call (``KEYS``)."""
    calls = max(1, calls)
    return {k: v / calls for k, v in _diff(before, after).items()}


def add(total: Dict[str, float], before: Usage, after: Usage) -> None:
    """Adds one call's usage (``after - before``) into ``total``."""
    for k, v in _diff(before, after).items():
        total[k] = total.get(k, 0) + v


KEYS = ("cpu_us", "vcsw", "ivcsw", "caller_cpu_us", "caller_vcsw", "caller_ivcsw")
