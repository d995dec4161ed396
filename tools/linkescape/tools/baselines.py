"""The ways a job can meet a fault, as the model plays them, each with its source.

- **restart**: every fault stops the job; it restarts from the last checkpoint.
- **escape** (linkescape, as built): a fault of one rail costs the measured failover stall, and the
  host goes on at its policy's measured rate on the rails it has left until the repair. A host
  with no rail left, or two hosts that share no rail any more (a *cross* fault), leave some pair
  without a path: the job waits ``LINKESCAPE_NO_PATH_TIMEOUT`` for a repair, then fails and
  restarts. With the relay (issue 16) a cross runs at the relayed rate, measured at 0.57x
  (docs/failover.md, "The relayed phase").
- **nccl**: NCCL 2.30's IB port failover (``NCCL_IB_RESILIENCY_PORT_FAILOVER=1``): only between the
  ports NCCL merged into one virtual NIC; a dead port is found after the IB transport's retries
  (about 34 s with the default timeouts); one failed device per connection, so a second fault on
  the host, or a cross, is fatal; traffic goes on at (ports - 1) / ports of the virtual NIC.
- **torchft** (FT-HSDP on its own process groups, e.g. Gloo): keeps training across the replica
  groups that are healthy; the group with the fault leaves for a step-granular quorum change,
  recovers live from a healthy peer and rejoins. By assumption it survives every fault, of any
  cause, that takes one replica group (never one that takes several at once): each costs one group's
  GPUs until it is back (``ft_recover`` and ``ft_rejoin_s``) and the whole job a stall: a fault of
  one rail (Gloo runs on one, and waits for it) torchft's timeout (``ft_stall_s``), after which the
  step fails and the group is left out; any other fault (a host cut off, a process killed) the time
  to leave the host out (``ft_leave_s``: measured with Gloo as with linkescape, the lighthouse's
  timeouts set it).
- **escape + shrink/torchft** (linkescape's ``ProcessGroupLinkescape`` under torchft, issue 47):
  a fault of one rail is escaped as above, with no quorum change; what escape cannot survive (a
  host with no rail, a cross the relay cannot carry, any other cause) leaves the host's group out
  after ``ft_leave_s`` (the process group's timeout caps the no-path wait), the others go on, and the
  group rejoins as under torchft. Same assumption: never several groups at once. Both torchft rows
  take the same ``ft_leave_s``, so what this row adds to torchft alone comes only from the faults of
  one rail that escape survives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, Optional

from .model import CAUSES, SimParams


@dataclass(frozen=True)
class Mode:
    name: str
    #: survives a fault that takes one rail (on a covered host)
    escapes: bool
    #: seconds (as hours) the whole job stalls for each escaped fault
    stall_h: float = 0.0
    #: how long the job waits, with some pair of hosts without a path, before it fails
    wait_h: float = 0.0
    #: rails a host may lose and go on
    max_lost: int = 0
    #: two hosts' lost rails leave them without a path (None: only isolation does)
    severs: Optional[Callable[[FrozenSet[int], FrozenSet[int]], bool]] = None
    rate: Callable[[int], float] = lambda lost: 1.0
    relay: bool = False
    relay_rate: float = 1.0
    #: hosts below this index have the mechanism (NCCL: ports merged into virtual NICs)
    covered_hosts: int = 0
    #: torchft: a fault the mode cannot escape leaves one replica group out instead of restarting the job
    ft: bool = False
    #: torchft: the whole job's stall while the others' quorum leaves the group out
    leave_h: float = 0.0
    #: torchft: the same for a fault of one rail that the mode does not escape (torchft's timeout)
    rail_leave_h: float = 0.0
    #: torchft: how long the group stays out after that (recovery, then rejoin)
    out_h: float = 0.0

    def covers(self, host: int) -> bool:
        return self.escapes and host < self.covered_hosts


def modes(p: SimParams) -> Dict[str, Mode]:
    rails = frozenset(range(p.rails))
    m = p.nccl_ports

    def escape_severs(a: FrozenSet[int], b: FrozenSet[int]) -> bool:
        return (a | b) >= rails

    def nccl_severs(a: FrozenSet[int], b: FrozenSet[int]) -> bool:
        return any(x // m == y // m and x != y for x in a for y in b)

    out_h = p.ft_recover + p.ft_rejoin_s / 3600.0
    return {
        "restart": Mode("restart", False),
        "escape": Mode("escape", True, p.escape_stall_ms / 3.6e6, p.no_path_s / 3600.0, p.rails - 1,
                       escape_severs, p.escape_rate, p.relay, p.relay_rate, p.hosts),
        "nccl": Mode("nccl", m > 1, p.nccl_detect_s / 3600.0, p.nccl_detect_s / 3600.0, 1 if m > 1 else 0,
                     nccl_severs, p.nccl_rate, False, 1.0, int(round(p.nccl_merged_share * p.hosts))),
        "torchft": Mode("torchft", False, ft=True, leave_h=p.ft_leave_s / 3600.0, out_h=out_h,
                        rail_leave_h=p.ft_stall_s / 3600.0),
        "escape_torchft": Mode("escape_torchft", True, p.escape_stall_ms / 3.6e6, 0.0, p.rails - 1, escape_severs,
                               p.escape_rate, p.relay, p.relay_rate, p.hosts, ft=True,
                               leave_h=p.ft_leave_s / 3600.0, out_h=out_h, rail_leave_h=p.ft_leave_s / 3600.0),
    }


MODES = ("restart", "escape", "nccl", "torchft", "escape_torchft")


def expected_degraded_hours(repair: float, lam: float) -> float:
    """How long a degraded host is expected to stay: until its repair, or until an interruption
    of another cause (rate ``lam`` per hour) replaces it."""
    return repair if lam <= 0 else (1.0 - math.exp(-lam * repair)) / lam


def interrupt_rate(p: SimParams, mode: Mode) -> float:
    """Interruptions per hour that this mode cannot escape (other causes, faults of every rail)."""
    lam = p.events_per_hour("other")
    for c in CAUSES:
        every = p.fabric.scope(c) == "host"
        share = 1.0 if not mode.escapes else (1.0 if every else p.whole_host_share)
        if mode.escapes and not every:
            share += (1.0 - p.whole_host_share) * (1.0 - mode.covered_hosts / p.hosts)
        lam += p.events_per_hour(c) * min(1.0, share)
    return lam


def one_rail_rate(p: SimParams) -> float:
    """Faults per hour that take one rail of a host (the fabric's scope, less ``whole_host_share``)."""
    return sum(p.events_per_hour(c) * (1.0 - p.whole_host_share) for c in CAUSES if p.fabric.scope(c) == "rail")


def torchft_ettr(p: SimParams) -> Dict[str, float]:
    """FT-HSDP in closed form: each fault (every cause) costs one replica group for the recovery
    and the whole job a stall (torchft's timeout for a fault of one rail, the time to leave a host
    out for the rest); the checkpoint writes are kept as for restart (an upper bound: torchft needs
    checkpoints only for what takes down every group)."""
    lam = sum(p.events_per_hour(c) for c in (*CAUSES, "other"))
    rail = one_rail_rate(p)
    out = (p.ft_recover + p.ft_rejoin_s / 3600.0) / p.ft_groups
    lost = lam * out + rail * p.ft_stall_s / 3600.0 + (lam - rail) * p.ft_leave_s / 3600.0
    eff = p.checkpoint_efficiency()
    ettr = eff * max(0.0, 1.0 - lost)
    return {"ettr": ettr, "faults_per_run": lam * p.hours, "hours_per_fault": lost / lam if lam > 0 else 0.0,
            "group_gpus": p.gpus / p.ft_groups}


SOURCES = {
    "restart": "every fault interrupts; the work since the last checkpoint is lost and the restart takes "
               "--restart-hours (assumed); checkpoints every Young/Daly interval",
    "escape": "linkescape as built: failover stall and policy rates measured in docs/failover.md; "
              "no-path wait = LINKESCAPE_NO_PATH_TIMEOUT (its default: the wait that saves most here, "
              "`linkescape cost --break-even`)",
    "nccl": "NCCL 2.30 IB port failover (NCCL_IB_RESILIENCY_PORT_FAILOVER=1): ~34 s to detect with the default "
            "IB timeouts (4.096 us x 2^20 x retry count 7), one failed device per connection, only inside "
            "merged virtual NICs, 5 recovery attempts (NCCL release notes and source; see docs/operations.md)",
    "torchft": "torchft README (pytorch/torchft, alpha): per-step fault tolerance, Fault Tolerant HSDP across the "
               "replicated dimension, live recovery from a healthy peer; survives by assumption every fault that "
               "takes one replica group (--ft-recover-hours assumed); a fault of one rail stalls the job "
               "--ft-stall-seconds (torchft's timeout, 10 s in issue 47's training test, where a 4 s cut stalled "
               "Gloo 6.7 s), any other --ft-leave-seconds (1.16 s, a host cut off; Gloo's group 1.18 s: the "
               "lighthouse's timeouts set it) and --ft-rejoin-seconds (0.34 s after the links came back; Gloo "
               "0.34 s), both measured by issue 47's training test (docs/torchft.md; 4 hosts x 2 rails)",
    "escape_torchft": "linkescape's process group under torchft (issue 47): escape for a fault of one rail (0 quorum "
                      "changes, measured), a group left out for the rest after --ft-leave-seconds (1.16 s, a host "
                      "cut off from every link; a killed process 1.19-1.21 s), back --ft-rejoin-seconds (0.34 s) "
                      "after its links return (a restarted process 3.6-6.7 s); issue 47's training test "
                      "(tests/torchft/test_torchft_training.py, `linkescape demo --torchft`; 4 hosts x 2 rails)",
}

__all__ = ["Mode", "modes", "MODES", "interrupt_rate", "expected_degraded_hours", "one_rail_rate", "torchft_ettr",
           "SOURCES"]
