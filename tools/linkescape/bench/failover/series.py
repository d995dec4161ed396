"""Running the failover benchmark's fault series and its overhead runs (raw data; :mod:`.analysis` reads it).

A fault series is ``count`` faults of one kind on the primary rail of host
``i % hosts`` in turn, under the saturating all_reduce of :class:`FailoverJob`.
Its runner policy is adaptive: steady traffic, the fault, *hold until every
rank that talks to the faulty one has failed over* (at least ``hold_s``, and
``after_detect_s`` after the last detection), repair, wait for every failback,
settle, next. Every fault goes through the shared injector
(:class:`linkescape.faults.TestbedInjector`); a flap is a one-fault shared
schedule (:func:`linkescape.faults.scripted`) played by
:class:`linkescape.faults.ScheduleRunner`.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence, Tuple

from ...faults.measure import first_event, summarize
from ...testbed.counters import NicSampler
from ...tools.timeline import ms
from .analysis import busbw_from_dones
from .job import FailoverJob
from .settings import FAULT_KINDS, Log, Settings, policy_env


def namespace_congestion(tb, host: int = 0) -> str:
    proc = tb.exec(host, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


class FaultMaker:
    """Apply and repair one fault of the series through the shared injector; returns effective times."""

    def __init__(self, tb, st: Settings) -> None:
        from ...faults import TestbedInjector

        self.tb = tb
        self.st = st
        self.injector = TestbedInjector(tb)
        self._flap = None

    def apply(self, kind: str, host: int, rail: int) -> float:
        """Make the fault; returns when it took effect (for a flap: its first down)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
        if kind != "flap":
            return self.injector.apply(kind, host, rail)
        from ...faults import ScheduleRunner, scripted

        st = self.st
        hold = st.flap_period_s * st.flap_cycles
        plan = scripted([{"kind": "flap", "host": host, "rail": rail, "at": 0.0, "hold": hold,
                          "period": st.flap_period_s, "mode": "cut"}], hosts=self.tb.hosts, rails=self.tb.rails)
        self._flap = ScheduleRunner(plan, self.injector).start()
        deadline = time.time() + 10.0
        while not self._flap.log and time.time() < deadline:
            time.sleep(0.002)
        if not self._flap.log:
            raise RuntimeError("the flap did not start")
        return self._flap.log[0]["ts"]

    def repair(self, kind: str, host: int, rail: int) -> Tuple[float, float]:
        """Undo the fault (a flap: let it end); returns (when the repair was issued, when it took effect)."""
        if kind != "flap":
            t_cmd = time.time()
            return t_cmd, self.injector.repair(kind, host, rail)
        runner, self._flap = self._flap, None
        runner.join(60.0)
        log = runner.stop()
        if runner.error is not None:
            raise runner.error
        last = [r for r in log if r["action"] == "repair"][-1]
        issued = (last.get("planned") or last["ts"]) + (last.get("late") or 0.0)
        return min(issued, last["ts"]), last["ts"]

    def hold_s(self, kind: str) -> float:
        """How long a fault of this kind lasts at least."""
        return self.st.flap_period_s * self.st.flap_cycles if kind == "flap" else self.st.hold_s


def _all_failed_over(job: FailoverJob, rank: int, others: Sequence[int], event: str, t0: float) -> Optional[float]:
    """When every link between ``rank`` and ``others`` had ``event`` on both ends after ``t0`` (None: not yet)."""
    loc = [first_event(job.events(rank), event, t0, 1e18, peer=p) for p in others]
    rem = [first_event(job.events(p), event, t0, 1e18, peer=rank) for p in others]
    if all(loc) and all(rem):
        return max(e["ts"] for e in loc + rem)
    return None


