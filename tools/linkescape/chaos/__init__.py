"""``linkescape chaos``: a soak of random, overlapping faults on a testbed under a verified workload.

* :mod:`.workload`: the steps every rank derives from the seed, with exact references;
* :mod:`.worker`: one rank (runs inside a testbed host);
* :mod:`.ranks`: the rank processes and what they report;
* :mod:`.controller`: testbed, ranks, the fault schedule (:mod:`linkescape.faults`), live view;
* :mod:`.analysis`: stalls against their bounds, detection latency, false trips;
* :mod:`.report`: the report (JSON and text); :mod:`.cli`: the command.
"""

from .controller import ChaosOptions, plan, run_chaos

__all__ = ["ChaosOptions", "plan", "run_chaos"]
