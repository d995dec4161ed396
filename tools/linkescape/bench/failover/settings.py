"""What a failover benchmark run is asked to do: fault kinds, testbed, workload, timings, targets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

#: fault kinds of the benchmark (a flap is a cut that comes and goes, ``flap_cycles`` times)
FAULT_KINDS = ("cut", "blackhole", "flap")
#: the rate phases add ``cross``: host 1 loses rail 0 and host 2 rail 1, so they share no rail and a third
#: host relays their traffic (issue 16)
RATE_FAULT_KINDS = FAULT_KINDS + ("cross",)
#: what ``--faults`` means when not given
DEFAULT_FAULTS = ("cut", "blackhole")
POLICIES = ("active-backup", "stripe")

#: An idle link (its pair exchanges none of the job's data) has nothing to be acknowledged, so silence
#: shows on it only once the rank's probe budget reaches it (each link at least once a second at these
#: sizes, engine/probes.py) and its probe goes unacknowledged for the silent timeout (200 ms), plus the
#: timer's slack: the bound a blackhole's idle peers are held to (a carrier loss is told to every peer).
IDLE_BLACKHOLE_MS = 1000.0 + 200.0 + 100.0

#: targets, milliseconds (the benchmark reports them; tests never assert them). ``peer_p99``: the peers
#: whose link to the faulty host carries the job's data; ``peer_idle_p99``: those whose link carries none
TARGETS = {
    "cut": {"local_p99": 5.0, "peer_p99": 10.0, "peer_idle_p99": 10.0},
    "blackhole": {"local_p99": 300.0, "peer_p99": 300.0, "peer_idle_p99": IDLE_BLACKHOLE_MS},
    "flap": {"local_p99": 5.0, "peer_p99": 10.0, "peer_idle_p99": 10.0},
    "restore_after_detect": 50.0,
    "overhead_pct": 1.0,
    # issue 12: the job's rate while one rail of one host is down, against healthy
    "rate_active_backup": 0.95,   # x healthy
    "rate_stripe": 0.90,          # x what the surviving rails can carry
    # issue 16: while a pair is relayed (a cross), under either policy
    "rate_relayed": 0.50,         # x healthy
    "stall_s": 1.5,               # no operation stalls longer than this once the fault has begun
}

Log = Callable[[str], None]

#: the outage-equivalent is the traffic missing in this long after a fault, in
#: milliseconds at the pre-fault mean rate (a fault is held at least this long)
LOST_SPAN_S = 1.0


@dataclass
class Settings:
    """The fault series (detection, throughput, failback), the overhead runs and the MPTCP comparison."""

    faults: Tuple[str, ...] = DEFAULT_FAULTS
    count: int = 20
    hosts: int = 4
    rails: int = 2
    rate: str = "1gbit"
    size: int = 16 << 20
    depth: int = 3
    fault_rail: int = 0
    baseline_s: float = 1.0          #: steady traffic on the primary before each fault
    hold_s: float = 1.0              #: a fault lasts at least this long ...
    after_detect_s: float = 0.5      #: ... and this long after the last rank detected it
    detect_timeout_s: float = 5.0
    failback_timeout_s: float = 8.0
    window_ms: float = 20.0
    sample_ms: float = 5.0
    flap_period_s: float = 0.5       #: flap: down for half the period, up for the other half ...
    flap_cycles: int = 4             #: ... this many times
    rate_settle_s: float = 0.3       #: the job's rate during a fault is counted from this long after it
    overhead_repeats: int = 3
    overhead_seconds: float = 6.0
    mptcp: bool = True
    mptcp_trials: int = 5
    mptcp_congestions: Tuple[Optional[str], ...] = (None,)
    congestion: Optional[str] = None  #: TCP congestion control of the main runs (None: the namespaces' default)
    policy: Optional[str] = None     #: LINKESCAPE_POLICY of the ranks (None: the library's default)
    env: Dict[str, str] = field(default_factory=dict)

    @property
    def window(self) -> float:
        return self.window_ms / 1000.0


@dataclass
class PhaseSettings:
    """The rate phases (issue 12): one job, rank 0's operations per second over ``phase_s`` in each phase.

    Phases: healthy; then for each kind in ``faults``, the fault held for
    ``settle_s`` + ``phase_s`` and measured over the last ``phase_s``
    (cut: host 1 rail 0, blackhole: host 2 rail 0, flap: host 3 rail 0, modulo
    the hosts), repaired, ``failback_s`` for traffic to move back; then
    ``phase_s`` after the repairs. Run once per policy.
    """

    faults: Tuple[str, ...] = FAULT_KINDS
    hosts: int = 4
    rails: int = 2
    rate: str = "1gbit"
    size: int = 4 << 20
    depth: int = 1                   #: 1: every rank all_reduces in a plain loop
    phase_s: float = 6.0
    settle_s: float = 1.0            #: from the fault to the start of its phase (detection, switch)
    failback_s: float = 4.0          #: from a repair to the next phase (re-dial, 1 s hold-down, failback)
    sub_s: float = 1.0               #: the phase is also cut into windows this long (median of them)
    fault_rail: int = 0
    flap_period_s: float = 1.0
    policies: Tuple[Optional[str], ...] = ("active-backup",)
    congestion: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)

    def fault_host(self, kind: str) -> int:
        """cut: host 1, blackhole: host 2, flap: host 3 (modulo the hosts, never host 0 when there are others);
        cross: host 1 (with host 2)."""
        k = {"cut": 1, "blackhole": 2, "flap": 3, "cross": 1}[kind]
        return 1 + (k - 1) % (self.hosts - 1) if self.hosts > 1 else 0

    def cross_targets(self) -> Tuple[Tuple[int, int], ...]:
        """The cross: host 1 loses rail 0, host 2 every other rail (they share none; hosts 0 and 3.. relay)."""
        return ((1, 0),) + tuple((2, r) for r in range(1, self.rails))


def policy_env(policy: Optional[str]) -> Dict[str, str]:
    return {"LINKESCAPE_POLICY": policy} if policy else {}


def cc_env(cc: Optional[str]) -> Dict[str, str]:
    return {"LINKESCAPE_TCP_CONGESTION": cc} if cc else {}


__all__ = ["Settings", "PhaseSettings", "FAULT_KINDS", "RATE_FAULT_KINDS", "DEFAULT_FAULTS", "POLICIES", "TARGETS",
           "LOST_SPAN_S", "Log",
           "policy_env", "cc_env"]