def run_fault_series(tb, kind: str, st: Settings, log: Log, count: Optional[int] = None,
                     hosts: Optional[Sequence[int]] = None, env: Optional[Dict[str, str]] = None) -> dict:
    """``count`` faults of ``kind`` on the primary rail of host ``i % hosts``,
    under a saturating all_reduce; returns the raw per-fault timeline and the
    job's exits, events, completions and counters (see :func:`.analysis.analyze_series`)."""
    count = st.count if count is None else count
    job = FailoverJob(tb, size=st.size, depth=st.depth, env={**st.env, **policy_env(st.policy), **(env or {})},
                      hosts=hosts)
    world = job.world
    maker = FaultMaker(tb, st)
    sampler: Optional[NicSampler] = None
    faults: List[dict] = []
    counters = None
    kernel: List[dict] = []
    exits: List[dict] = []
    rec_end = time.time()
    try:
        sampler = NicSampler(tb, job.dir, st.sample_ms / 1000.0).start()
        job.wait_ready()
        time.sleep(st.baseline_s)
        for i in range(count):
            if not job.alive():
                log(f"  {kind}: a rank exited; stopping the series after {i} faults")
                break
            rank = i % world
            host = job.hosts[rank]
            t_cmd = time.time()
            t_fault = maker.apply(kind, host, st.fault_rail)
            rec = {"kind": kind, "index": i, "host": host, "rank": rank, "rail": st.fault_rail,
                   "t_cmd": t_cmd, "t_fault": t_fault}
            # Hold: until every pair that involves the faulty rank failed over (or timeout),
            # at least hold_s, and after_detect_s after the last detection.
            others = [p for p in range(world) if p != rank]
            deadline = t_fault + st.detect_timeout_s
            last_det = None
            while time.time() < deadline:
                last_det = _all_failed_over(job, rank, others, "failover", t_cmd)
                if last_det is not None:
                    break
                time.sleep(0.02)
            until = max(t_fault + maker.hold_s(kind), (last_det or time.time()) + st.after_detect_s)
            time.sleep(max(0.0, until - time.time()))
            rec["t_restore_cmd"], rec["t_restore"] = maker.repair(kind, host, st.fault_rail)
            # Failback: every pair that failed over is back on the primary.
            deadline = rec["t_restore"] + st.failback_timeout_s
            while time.time() < deadline and _all_failed_over(job, rank, others, "failback",
                                                              rec["t_restore_cmd"]) is None:
                time.sleep(0.02)
            faults.append(rec)
            # Settle on the primary before the next fault (also the failback's throughput window).
            time.sleep(st.baseline_s)
            det = first_event(job.events(rank), "failover", t_cmd, 1e18)
            fb = first_event(job.events(rank), "failback", rec["t_restore_cmd"], 1e18)
            det_txt = "-" if det is None else "%.1f ms" % ms(det["ts"] - t_fault)
            fb_txt = "-" if fb is None else "%.0f ms" % ms(fb["ts"] - rec["t_restore"])
            log(f"  {kind} {i + 1}/{count} host {host}: local failover {det_txt}, failback {fb_txt}")
        rec_end = time.time()
        exits = job.finish()
        if sampler is not None:
            counters = sampler.stop()
            kernel = sampler.kernel_events()
        events = {r: list(job.events(r)) for r in range(world)}
        dones = {r: job.dones(r) for r in range(world)}
        pair_bytes = {r: {int(p): int(b) for p, b in ((job.records_of(r, "links") or [{}])[-1].get("peers")
                                                        or {}).items()} for r in range(world)}
    finally:
        if sampler is not None:
            sampler.close()
        job.close()
    return {"kind": kind, "faults": faults, "exits": exits, "events": events, "dones": dones, "pair_bytes": pair_bytes,
            "counters": counters, "kernel_events": kernel, "world": world, "hosts": job.hosts,
            "netns": [tb.netns(h) for h in job.hosts], "nic": tb.nic(st.fault_rail), "nbytes": job.nbytes,
            "t_end": rec_end, "policy": st.policy}


def run_overhead(tb, st: Settings, log: Log, env: Optional[Dict[str, str]] = None) -> dict:
    """Healthy busbw with every rail (backup links, heartbeats, carrier watch)
    vs one rail, in alternating runs."""
    runs = []
    for k in range(st.overhead_repeats):
        order = ("backup", "single") if k % 2 == 0 else ("single", "backup")
        for variant in order:
            rails = ",".join(tb.rail_nics) if variant == "backup" else tb.nic(0)
            job = FailoverJob(tb, size=st.size, depth=st.depth, rails=rails,
                              env={**st.env, **policy_env(st.policy), **(env or {})},
                              duration=st.overhead_seconds + 1.0)
            try:
                job.wait_ready(iters=1)
                time.sleep(st.overhead_seconds)
                exits = job.finish()
                bw = busbw_from_dones(job.dones(0), job.nbytes, job.world)
            finally:
                job.close()
            wrong = sum(int(e.get("wrong") or 0) for e in exits)
            runs.append({"repeat": k, "variant": variant, "rails": rails, "busbw_gbps": None if bw is None else bw / 1e9,
                         "wrong": wrong, "errors": [e.get("error") for e in exits if e.get("error")],
                         "hangs": sum(1 for e in exits if e.get("hung"))})
            log(f"  overhead {k + 1}/{st.overhead_repeats} {variant:6s} rails={rails}: busbw "
                f"{'-' if bw is None else f'{bw / 1e9:.3f} Gbit/s'}")
    b = [r["busbw_gbps"] for r in runs if r["variant"] == "backup" and r["busbw_gbps"]]
    s = [r["busbw_gbps"] for r in runs if r["variant"] == "single" and r["busbw_gbps"]]
    ratios = []
    for k in range(st.overhead_repeats):
        pair = {r["variant"]: r["busbw_gbps"] for r in runs if r["repeat"] == k}
        if pair.get("backup") and pair.get("single"):
            ratios.append(pair["backup"] / pair["single"])
    out = {"runs": runs, "backup_gbps": summarize(b), "single_gbps": summarize(s),
           "pair_ratio": summarize(ratios)}
    if b and s:
        import numpy as np

        out["overhead_pct"] = (1.0 - float(np.median(b)) / float(np.median(s))) * 100.0
        out["overhead_pct_pairs"] = (1.0 - float(np.median(ratios))) * 100.0 if ratios else None
    out["wrong"] = sum(r["wrong"] for r in runs)
    out["hangs"] = sum(r["hangs"] for r in runs)
    out["errors"] = [e for r in runs for e in r["errors"]]
    return out


__all__ = ["run_fault_series", "run_overhead", "FaultMaker", "namespace_congestion"]
