"""One fault schedule for the demo, the failover benchmark and the chaos soak.

* :mod:`.schedule`: a plan of timed faults and repairs, random (seeded) or
  scripted, overlapping allowed; when the cluster has a path left.
* :mod:`.injectors`: one interface that makes the faults, two implementations:
  on a testbed (real: carrier cut, nftables blackhole and lossy) and emulated
  (``Communicator.inject_fault`` inside the ranks).
* :mod:`.runner`: plays a schedule through an injector and records when each
  change really took effect.
"""

from .injectors import EmulatedInjector, Injector, TestbedInjector
from .runner import ScheduleRunner
from .schedule import (DOWN_MODES, ISOLATE_BOUND, KINDS, MECHANISMS, Fault, Schedule, ScheduleError, Step,
                       UnsupportedFault, concatenate, path_timeline, random_schedule, relay_possible, scripted,
                       unrelayable_stretches)

__all__ = ["Fault", "Schedule", "Step", "ScheduleError", "UnsupportedFault", "random_schedule", "scripted",
           "concatenate", "path_timeline", "relay_possible", "unrelayable_stretches", "Injector", "TestbedInjector",
           "EmulatedInjector", "ScheduleRunner", "KINDS",
           "MECHANISMS", "DOWN_MODES", "ISOLATE_BOUND"]
