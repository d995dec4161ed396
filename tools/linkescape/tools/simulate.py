"""``linkescape simulate``: the cost model, played fault by fault (Monte Carlo, or an operator's log).

One schedule of faults (:mod:`.failures`) is played under each way of meeting them
(:mod:`.baselines`: restart, escape, nccl), all on the same draws (paired), so the savings'
interval holds only the noise of the difference. The model's inputs and their sources are in
:mod:`.model`; its closed form, the same model in expectation, is :mod:`.cost`.

How a run is played (exact, no randomness):

- Progress runs at the job's speed times ``tau / (tau + delta)`` (the checkpoint writes' stall,
  spread over the interval); a checkpoint is taken every ``tau`` of progress.
- An interruption loses the progress since the last checkpoint and restarts for ``restart_hours``;
  a fault during a restart starts it again (under escape, a fault of one rail is absorbed: the
  host comes up on its other rails). Every interruption replaces the faulty hosts.
- Under escape a fault of one rail stalls the job for the failover and leaves the host at its
  policy's rate until the repair; the job runs at the speed of its slowest host,
  ``1 / ((1 - c) + c / rate)``. Some pair of hosts without a path (a host with no rail, or two
  hosts with no rail in common) stops the job until a repair gives a path back, or until the mode's
  wait is over: then it fails. With the relay a cross runs at the relayed rate instead.
- With ``drain``, a degraded host whose expected cost exceeds a restart is swapped at the next
  checkpoint: a planned restart, no work lost (reported apart from the interruptions).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .baselines import MODES, Mode, expected_degraded_hours, interrupt_rate, modes
from .failures import Failure, draw_faults
from .model import CAUSES, SimParams
from .stats import mean_ci


@dataclass
class ModeResult:
    work_hours: float = 0.0
    #: unplanned, by cause: other, network (restart: any network fault; escape: not covered),
    #: isolated (a host with no rail), cross (two hosts with no rail in common)
    interruptions: int = 0
    by_cause: Dict[str, int] = field(default_factory=lambda: {"other": 0, "network": 0, "isolated": 0, "cross": 0})
    failed_restarts: int = 0
    planned_restarts: int = 0
    escaped: int = 0
    absorbed: int = 0
    #: episodes with some pair without a path, and how many a repair ended before the wait did
    waits: int = 0
    waits_resolved: int = 0
    wait_hours: float = 0.0
    degraded_hours: float = 0.0
    relayed_hours: float = 0.0
    stall_hours: float = 0.0
    lost_work_hours: float = 0.0
    restart_hours: float = 0.0
    #: torchft modes: replica groups left out (no restart), and the hours the job stalled for it
    left_out: int = 0
    leave_hours: float = 0.0


class _Run:
    """The state of one run under one mode; ``on_*`` handle the events in time order."""

    def __init__(self, p: SimParams, mode: Mode) -> None:
        self.p, self.m = p, mode
        self.T = p.hours
        self.tau = p.interval()
        self.eff = p.checkpoint_efficiency()
        self.res = ModeResult()
        self.cur = self.since = self.down_until = 0.0
        self.epoch = 0
        self.lost: Dict[int, Dict[int, int]] = {}  # host -> rail -> fault id
        self.blocked: Optional[Tuple[float, int, str]] = None  # (since, token, why)
        self.token = 0
        self.speed, self.relaying = 1.0, False
        self.heap: List[Tuple[float, int, str, Any]] = []
        self.order = 0
        self.lam_other = interrupt_rate(p, mode)

    def push(self, t: float, what: str, payload: Any) -> None:
        heapq.heappush(self.heap, (t, self.order, what, payload))
        self.order += 1

    # ---------------------------------------------------------------- state
    def _severed(self) -> bool:
        if self.m.severs is None or len(self.lost) < 2:
            return False
        sets = [frozenset(d) for d in self.lost.values()]
        return any(self.m.severs(a, b) for i, a in enumerate(sets) for b in sets[i + 1:])

    def path_state(self) -> str:
        if any(len(d) > self.m.max_lost for d in self.lost.values()):
            return "isolated"
        if self._severed():
            return "relay" if self.m.relay else "cross"
        return "ok"

    def refresh(self) -> None:
        s = 1.0
        for d in self.lost.values():
            s = min(s, self.p.job_speed(self.m.rate(len(d))))
        self.relaying = self.blocked is None and self.path_state() == "relay"
        if self.relaying:
            s = min(s, self.p.job_speed(self.m.relay_rate))
        self.speed = 0.0 if self.blocked is not None else s

    def advance(self, to: float) -> None:
        start = max(self.cur, self.down_until)
        if to > start:
            dt = to - start
            if self.blocked is not None:
                self.res.wait_hours += dt
            else:
                if self.speed < 1.0:
                    self.res.degraded_hours += dt
                if self.relaying:
                    self.res.relayed_hours += dt
                gained = self.speed * self.eff * dt
                self.res.work_hours += gained
                self.since = math.fmod(self.since + gained, self.tau)
        self.cur = max(self.cur, to)

    # ---------------------------------------------------------------- stops
    def _restart(self, t: float) -> None:
        self.res.restart_hours += min(self.T, t + self.p.restart_hours) - t
        self.down_until = t + self.p.restart_hours
        self.lost.clear()  # the restart replaces the faulty hosts
        self.blocked = None
        self.token += 1
        self.epoch += 1
        self.refresh()

    def interrupt(self, t: float, why: str) -> None:
        self.res.interruptions += 1
        self.res.by_cause[why] += 1
        self.res.work_hours -= self.since
        self.res.lost_work_hours += self.since
        self.since = 0.0
        self._restart(t)

    def failed_restart(self, t: float) -> None:
        self.res.failed_restarts += 1
        self.res.restart_hours -= min(self.T, self.down_until) - t  # the rest of the old one is not spent
        self._restart(t)

    def block(self, t: float, why: str) -> None:
        if self.blocked is not None:
            return
        self.res.waits += 1
        if self.m.wait_h <= 0:
            self.interrupt(t, why)
            return
        self.token += 1
        self.blocked = (t, self.token, why)
        self.push(t + self.m.wait_h, "expire", (self.epoch, self.token))
        self.refresh()

    # ---------------------------------------------------------------- events
    def take(self, t: float, f: Failure) -> None:
        fid = self.order
        rails = range(self.p.rails) if f.rail is None else (f.rail,)
        for h in f.hosts():
            d = self.lost.setdefault(h, {})
            for r in rails:
                d[r] = fid
        self.push(t + f.repair, "repair", (self.epoch, fid, tuple(f.hosts()), tuple(rails)))

    def on_fault(self, t: float, f: Failure) -> None:
        escapable = f.network and self.m.covers(f.host)
        if t < self.down_until:
            if escapable and f.rail is not None:
                self.take(t, f)
                if self.path_state() in ("ok", "relay"):
                    self.res.absorbed += 1
                    self.refresh()
                    self.maybe_drain(t, f.repair)
                    return
            self.failed_restart(t)
            return
        self.advance(t)
        if not escapable:
            self.interrupt(t, "other" if f.kind == "other" else "network")
            return
        self.take(t, f)
        state = self.path_state()
        if state in ("isolated", "cross"):
            self.refresh()
            self.block(t, state)
            return
        self.res.escaped += 1
        self.refresh()
        self.res.stall_hours += self.m.stall_h
        self.res.work_hours -= self.m.stall_h * self.speed * self.eff
        self.maybe_drain(t, f.repair)

    def on_repair(self, t: float, payload: Tuple[int, int, Tuple[int, ...], Tuple[int, ...]]) -> None:
        epoch, fid, hosts, rails = payload
        if epoch != self.epoch:
            return
        self.advance(t)
        for h in hosts:
            d = self.lost.get(h)
            for r in rails:
                if d is not None and d.get(r) == fid:
                    del d[r]
            if d is not None and not d:
                del self.lost[h]
        if self.blocked is not None and self.path_state() in ("ok", "relay"):
            self.res.waits_resolved += 1
            self.blocked = None
            self.token += 1
        self.refresh()

    def on_expire(self, t: float, payload: Tuple[int, int]) -> None:
        epoch, token = payload
        if epoch != self.epoch or self.blocked is None or self.blocked[1] != token:
            return
        self.advance(t)
        self.interrupt(t, self.blocked[2])

    def maybe_drain(self, t: float, repair: float) -> None:
        if not self.p.drain or self.speed >= 1.0:
            return
        if expected_degraded_hours(repair, self.lam_other) * (1.0 - self.speed) <= self.p.restart_hours:
            return
        start, todo = (t, self.tau - self.since) if t >= self.down_until else (self.down_until, self.tau)
        self.push(start + todo / (self.speed * self.eff), "drain", self.epoch)

    def on_drain(self, t: float, epoch: int) -> None:
        if epoch != self.epoch or not self.lost or self.blocked is not None or t < self.down_until:
            return
        self.advance(t)
        rem = self.tau - self.since
        if self.since > 1e-9 * self.tau and rem > 1e-9 * self.tau:  # the speed changed: the checkpoint moved
            self.push(t + rem / (self.speed * self.eff), "drain", epoch)
            return
        self.res.planned_restarts += 1
        self.since = 0.0
        self._restart(t)


class _FTRun(_Run):
    """A torchft mode: what it does not escape leaves the host's replica group out instead of
    restarting the job. The job stalls ``leave_h`` (the quorum change; ``rail_leave_h``, torchft's
    timeout, for a fault of one rail the mode does not escape), the others go on at
    (groups - out) / groups of the progress, and the group is back ``out_h`` later. Nothing is lost
    beyond that; a fault during a stall only adds its own."""

    def __init__(self, p: SimParams, mode: Mode) -> None:
        super().__init__(p, mode)
        self.out = 0

    def advance(self, to: float) -> None:
        start = max(self.cur, self.down_until)
        if to > start:
            dt = to - start
            if self.speed < 1.0:
                self.res.degraded_hours += dt
            if self.relaying:
                self.res.relayed_hours += dt
            share = max(0.0, 1.0 - self.out / self.p.ft_groups)
            self.res.work_hours += self.speed * self.eff * dt * share
        self.cur = max(self.cur, to)

    def leave(self, t: float, f: Failure, stall_h: Optional[float] = None) -> None:
        stall_h = self.m.leave_h if stall_h is None else stall_h
        self.res.left_out += 1
        for h in f.hosts():  # the host's group is left out; it comes back replaced or repaired
            self.lost.pop(h, None)
        for h in [h for h, d in self.lost.items() if len(d) > self.m.max_lost]:
            del self.lost[h]
        end = max(self.down_until, t + stall_h)
        self.res.leave_hours += end - max(self.down_until, t)
        self.down_until = end
        self.out += 1
        self.push(t + stall_h + self.m.out_h, "back", None)
        self.refresh()

    def on_back(self, t: float, _payload: Any) -> None:
        self.advance(t)
        self.out -= 1

    def on_fault(self, t: float, f: Failure) -> None:
        self.advance(t)
        if not (f.network and self.m.covers(f.host)):
            self.leave(t, f, self.m.rail_leave_h if f.network and f.rail is not None else None)
            return
        self.take(t, f)
        if self.path_state() in ("isolated", "cross"):
            self.leave(t, f)
            return
        self.res.escaped += 1
        self.refresh()
        self.res.stall_hours += self.m.stall_h
        self.res.work_hours -= self.m.stall_h * self.speed * self.eff
        # slowed (or relayed) for longer than leaving the group out would cost: leave it out now
        cost = self.m.leave_h + self.m.out_h / self.p.ft_groups
        if self.p.drain and self.speed < 1.0 and f.repair * (1.0 - self.speed) > cost:
            self.leave(t, f)

    def on_repair(self, t: float, payload: Tuple[int, int, Tuple[int, ...], Tuple[int, ...]]) -> None:
        _, fid, hosts, rails = payload
        self.advance(t)
        for h in hosts:
            d = self.lost.get(h)
            for r in rails:
                if d is not None and d.get(r) == fid:
                    del d[r]
            if d is not None and not d:
                del self.lost[h]
        self.refresh()


def play(p: SimParams, faults: Sequence[Failure], mode: Union[Mode, str, bool]) -> ModeResult:
    """Play one schedule under one mode (``True``/``False``: escape/restart)."""
    if not isinstance(mode, Mode):
        mode = modes(p)["escape" if mode is True else "restart" if mode is False else mode]
    run = (_FTRun if mode.ft else _Run)(p, mode)
    for f in faults:
        if f.t < run.T:
            run.push(f.t, "fault", f)
    while run.heap:
        t, _, what, payload = heapq.heappop(run.heap)
        if t >= run.T:
            break
        getattr(run, "on_" + what)(t, payload)
    run.advance(run.T)
    return run.res


# ------------------------------------------------------------------ Monte Carlo
def _mode_summary(p: SimParams, runs: List[ModeResult]) -> Dict[str, Any]:
    T, n = p.hours, len(runs)
    e = mean_ci([r.work_hours / T for r in runs])
    lost = (1.0 - e["mean"]) * p.gpus * T

    def avg(name: str) -> float:
        return sum(getattr(r, name) for r in runs) / n

    out = {"ettr": e["mean"], "ettr_sd": e["sd"], "ettr_ci": [e["lo"], e["hi"]],
           "gpu_hours_lost": lost, "yuan_lost": lost * p.yuan_per_gpu_hour}
    for name in ("interruptions", "failed_restarts", "planned_restarts", "escaped", "absorbed", "waits",
                 "waits_resolved", "wait_hours", "degraded_hours", "relayed_hours", "lost_work_hours",
                 "restart_hours", "left_out", "leave_hours"):
        out[name] = avg(name)
    out["stall_seconds"] = avg("stall_hours") * 3600.0
    out["interruptions_by_cause"] = {k: sum(r.by_cause[k] for r in runs) / n for k in runs[0].by_cause}
    return out


def _paired(p: SimParams, base: List[ModeResult], alt: List[ModeResult]) -> Dict[str, Any]:
    """``alt`` against ``base`` on the same draws: what it saves, with 95 % intervals."""
    T = p.hours
    scale = p.gpus * T * p.yuan_per_gpu_hour
    d = mean_ci([(a.work_hours - b.work_hours) / T for a, b in zip(alt, base)])
    avoided = mean_ci([b.interruptions - a.interruptions for a, b in zip(alt, base)])
    return {"ettr_gain": d["mean"], "ettr_gain_ci": [d["lo"], d["hi"]],
            "yuan_saved": d["mean"] * scale, "yuan_saved_ci": [d["lo"] * scale, d["hi"] * scale],
            "yuan_saved_run_sd": d["sd"] * scale,
            "gpu_hours_saved": d["mean"] * p.gpus * T,
            "interruptions_avoided": avoided["mean"], "interruptions_avoided_ci": [avoided["lo"], avoided["hi"]],
            "planned_swaps": sum(a.planned_restarts for a in alt) / len(alt)}


def simulate(p: SimParams, faults: Optional[Sequence[Failure]] = None) -> Dict[str, Any]:
    """Monte Carlo over ``p.trials`` schedules (or one replayed schedule); every mode sees the same faults."""
    import numpy as np

    rng = np.random.default_rng(p.seed)
    ms = modes(p)
    runs: Dict[str, List[ModeResult]] = {m: [] for m in MODES}
    kinds: Dict[str, float] = {k: 0.0 for k in (*CAUSES, "whole_host", "other")}
    schedules = [list(faults)] if faults is not None else None
    trials = 1 if schedules else p.trials
    for i in range(trials):
        sched = schedules[0] if schedules else draw_faults(p, rng)
        for f in sched:
            kinds[f.kind] += 1
            kinds["whole_host"] += f.network and f.rail is None
        for m in MODES:
            runs[m].append(play(p, sched, ms[m]))
    out: Dict[str, Any] = {"inputs": p.as_dict(), "resolved": p.resolved(), "trials": trials,
                           "replay": faults is not None,
                           "faults_per_run": {k: v / trials for k, v in kinds.items()}}
    for m in MODES:
        out[m] = _mode_summary(p, runs[m])
    out["saved"] = {m: _paired(p, runs["restart"], runs[m]) for m in MODES if m != "restart"}
    esc = out["saved"]["escape"]
    # the flat names of earlier versions
    out.update(yuan_saved=esc["yuan_saved"], gpu_hours_saved=esc["gpu_hours_saved"],
               interruptions_avoided=esc["interruptions_avoided"], planned_swaps=esc["planned_swaps"],
               degraded_speed=p.job_speed(p.escape_rate(1)) if p.rails > 1 else None)
    return out


__all__ = ["SimParams", "Failure", "ModeResult", "draw_faults", "play", "simulate", "expected_degraded_hours"]
