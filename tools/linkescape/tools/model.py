"""The inputs of the cost model, shared by ``linkescape cost`` (its closed form) and
``linkescape simulate`` (its Monte Carlo), with where each default comes from.

docs/operations.md cites every default; the short form is here, beside the number:

- Failure counts: Llama 3 405B pre-training, "The Llama 3 Herd of Models" (Llama Team,
  AI @ Meta, arXiv:2407.21783, 2024), section 3.3.4 and table 5: 419 unexpected
  interruptions in 54 days on 16,384 H100 GPUs; 8.4 % "faulty network switch/cable",
  1.7 % "faulty network interface card" (7 events); "higher than 90 % effective
  training time". One NIC per GPU, 8 GPUs per host (our reading of section 3.3.1).
- Policy rates: docs/failover.md (measured here): active-backup runs at 1.00x (0.95-1.05x)
  during a fault; stripe at 0.92-0.99x of its healthy rate; a relayed pair (a cross fault) 0.57x,
  the lowest of the relayed phase's table (4 hosts, active-backup; 0.74-1.11x elsewhere).
- Escape stall: docs/failover.md, a blackhole's fault to 90 % throughput on the other rail.
- No-path wait: ``LINKESCAPE_NO_PATH_TIMEOUT``'s default (config.py), which is the wait that saves
  most at this model's defaults (``linkescape cost --break-even``).
- Checkpoint interval: Young (1974) / Daly (2006), tau = sqrt(2 delta MTBF).
- Repair times: a mix of three kinds (all assumed, flags): faults that end by themselves (a flap,
  exponential, mean ``flap_seconds``), faults a reboot or reload ends (exponential, mean
  ``reboot_seconds``; Singh et al., "Surviving switch failures in cloud datacenters", CCR 51(2),
  2021, put 17 % of switch failures on switch-OS bugs and 32 % on hardware), and hardware swaps
  (``repair_*_hours``, fixed).
- torchft rows: the time to leave a host out (1.16 s, a host cut off from every link) and to rejoin
  (0.34 s after its links came back) were measured by issue 47's four-group training test on the
  testbed (docs/torchft.md, section "torchft"; tests/torchft/test_torchft_training.py, `linkescape demo
  --torchft`: 4 hosts x 2 rails, torchft's heartbeat timeout 2 s, after 9c1e7f4). torchft's Gloo group
  was measured there too: 1.18 s and 0.34 s. The lighthouse's timeouts set the leave time, not the
  backend, so one figure serves both torchft rows; a job of 128 groups may take longer.
- torchft alone, a fault of one rail: its backend (Gloo) runs on that rail and waits; the job stalls
  torchft's timeout (10 s in that test; a 4 s cut stalled Gloo 6.7 s there), then the step is discarded
  and the group left out (after the timeout: not measured).
- Everything else (restart time, checkpoint write time, switch share, the network share of a step)
  is an assumption, a flag, and says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, List, Optional, Tuple

from ..common.config import Config as _Config
from ..common.errors import UsageError

# ------------------------------------------------------------------ published figures
LLAMA3_GPUS = 16384
LLAMA3_DAYS = 54.0
LLAMA3_INTERRUPTIONS = 419
LLAMA3_NETWORK_SHARE = 0.084   # "faulty network switch/cable": 35 of 419
LLAMA3_NIC_SHARE = 0.017       # "faulty network interface card": 7 of 419
LLAMA3_NIC_EVENTS = 7
LLAMA3_ETTR = 0.90             # "higher than 90% effective training time"
LLAMA3_GPUS_PER_HOST = 8
LLAMA3_NICS_PER_GPU = 1

# ------------------------------------------------------------------ measured here
#: docs/failover.md, "Throughput on the surviving rail": a blackhole, fault to >= 90 % of the
#: throughput back on the other rail, median 210.8 ms (a cut: 0.0 ms)
ESCAPE_STALL_MS = 210.8
#: docs/failover.md: the job's rate during a fault / before, active-backup, median 1.00x (0.95-1.05x)
AB_FAULT_RATE = 1.0
#: docs/failover.md, issue 12's table: stripe during a fault 0.92-0.99x of its healthy rate (lowest)
STRIPE_FAULT_RATE = 0.92
#: docs/failover.md, "The relayed phase": the job's rate while a pair of hosts with no rail in common
#: goes on through a third, the lowest of the table (4 hosts, active-backup 0.57x; stripe 0.74x;
#: 8 hosts 0.98-1.11x)
RELAY_RATE = 0.57
#: LINKESCAPE_NO_PATH_TIMEOUT's default (config.py): chosen by this model (``linkescape cost --break-even``)
NO_PATH_S = float(_Config.__dataclass_fields__["no_path_timeout"].default)
#: assumed: share of network faults that end by themselves (a flap), and their mean length
FLAP_SHARE, FLAP_S = 0.2, 30.0
#: assumed: share of network faults that a reboot or reload ends (Singh et al. 2021: 17 % of switch
#: failures were switch-OS bugs), and their mean length (a switch reloads in minutes)
REBOOT_SHARE, REBOOT_S = 0.2, 300.0

# ------------------------------------------------------------------ baselines' published figures
#: NCCL 2.30 IB port failover: with the default IB timeouts (NCCL_IB_TIMEOUT 20 -> 4.096 us x 2^20
#: = 4.3 s per try, NCCL_IB_RETRY_CNT 7) a dead port is found after about 30-34 s
NCCL_DETECT_S = 34.0
#: ports merged into one NCCL virtual NIC (NIC fusion); port failover works only inside one
NCCL_PORTS_PER_VNIC = 2
#: torchft alone (Gloo on one rail), a fault of one rail: the whole job's stall, torchft's timeout
#: (10 s in issue 47's training test, as configured there; the torchft README's lighthouse example
#: also uses 10 s). Measured below it: a 4 s cut or blackhole of Gloo's rail stalled every replica
#: 6.7 s (docs/torchft.md, "torchft"); a fault past it fails the step on every replica and the
#: quorum changes (not measured)
FT_STALL_S = 10.0
#: torchft rows: fault to the others' first step without the host, a host cut off from every link (both
#: rails and its management link), measured by issue 47's training test (docs/torchft.md, "torchft";
#: tests/torchft/test_torchft_training.py, `linkescape demo --torchft`; 4 hosts x 2 rails, torchft
#: 0.2.0, heartbeat timeout 2 s, join timeout 1 s; after 9c1e7f4): linkescape's group 1.16 s (1.14 s in
#: the test; a killed process 1.19-1.21 s), torchft's Gloo group 1.18 s (killed 1.21 s). The
#: lighthouse's timeouts set it, not the backend: one figure for both torchft rows
FT_LEAVE_S = 1.16
#: torchft's Gloo group, the same fault and testbed (cited beside FT_LEAVE_S, not an input)
FT_GLOO_LEAVE_S = 1.18
#: torchft rows: repair to the first step committed with all 4 again, through torchft's recovery from a
#: peer, measured there: 0.34 s after a cut-off host's links came back (0.31 s in the test; Gloo 0.34 s);
#: a restarted process 3.6-6.7 s from its restart (Gloo 7.25 s), mostly importing torch and torchft
FT_REJOIN_S = 0.34
#: Llama 3 405B: TP 8 x PP 16 = 128 GPUs per model replica, so 128 data-parallel replicas on
#: 16,384 GPUs (the paper's table 4, as we read it): FT-HSDP's replica groups
FT_REPLICA_GROUPS = 128
FT_GPUS_PER_REPLICA = 128

POLICIES = ("active-backup", "stripe")
CAUSES = ("nic", "cable", "optic", "switch")


@dataclass(frozen=True)
class Coverage:
    """What a fault of each cause takes: one rail of its host(s), or every rail."""
    name: str
    switch: str          # "rail" | "host"
    nic: str             # "rail" | "host"
    hosts_per_switch: int
    text: str

    def scope(self, cause: str) -> str:
        return {"switch": self.switch, "nic": self.nic}.get(cause, "rail")


COVERAGE: Dict[str, Coverage] = {
    "rail-optimized": Coverage(
        "rail-optimized", "rail", "rail", 16,
        "each rail has its own leaf switch: a switch takes one rail of its hosts; a NIC, cable or optic one rail"),
    "dual-plane": Coverage(
        "dual-plane", "rail", "host", 16,
        "each NIC port on its own plane: a switch, cable or optic takes one plane; a NIC takes both of its ports"),
    "tor": Coverage(
        "tor", "host", "rail", 2,
        "one top-of-rack switch per rack (Llama 3: a rack of two hosts): a switch takes every rail of its "
        "hosts; a NIC, cable or optic one rail"),
}
#: the conservative one: the fewest faults escaped
DEFAULT_COVERAGE = "tor"


@dataclass(frozen=True)
class SimParams:
    """Every input of the model. ``None`` means derived (see the methods)."""
    gpus: int = LLAMA3_GPUS
    days: float = LLAMA3_DAYS
    gpus_per_host: int = LLAMA3_GPUS_PER_HOST
    #: NICs per host, each with one cable and two optics (Llama 3: one per GPU)
    rails: int = LLAMA3_GPUS_PER_HOST * LLAMA3_NICS_PER_GPU
    coverage: str = DEFAULT_COVERAGE
    hosts_per_switch: Optional[int] = None
    #: unexpected interruptions of this cluster in ``days``; None: Llama 3's rate, scaled
    interruptions: Optional[float] = None
    network_share: float = LLAMA3_NETWORK_SHARE
    nic_share: float = LLAMA3_NIC_SHARE
    #: share of "switch/cable" that is switches: the paper does not split it (assumed)
    switch_share: float = 0.5
    #: per component and day (NIC, cable, optic, switch: per link; other: per GPU); None: derived
    nic_per_day: Optional[float] = None
    cable_per_day: Optional[float] = None
    optic_per_day: float = 0.0
    switch_per_day: Optional[float] = None
    other_per_gpu_day: Optional[float] = None
    #: share of the faults that take one rail which take every rail of the host instead
    whole_host_share: float = 0.0
    repair_nic_hours: float = 24.0
    repair_cable_hours: float = 8.0
    repair_optic_hours: float = 4.0
    repair_switch_hours: float = 8.0
    #: the repair-time mix: shares of the network faults that end by themselves (a flap) or with a
    #: reboot, each after an exponential time of this mean; the rest wait ``repair_*_hours``
    flap_share: float = FLAP_SHARE
    flap_s: float = FLAP_S
    reboot_share: float = REBOOT_SHARE
    reboot_s: float = REBOOT_S
    #: progress between checkpoints; None: Young/Daly from the write time and the restart MTBF
    checkpoint_hours: Optional[float] = None
    checkpoint_write_s: float = 10.0
    restart_hours: float = 0.15
    policy: str = "active-backup"
    ab_fault_rate: float = AB_FAULT_RATE
    stripe_fault_rate: float = STRIPE_FAULT_RATE
    #: share of a step bound by the host's network (it slows when the network rate drops)
    comm_share: float = 0.3
    escape_stall_ms: float = ESCAPE_STALL_MS
    no_path_s: float = NO_PATH_S
    relay: bool = True  # the library relays a pair with no common rail (issue 16)
    relay_rate: float = RELAY_RATE
    #: swap a degraded host at the next checkpoint when running degraded would cost more
    drain: bool = True
    yuan_per_gpu_hour: float = 10.0
    trials: int = 200
    seed: int = 0
    nccl_detect_s: float = NCCL_DETECT_S
    nccl_ports: int = NCCL_PORTS_PER_VNIC
    #: share of hosts whose ports NCCL merged into virtual NICs (1: the best case for NCCL)
    nccl_merged_share: float = 1.0
    #: torchft's replica groups; None: one per FT_GPUS_PER_REPLICA GPUs (Llama 3's model replica)
    ft_replica_groups: Optional[int] = None
    ft_recover_hours: Optional[float] = None
    #: torchft alone: the whole job's stall for a fault of one rail (its backend's), then the group is left out
    ft_stall_s: float = FT_STALL_S
    #: both torchft rows: the whole job's stall to leave out the group of a host cut off, or of any other fault
    ft_leave_s: float = FT_LEAVE_S
    ft_rejoin_s: float = FT_REJOIN_S

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        if not isinstance(self.gpus, int) or not 1 <= self.gpus <= 10_000_000:
            raise UsageError(f"gpus={self.gpus!r} must be an integer in [1, 10,000,000]")
        if self.gpus_per_host < 1 or self.rails < 1:
            raise UsageError("gpus-per-host and rails must be at least 1")
        if self.days <= 0:
            raise UsageError("days must be positive")
        if self.coverage not in COVERAGE:
            raise UsageError(f"coverage {self.coverage!r}: one of {', '.join(COVERAGE)}")
        if self.policy not in POLICIES:
            raise UsageError(f"policy {self.policy!r}: one of {', '.join(POLICIES)}")
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                raise UsageError(f"{f.name.replace('_', '-')} must not be negative")
        for name in ("whole_host_share", "comm_share", "network_share", "nic_share", "switch_share",
                     "nccl_merged_share", "flap_share", "reboot_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise UsageError(f"{name.replace('_', '-')} must be in [0, 1]")
        if self.network_share + self.nic_share > 1:
            raise UsageError("network-share + nic-share must not exceed 1")
        if self.flap_share + self.reboot_share > 1:
            raise UsageError("flap-share + reboot-share must not exceed 1")
        for name in ("ab_fault_rate", "stripe_fault_rate", "relay_rate"):
            if not 0 < getattr(self, name) <= 2:
                raise UsageError(f"{name.replace('_', '-')} must be in (0, 2]")
        if self.checkpoint_hours is not None and self.checkpoint_hours <= 0:
            raise UsageError("checkpoint-hours must be positive")
        if self.trials < 1 or self.nccl_ports < 1 or (self.ft_replica_groups is not None and
                                                        self.ft_replica_groups < 1):
            raise UsageError("trials, nccl-ports and ft-replica-groups must be at least 1")
        if self.hosts_per_switch is not None and self.hosts_per_switch < 1:
            raise UsageError("hosts-per-switch must be at least 1")

    # ---------------------------------------------------------------- the cluster
    @property
    def hosts(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_host)

    @property
    def links(self) -> int:
        return self.hosts * self.rails

    @property
    def hours(self) -> float:
        return self.days * 24.0

    @property
    def fabric(self) -> Coverage:
        return COVERAGE[self.coverage]

    @property
    def span(self) -> int:
        """Hosts under one switch (a switch fault takes a rail, or every rail, of each)."""
        n = self.hosts_per_switch if self.hosts_per_switch is not None else self.fabric.hosts_per_switch
        return max(1, min(n, self.hosts))

    # ---------------------------------------------------------------- fault rates
    def _reference(self):
        """(interruptions, links, GPUs, days) the shares apply to."""
        if self.interruptions is None:
            return (LLAMA3_INTERRUPTIONS, LLAMA3_GPUS * LLAMA3_NICS_PER_GPU, LLAMA3_GPUS, LLAMA3_DAYS)
        return (self.interruptions, self.links, self.gpus, self.days)

    def rate(self, cause: str) -> float:
        """Failures per component and day: per link for the network's causes, per GPU for ``other``."""
        i, links, gpus, days = self._reference()
        net = i * self.network_share / (links * days)
        derived = {"nic": i * self.nic_share / (links * days), "cable": net * (1 - self.switch_share),
                   "optic": 0.0, "switch": net * self.switch_share,
                   "other": i * (1 - self.network_share - self.nic_share) / (gpus * days)}
        given = {"nic": self.nic_per_day, "cable": self.cable_per_day, "optic": self.optic_per_day,
                 "switch": self.switch_per_day, "other": self.other_per_gpu_day}[cause]
        return derived[cause] if given is None else given

    def components(self, cause: str) -> int:
        if cause == "other":
            return self.gpus
        return 2 * self.links if cause == "optic" else self.links

    def events_per_hour(self, cause: str) -> float:
        return self.rate(cause) * self.components(cause) / 24.0

    def events_per_run(self) -> Dict[str, float]:
        return {c: self.events_per_hour(c) * self.hours for c in (*CAUSES, "other")}

    def repair_hours(self, cause: str) -> float:
        return {"nic": self.repair_nic_hours, "cable": self.repair_cable_hours, "optic": self.repair_optic_hours,
                "switch": self.repair_switch_hours}.get(cause, 0.0)

    def repair_mix(self, cause: str) -> List[Tuple[float, float, bool]]:
        """How a fault of ``cause`` ends: (share, hours, exponential) for a flap, a reboot (exponential
        times of their means) and a hardware repair (``repair_*_hours``, fixed); shares of 0 left out."""
        mix = [(self.flap_share, self.flap_s / 3600.0, True), (self.reboot_share, self.reboot_s / 3600.0, True),
               (1.0 - self.flap_share - self.reboot_share, self.repair_hours(cause), False)]
        return [m for m in mix if m[0] > 0]

    def source_counts(self) -> Dict[str, float]:
        """The events the rates were estimated from (for their uncertainty)."""
        i = self._reference()[0]
        return {"nic": i * self.nic_share, "network": i * self.network_share,
                "other": i * (1 - self.network_share - self.nic_share)}

    # ---------------------------------------------------------------- checkpoints
    @property
    def write_hours(self) -> float:
        return self.checkpoint_write_s / 3600.0

    def mtbf_hours(self) -> float:
        """Mean time between interruptions when every fault interrupts (restart from checkpoint)."""
        lam = sum(self.events_per_hour(c) for c in (*CAUSES, "other"))
        return math.inf if lam <= 0 else 1.0 / lam

    def interval(self) -> float:
        """Progress between checkpoints: given, or Young/Daly's sqrt(2 delta MTBF)."""
        if self.checkpoint_hours is not None:
            return self.checkpoint_hours
        m = self.mtbf_hours()
        if math.isinf(m):
            return self.hours
        return max(math.sqrt(2.0 * self.write_hours * m), 1e-4)

    def checkpoint_efficiency(self) -> float:
        """Progress per hour of training, the writes' stall spread over the interval."""
        tau = self.interval()
        return tau / (tau + self.write_hours)

    # ---------------------------------------------------------------- policies
    def job_speed(self, net_rate: float) -> float:
        """Job speed when the slowest host's network runs at ``net_rate`` of healthy."""
        if net_rate >= 1.0 and self.comm_share == 0:
            return 1.0
        c = self.comm_share
        return 1.0 / ((1.0 - c) + c / net_rate)

    def escape_rate(self, lost: int) -> float:
        """Network rate of a host that lost ``lost`` rails, relative to its healthy rate."""
        if lost <= 0:
            return 1.0
        if self.policy == "stripe":
            return self.stripe_fault_rate ** lost
        return self.ab_fault_rate

    def nccl_rate(self, lost: int) -> float:
        m = self.nccl_ports
        return 1.0 if lost <= 0 else max(m - 1, 0) / m if m > 1 else 0.0

    @property
    def ft_groups(self) -> int:
        """torchft's replica groups: given, or one per Llama 3 model replica (128 GPUs)."""
        if self.ft_replica_groups is not None:
            return self.ft_replica_groups
        return max(1, self.gpus // FT_GPUS_PER_REPLICA)

    @property
    def ft_recover(self) -> float:
        return self.restart_hours if self.ft_recover_hours is None else self.ft_recover_hours

    # ---------------------------------------------------------------- reporting
    def resolved(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {f"{c}_rate": self.rate(c) for c in (*CAUSES, "other")}
        out.update(hosts=self.hosts, links=self.links, hosts_per_switch=self.span,
                   checkpoint_hours=self.interval(), mtbf_hours=self.mtbf_hours(),
                   checkpoint_efficiency=self.checkpoint_efficiency(), events_per_run=self.events_per_run(),
                   ft_recover_hours=self.ft_recover, ft_replica_groups=self.ft_groups)
        return out

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


#: the model's inputs under their operator-facing name
Inputs = SimParams


__all__ = ["SimParams", "Inputs", "Coverage", "COVERAGE", "DEFAULT_COVERAGE", "POLICIES", "CAUSES",
           "ESCAPE_STALL_MS", "AB_FAULT_RATE", "STRIPE_FAULT_RATE", "RELAY_RATE", "NO_PATH_S",
           "NCCL_DETECT_S", "NCCL_PORTS_PER_VNIC", "FT_STALL_S", "FT_REPLICA_GROUPS", "FT_GPUS_PER_REPLICA",
           "FT_LEAVE_S", "FT_GLOO_LEAVE_S", "FT_REJOIN_S",
           "FLAP_SHARE", "FLAP_S", "REBOOT_SHARE", "REBOOT_S",
           "LLAMA3_GPUS", "LLAMA3_DAYS", "LLAMA3_INTERRUPTIONS", "LLAMA3_NETWORK_SHARE", "LLAMA3_NIC_SHARE",
           "LLAMA3_NIC_EVENTS", "LLAMA3_ETTR"]
