"""The failover benchmark: ``linkescape bench --faults cut,blackhole[,flap]``.

On a testbed (``hosts`` network namespaces x ``rails`` veth rails shaped to
``rate`` with tbf) one rank per host runs a saturating all_reduce
(:mod:`.worker`: ``depth`` asynchronous all_reduces of
``size`` bytes always in flight, every result checked bit for bit). While it
runs, ``count`` faults of each kind hit the primary rail (rail 0) of one host
after another (host ``i % hosts``): fault, hold, restore, wait for failback,
settle, next. Measured:

* **detection**: fault timestamp (what ``Testbed.cut``/``blackhole`` return) ->
  first ``failover`` event of the faulty host's rank (*local*) and of every
  other rank for its link to the faulty rank (*peer side*, one sample per
  fault and peer; *all peers* = the last of them per fault).
* **throughput restored**: from the bridge-side veth counters in the root
  namespace (bytes each host's NIC really put on the wire after tbf, sampled
  every ``sample_ms``): the faulty host's egress over all rails in windows of
  ``window_ms``; first window after the fault whose rate is >= 90 % (and 50 %)
  of the reference, reported from the fault and from the local detection. The
  reference is ``min(rail rate, p90 of the pre-fault windows)``: what the
  wire carries when busy (a ring all_reduce has short bubbles between steps,
  so the pre-fault *mean* is below the line rate).
* **failback**: restore timestamp -> ``failback`` events, and -> the first
  window with >= 90 % of the reference on rail 0 again.
* **overhead**: healthy busbw with the backup rails (``LINKESCAPE_RAILS`` =
  every rail) vs one rail (``r0``), alternating runs.
* **correctness**: wrong elements, errors, hangs, and link events that no
  fault explains (false trips).
* **the job's rate**: rank 0's completed all_reduces per second during each
  fault against the second before it; and with ``--rate-phases``
  (:mod:`.rates`) over whole phases of one run (healthy, during a cut, a
  blackhole and a flap, after the repairs), per policy.
* **MPTCP**: a plain MPTCP bulk transfer between two hosts of a 2-host
  testbed with the same rails, the primary rail of the sender cut; time until
  half (and 90 %) of the rate is back on the other rail. linkescape is run
  through the same cuts on the same testbed for a like-for-like comparison.

Everything runs in throwaway testbeds (:func:`temporary_testbed`) and every
process is stopped in ``finally`` blocks.

The package, by lifecycle: :mod:`.settings` (what a run does, targets),
:mod:`.job` / :mod:`.worker` (the ranks, a shared
:class:`~linkescape.testbed.job.RankJob`), :mod:`.series` (run the fault
series and the overhead runs; the NIC counters and kernel events come from
the testbed's sampler, :mod:`linkescape.testbed.counters`), :mod:`.rates`
(the rate phases), :mod:`.analysis`, :mod:`.compare` and :mod:`.mptcp`
(MPTCP), :mod:`.report`, :mod:`.bench` (a whole run), :mod:`.cli`. Names are
imported from here lazily, so the rank processes load only what they run.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it (of this package, or ``module:name`` elsewhere)
_NAMES = {
    "run_failover_bench": "bench", "run_rate_bench": "bench", "library_defaults": "bench",
    "format_report": "report", "verdict": "report", "ok": "report",
    "add_failover_options": "cli", "run_failover_cli": "cli", "failover": "cli", "rails_count": "cli", "main": "cli",
    "Counters": "linkescape.testbed.counters", "kernel_time": "linkescape.testbed.counters",
    "parse_rate": "linkescape.testbed.netns:rate_bps", "summarize": "linkescape.faults.measure",
    "Settings": "settings", "PhaseSettings": "settings", "FAULT_KINDS": "settings", "DEFAULT_FAULTS": "settings",
    "POLICIES": "settings", "TARGETS": "settings",
    "analyze_series": "analysis", "find_stalls": "analysis", "busbw_from_dones": "analysis", "ops_rate": "analysis",
    "run_fault_series": "series", "run_overhead": "series", "namespace_congestion": "series",
    "run_mptcp_series": "compare", "run_mptcp_comparison": "compare",
    "run_rate_phases": "rates", "format_rates": "rates",
    "Sampler": "linkescape.testbed.counters:NicSampler", "FailoverJob": "job",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    where = _NAMES.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    mod, _, attr = where.partition(":")
    value = getattr(importlib.import_module(mod if "." in mod else f"{__name__}.{mod}"), attr or name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMES))
