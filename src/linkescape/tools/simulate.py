"""``linkescape simulate``: restart-from-checkpoint against escape, Monte Carlo, at cluster scale.

A cluster of ``gpus`` GPUs, ``gpus_per_host`` per host, ``rails`` NICs per
host (each NIC with one cable and two optics), trains for ``days``. Faults
arrive as Poisson processes per component (NIC, cable, optic) and, for
everything that is not the network, per GPU. The same fault schedule is
played twice:

- **restart**: every fault interrupts the job: the work since the last
  checkpoint is lost and the restart takes ``restart_hours``.
- **escape**: a fault of one rail costs the detection-and-failover stall
  (measured here) and leaves the host on its other rails until the repair;
  while it runs on ``k`` of ``R`` rails (striping), its ring is slower: the
  job's step takes ``(1 - c) + c * R / k`` (``c``: the share of the step
  bound by the host's network). A host that loses every rail (a whole-host
  fault, or a second fault before the first is repaired) interrupts the job
  as under restart. Everything else interrupts both alike.

An interruption replaces the faulty hosts (spares), so the degraded state
ends with it; faults during a restart are absorbed by it. Checkpoints are
taken every ``checkpoint_hours`` of progress, asynchronously (no cost).
ETTR (effective training time ratio) = useful progress / wall time.

Defaults (docs/operations.md cites them): Llama 3 405B had 419 unexpected
interruptions in 54 days on 16,384 GPUs, 8.4 % of them network switch or
cable, 1.7 % NIC ("The Llama 3 Herd of Models", 2024, table 5), with one NIC
per GPU; detection and failover from docs/failover.md; repair, checkpoint
and restart times and the network share of a step are assumptions (flags).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import UsageError

# ------------------------------------------------------------------ published figures
LLAMA3_GPUS = 16384
LLAMA3_DAYS = 54
LLAMA3_INTERRUPTIONS = 419
LLAMA3_NETWORK_SHARE = 0.084  # "network switch and cable"
LLAMA3_NIC_SHARE = 0.017      # "NIC"
#: one NIC per GPU in that cluster, each with one cable and two optics
_LLAMA3_LINKS = LLAMA3_GPUS

NIC_PER_DAY = LLAMA3_INTERRUPTIONS * LLAMA3_NIC_SHARE / (_LLAMA3_LINKS * LLAMA3_DAYS)
LINK_PER_DAY = LLAMA3_INTERRUPTIONS * LLAMA3_NETWORK_SHARE / (_LLAMA3_LINKS * LLAMA3_DAYS)
#: the paper does not split "switch and cable" further: half to the cable, half to its two optics
OPTIC_FRACTION = 0.5
CABLE_PER_DAY = LINK_PER_DAY * (1 - OPTIC_FRACTION)
OPTIC_PER_DAY = LINK_PER_DAY * OPTIC_FRACTION / 2
OTHER_PER_GPU_DAY = (LLAMA3_INTERRUPTIONS * (1 - LLAMA3_NETWORK_SHARE - LLAMA3_NIC_SHARE)
                     / (LLAMA3_GPUS * LLAMA3_DAYS))

#: measured (docs/failover.md): a blackholed optic, fault -> 90 % of the throughput back on the
#: other rail, median 208.6 ms; a cut is back within the 20 ms sampling window (0.0 ms median)
ESCAPE_STALL_MS = 208.6

PLOT_SIZES = (1000, 2000, 4000, 8000, 16000, 32000, 64000, 100000)
KINDS = ("nic", "cable", "optic")


@dataclass(frozen=True)
class SimParams:
    gpus: int = 16384
    days: float = 54.0
    gpus_per_host: int = 8
    rails: int = 2
    nic_per_day: float = NIC_PER_DAY
    cable_per_day: float = CABLE_PER_DAY
    optic_per_day: float = OPTIC_PER_DAY
    other_per_gpu_day: float = OTHER_PER_GPU_DAY
    #: share of network faults that take every rail of the host at once
    whole_host_share: float = 0.0
    repair_nic_hours: float = 24.0
    repair_cable_hours: float = 8.0
    repair_optic_hours: float = 4.0
    #: with these two an interruption costs 0.3 h on average, which gives restart-mode ETTR of
    #: about 90 % on Llama 3's cluster, as the paper reports ("higher than 90% effective training time")
    checkpoint_hours: float = 0.3
    restart_hours: float = 0.15
    escape_stall_ms: float = ESCAPE_STALL_MS
    comm_share: float = 0.3
    #: swap a degraded host at the next checkpoint (a planned restart, no work lost) when running
    #: degraded until its repair (or the next interruption of another cause) would cost more than that
    drain: bool = True
    yuan_per_gpu_hour: float = 10.0
    trials: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.gpus, int) or not 1 <= self.gpus <= 10_000_000:
            raise UsageError(f"gpus={self.gpus!r} must be an integer in [1, 10,000,000]")
        if self.gpus_per_host < 1 or self.rails < 1:
            raise UsageError("gpus-per-host and rails must be at least 1")
        if self.days <= 0:
            raise UsageError("days must be positive")
        for name in ("nic_per_day", "cable_per_day", "optic_per_day", "other_per_gpu_day", "repair_nic_hours",
                     "repair_cable_hours", "repair_optic_hours", "restart_hours", "escape_stall_ms",
                     "yuan_per_gpu_hour"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name.replace('_', '-')} must not be negative")
        if self.checkpoint_hours <= 0:
            raise UsageError("checkpoint-hours must be positive")
        for name in ("whole_host_share", "comm_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise UsageError(f"{name.replace('_', '-')} must be in [0, 1]")
        if self.trials < 1:
            raise UsageError("trials must be at least 1")

    @property
    def hosts(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_host)

    def repair_hours(self, kind: str) -> float:
        return {"nic": self.repair_nic_hours, "cable": self.repair_cable_hours,
                "optic": self.repair_optic_hours}.get(kind, 0.0)

    def expected_degraded_hours(self, repair: float) -> float:
        """How long a degraded host is expected to stay in the job: until its
        repair, or until the next interruption of another cause replaces it."""
        lam = self.other_per_gpu_day * self.gpus / 24.0
        if lam <= 0:
            return repair
        return (1.0 - math.exp(-lam * repair)) / lam

    def degraded_speed(self, rails_left: int) -> float:
        """Job speed while its slowest host has ``rails_left`` of ``rails`` (striping)."""
        if rails_left >= self.rails:
            return 1.0
        c = self.comm_share
        return 1.0 / ((1.0 - c) + c * self.rails / rails_left)


@dataclass(frozen=True)
class Fault:
    """One fault: at ``t`` hours, on ``host``; ``rail`` None = every rail of the host.
    ``kind`` is nic, cable, optic or other (not the network: interrupts both modes)."""
    t: float
    host: int
    kind: str
    rail: Optional[int] = 0
    repair: float = 0.0


@dataclass
class ModeResult:
    work_hours: float = 0.0
    interruptions: int = 0
    absorbed: int = 0
    escaped: int = 0
    whole_host_interruptions: int = 0
    overlap_interruptions: int = 0
    degraded_hours: float = 0.0
    stall_hours: float = 0.0
    lost_work_hours: float = 0.0
    restart_hours: float = 0.0
    #: faults during a restart, which then starts again
    failed_restarts: int = 0
    #: degraded hosts swapped at a checkpoint (escape with drain)
    planned_restarts: int = 0


def draw_faults(p: SimParams, rng) -> List[Fault]:
    """One schedule of faults over the run, sorted by time."""
    T = p.days * 24.0
    links = p.hosts * p.rails
    out: List[Fault] = []
    counts = {"nic": (p.nic_per_day, links), "cable": (p.cable_per_day, links), "optic": (p.optic_per_day, 2 * links)}
    for kind, (rate, n) in counts.items():
        k = int(rng.poisson(rate * n * p.days))
        times = rng.uniform(0.0, T, k)
        hosts = rng.integers(0, p.hosts, k)
        rails = rng.integers(0, p.rails, k)
        whole = rng.random(k) < p.whole_host_share
        for t, h, r, w in zip(times, hosts, rails, whole):
            out.append(Fault(float(t), int(h), kind, None if w else int(r), p.repair_hours(kind)))
    k = int(rng.poisson(p.other_per_gpu_day * p.gpus * p.days))
    for t, h in zip(rng.uniform(0.0, T, k), rng.integers(0, p.hosts, k)):
        out.append(Fault(float(t), int(h), "other", None, 0.0))
    out.sort(key=lambda f: f.t)
    return out


def play(p: SimParams, faults: Sequence[Fault], escape: bool) -> ModeResult:
    """Play one schedule under one mode; exact (no randomness)."""
    T = p.days * 24.0
    res = ModeResult()
    ckpt = p.checkpoint_hours
    stall = p.escape_stall_ms / 3.6e6
    cur = 0.0          # progress accounted up to here (wall hours)
    since_ckpt = 0.0   # progress since the last checkpoint
    down_until = 0.0   # the job restarts until then
    epoch = 0          # bumped at each interruption: repairs of older faults are void
    rails_down: Dict[int, Dict[int, int]] = {}  # host -> rail -> fault id
    heap: List[Tuple[float, int, str, Any]] = []
    for i, f in enumerate(faults):
        if f.t < T:
            heapq.heappush(heap, (f.t, i, "fault", f))
    order = len(faults)

    def speed() -> float:
        if not rails_down:
            return 1.0
        return p.degraded_speed(p.rails - max(len(r) for r in rails_down.values()))

    def advance(to: float) -> None:
        nonlocal cur, since_ckpt
        start = max(cur, down_until)
        if to > start:
            s = speed()
            dt = to - start
            if s < 1.0:
                res.degraded_hours += dt
            gained = s * dt
            res.work_hours += gained
            since_ckpt = math.fmod(since_ckpt + gained, ckpt)
        cur = max(cur, to)

    def interrupt(t: float) -> None:
        nonlocal since_ckpt, down_until, epoch
        res.interruptions += 1
        res.work_hours -= since_ckpt
        res.lost_work_hours += since_ckpt
        since_ckpt = 0.0
        res.restart_hours += min(T, t + p.restart_hours) - t
        down_until = t + p.restart_hours
        rails_down.clear()  # the restart replaces the faulty hosts
        epoch += 1

    def degrade(t: float, f: Fault) -> bool:
        """One more rail of ``f.host`` down; False when it was its last."""
        nonlocal order
        down = rails_down.setdefault(f.host, {})
        down[f.rail] = order
        heapq.heappush(heap, (t + f.repair, order, "repair", (epoch, f.host, f.rail, order)))
        order += 1
        if len(down) < p.rails:
            maybe_drain(t, f)
            return True
        return False

    def maybe_drain(t: float, f: Fault) -> None:
        nonlocal order
        if not p.drain or p.expected_degraded_hours(f.repair) * (1.0 - speed()) <= p.restart_hours:
            return
        start = max(t, down_until)
        at = start + (ckpt - since_ckpt if t >= down_until else ckpt) / speed()
        heapq.heappush(heap, (at, order, "drain", epoch))
        order += 1

    while heap:
        t, _, what, payload = heapq.heappop(heap)
        if t >= T:
            break
        if what == "drain":
            if payload != epoch or not rails_down or t < down_until:
                continue
            advance(t)
            rem = ckpt - since_ckpt
            if since_ckpt > 1e-9 * ckpt and rem > 1e-9 * ckpt:  # the speed changed: the checkpoint moved
                heapq.heappush(heap, (t + rem / speed(), order, "drain", epoch))
                order += 1
                continue
            res.planned_restarts += 1
            since_ckpt = 0.0
            res.restart_hours += min(T, t + p.restart_hours) - t
            down_until = t + p.restart_hours
            rails_down.clear()
            epoch += 1
            continue
        if what == "repair":
            f_epoch, host, rail, fid = payload
            if f_epoch != epoch:
                continue
            advance(t)
            down = rails_down.get(host)
            if down is not None and down.get(rail) == fid:
                del down[rail]
                if not down:
                    del rails_down[host]
            continue
        f: Fault = payload
        single = f.kind in KINDS and f.rail is not None
        if t < down_until:
            # The job is restarting: under escape a host that lost one rail
            # comes up on the others; anything else fails the restart.
            if escape and single and degrade(t, f):
                res.absorbed += 1
                continue
            res.failed_restarts += 1
            res.restart_hours += min(T, t + p.restart_hours) - min(T, down_until)
            down_until = t + p.restart_hours
            rails_down.clear()
            epoch += 1
            continue
        advance(t)
        if not escape or not single:
            if escape and f.kind in KINDS:
                res.whole_host_interruptions += 1
            interrupt(t)
            continue
        if not degrade(t, f):
            res.overlap_interruptions += 1
            interrupt(t)
            continue
        res.escaped += 1
        res.stall_hours += stall
        res.work_hours -= stall * speed()
    advance(T)
    return res


def _summary(p: SimParams, runs: List[ModeResult]) -> Dict[str, Any]:
    T = p.days * 24.0
    n = len(runs)
    ettrs = [r.work_hours / T for r in runs]
    mean = sum(ettrs) / n
    std = math.sqrt(sum((e - mean) ** 2 for e in ettrs) / (n - 1)) if n > 1 else 0.0
    lost = (1.0 - mean) * p.gpus * T

    def avg(name: str) -> float:
        return sum(getattr(r, name) for r in runs) / n

    return {"ettr": mean, "ettr_std": std, "interruptions": avg("interruptions"),
            "gpu_hours_lost": lost, "yuan_lost": lost * p.yuan_per_gpu_hour,
            "lost_work_hours": avg("lost_work_hours"), "restart_hours": avg("restart_hours"),
            "failed_restarts": avg("failed_restarts"), "planned_restarts": avg("planned_restarts"), "absorbed_faults": avg("absorbed"),
            "escaped_faults": avg("escaped"),
            "whole_host_interruptions": avg("whole_host_interruptions"),
            "overlap_interruptions": avg("overlap_interruptions"), "degraded_hours": avg("degraded_hours"),
            "stall_seconds": avg("stall_hours") * 3600.0}


def simulate(p: SimParams) -> Dict[str, Any]:
    """Monte Carlo over ``p.trials`` schedules; both modes see the same faults."""
    import numpy as np

    rng = np.random.default_rng(p.seed)
    restart: List[ModeResult] = []
    escape: List[ModeResult] = []
    kinds: Dict[str, float] = {k: 0.0 for k in (*KINDS, "whole_host", "other")}
    for _ in range(p.trials):
        faults = draw_faults(p, rng)
        for f in faults:
            kinds[f.kind] += 1
            if f.kind in KINDS and f.rail is None:
                kinds["whole_host"] += 1
        restart.append(play(p, faults, escape=False))
        escape.append(play(p, faults, escape=True))
    r, e = _summary(p, restart), _summary(p, escape)
    return {
        "inputs": asdict(p), "hosts": p.hosts, "links": p.hosts * p.rails,
        "faults_per_run": {k: v / p.trials for k, v in kinds.items()},
        "restart": r, "escape": e,
        "interruptions_avoided": r["interruptions"] - e["interruptions"],
        "gpu_hours_saved": r["gpu_hours_lost"] - e["gpu_hours_lost"],
        "yuan_saved": r["yuan_lost"] - e["yuan_lost"],
        "degraded_speed": p.degraded_speed(p.rails - 1) if p.rails > 1 else None,
    }


def sweep(p: SimParams, sizes: Sequence[int] = PLOT_SIZES) -> List[Dict[str, Any]]:
    from dataclasses import replace

    return [simulate(replace(p, gpus=int(n))) for n in sizes]


def format_text(res: Dict[str, Any]) -> str:
    i = res["inputs"]
    r, e = res["restart"], res["escape"]
    fk = res["faults_per_run"]
    L = [f"{i['gpus']:,} GPUs ({res['hosts']:,} hosts x {i['rails']} rails), {i['days']:g} days, "
         f"{i['trials']} trials (seed {i['seed']})",
         f"faults per run: NIC {fk['nic']:.1f}, cable {fk['cable']:.1f}, optic {fk['optic']:.1f} "
         f"(whole-host {fk['whole_host']:.1f}), other {fk['other']:.1f}",
         "",
         f"{'':24}{'restart':>16}{'escape':>16}",
         f"{'ETTR':24}{r['ettr']:>16.4f}{e['ettr']:>16.4f}",
         f"{'interruptions':24}{r['interruptions']:>16.1f}{e['interruptions']:>16.1f}",
         f"{'GPU-hours lost':24}{r['gpu_hours_lost']:>16,.0f}{e['gpu_hours_lost']:>16,.0f}",
         f"{'yuan lost':24}{r['yuan_lost']:>16,.0f}{e['yuan_lost']:>16,.0f}",
         "",
         f"escape: {e['escaped_faults']:.1f} faults escaped per run ({e['planned_restarts']:.1f} hosts swapped at a "
         f"checkpoint), {e['overlap_interruptions']:.2f} interruptions "
         f"from a second fault before the repair, {e['whole_host_interruptions']:.2f} from whole-host faults; "
         f"{e['degraded_hours']:.1f} h degraded"
         + (f" (at {res['degraded_speed']:.2f}x speed on one rail less)" if res.get("degraded_speed") else ""),
         f"interruptions avoided: {res['interruptions_avoided']:.1f} per run; saved {res['gpu_hours_saved']:,.0f} "
         f"GPU-hours, {res['yuan_saved']:,.0f} yuan"]
    return "\n".join(L) + "\n"


def plot(path: str, rows: List[Dict[str, Any]], net_rows: Optional[List[Dict[str, Any]]] = None,
         mark: Optional[int] = None) -> str:
    """ETTR against cluster size, restart vs escape: with every fault, with the
    network's faults only (``net_rows``), and what escape saves per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [row["inputs"]["gpus"] for row in rows]
    panels = 3 if net_rows else 2
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3.1 * panels + 0.6), sharex=True)
    styles = (("restart", "tab:red", "restart from checkpoint"), ("escape", "tab:green", "escape (linkescape)"))

    def ettr(ax, data, what):
        for mode, color, label in styles:
            ax.errorbar(xs, [r[mode]["ettr"] for r in data], yerr=[r[mode]["ettr_std"] for r in data], color=color,
                        marker="o", ms=4, capsize=3, label=label)
        ax.set_ylabel(f"ETTR\n{what}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="lower left", fontsize=9)

    ettr(axes[0], rows, "(every fault)")
    i = rows[0]["inputs"]
    axes[0].set_title(f"{i['days']:g}-day run, {i['gpus_per_host']} GPUs and {i['rails']} rails per host, checkpoint "
                      f"every {i['checkpoint_hours']:g} h, restart {i['restart_hours']:g} h; {i['trials']} trials per "
                      f"size, bars: 1 sd", fontsize=9)
    if net_rows:
        ettr(axes[1], net_rows, "(network faults only)")
    ax = axes[-1]
    ax.plot(xs, [r["yuan_saved"] / 1e6 for r in rows], color="tab:green", marker="o", ms=4,
            label="yuan saved per run (million)")
    ax.set_ylabel("million yuan saved\nper run by escape")
    ax.grid(alpha=0.3, which="both")
    ax2 = ax.twinx()
    ax2.plot(xs, [r["interruptions_avoided"] for r in rows], color="tab:blue", marker="s", ms=4, ls="--",
             label="interruptions avoided per run")
    ax2.set_ylabel("interruptions avoided", color="tab:blue")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=9)
    ax.set_xscale("log")
    ax.set_xlabel("GPUs in the cluster")
    if mark is not None:
        for a in axes:
            a.axvline(mark, color="gray", ls=":", lw=1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["SimParams", "Fault", "ModeResult", "draw_faults", "play", "simulate", "sweep", "format_text", "plot",
           "NIC_PER_DAY", "CABLE_PER_DAY", "OPTIC_PER_DAY", "OTHER_PER_GPU_DAY", "ESCAPE_STALL_MS", "PLOT_SIZES"]
