"""MPTCP against linkescape through the same cuts, on the same 2-host testbed (per congestion control).

MPTCP: a plain bulk transfer host 1 -> host 0 (:mod:`.mptcp`), the client's
rail 0 cut ``trials`` times, a new connection each time; the time until half
(and 90 %) of the rate is back on rail 1. linkescape: a fault series of as
many cuts on the same testbed, reported with the same metrics.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

from ...faults.measure import summarize
from ...testbed.counters import Counters, NicSampler, kernel_time
from ...testbed.netns import rate_bps as parse_rate
from ...tools.timeline import ms
from .analysis import analyze_series, lost_ms
from .series import namespace_congestion, run_fault_series
from .settings import Log, Settings, cc_env


def run_mptcp_series(tb, st: Settings, cc: Optional[str], log: Log, trials: int) -> dict:
    """A plain MPTCP bulk transfer host 1 -> host 0; cut host 1's primary rail
    ``trials`` times (a new connection each time)."""
    from .mptcp import setup_mptcp

    from ...faults import TestbedInjector

    setup = setup_mptcp(tb, server=0, client=1, backup_rail=1)
    injector = TestbedInjector(tb)
    workdir = tempfile.mkdtemp(prefix="linkescape-mptcp-")
    port = 5201
    rail_bps = parse_rate(st.rate)
    sampler = NicSampler(tb, workdir, st.sample_ms / 1000.0).start()
    cc_args = ["--cc", cc] if cc else []
    server = tb.popen(0, [sys.executable, "-m", "linkescape.bench.failover.mptcp", "server", "--port", str(port), *cc_args],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trials_out = []
    try:
        line = server.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"MPTCP server did not start: {line!r} {server.stderr.read() if server.poll() else ''}")
        for k in range(trials):
            trials_out.append(_mptcp_trial(tb, injector, st, os.path.join(workdir, f"stop{k}"), port, cc_args))
            time.sleep(0.5)
        counters = sampler.stop()
        kernel = sampler.kernel_events()
    finally:
        sampler.close()
        server.kill()
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    per = [_mptcp_numbers(tr, tb, st, counters, kernel, rail_bps) for tr in trials_out]
    for p in per:
        t50, t90 = p["half_ms"], p["restore90_from_fault_ms"]
        log(f"  mptcp cc={cc or 'default'}: baseline {p['baseline_gbps']:.3f} Gbit/s, half rate back after "
            f"{'-' if t50 is None else f'{t50:.0f} ms'}, 90% after "
            f"{'-' if t90 is None else f'{t90:.0f} ms'}, rate 1.5-2.5 s after the cut "
            f"{p['rate_after_gbps']:.3f} Gbit/s")
    return {"setup": setup["commands"], "trials": per,
            "summary": {"half_ms": summarize(p["half_ms"] for p in per),
                        "restore90_from_fault_ms": summarize(p["restore90_from_fault_ms"] for p in per),
                        "rate_after_gbps": summarize(p["rate_after_gbps"] for p in per),
                        "baseline_gbps": summarize(p["baseline_gbps"] for p in per),
                        "lost_ms": summarize(p["lost_ms"] for p in per)}}


def _mptcp_trial(tb, injector, st: Settings, stop: str, port: int, cc_args: List[str]) -> Dict[str, Any]:
    """One MPTCP transfer host 1 -> host 0 through a cut of host 1's primary rail and its repair."""
    client = tb.popen(1, [sys.executable, "-m", "linkescape.bench.failover.mptcp", "client", "--connect",
                          f"{tb.host_addr(0, 0)}:{port}", "--duration", "30", "--stop-file", stop, *cc_args],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = client.stdout.readline().strip()
        time.sleep(st.baseline_s + 1.0)  # slow start over, backup subflows joined
        t_cmd = time.time()
        t_fault = injector.apply("cut", 1, 0)
        time.sleep(3.0)
        t_rcmd = time.time()
        t_restore = injector.repair("cut", 1, 0)
        time.sleep(0.3)
    finally:
        with open(stop, "w"):
            pass
        try:
            out, err = client.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            client.kill()
            out, err = client.communicate()
    return {"t_cmd": t_cmd, "t_fault": t_fault, "t_restore_cmd": t_rcmd, "t_restore": t_restore,
            "client": first, "client_rc": client.returncode, "client_err": err[-500:]}


def _mptcp_numbers(tr: Dict[str, Any], tb, st: Settings, counters: Counters, kernel: List[dict],
                   rail_bps: float) -> Dict[str, Any]:
    """How soon the transfer got half and 90 % of its rate back on rail 1, and what the cut cost."""
    w = st.window
    t_rcmd = tr["t_restore_cmd"]
    t_k = kernel_time(kernel, tb.netns(1), tb.nic(0), "cut", True, tr["t_cmd"], tr["t_fault"] + 0.5)
    t_fault = min(tr["t_fault"], t_k) if t_k is not None else tr["t_fault"]
    tot = counters.series(1, list(range(tb.rails)), "tx")
    bup = counters.series(1, [1], "tx")
    b0, b1 = t_fault - st.baseline_s, t_fault - w - 0.002
    mean = float(counters.rates(tot, np.array([b0]), b1 + w - b0)[0])
    ref = min(rail_bps, mean)
    t50 = counters.first_at_or_above(bup, t_fault, t_rcmd - w, 0.5 * ref, w)
    t90 = counters.first_at_or_above(bup, t_fault, t_rcmd - w, 0.9 * ref, w)
    after = counters.rates(tot, np.array([t_fault + 1.5]), 1.0)[0]
    return {"baseline_gbps": mean / 1e9, "half_ms": ms(t50 - t_fault) if t50 else None,
            "restore90_from_fault_ms": ms(t90 - t_fault) if t90 else None,
            "rate_after_gbps": after / 1e9, "lost_ms": lost_ms(counters, tot, t_fault, t_rcmd, mean),
            "client": tr["client"], "client_rc": tr["client_rc"], "cmd_ms": (t_fault - tr["t_cmd"]) * 1e3}


def run_mptcp_comparison(st: Settings, log: Log) -> dict:
    """MPTCP and linkescape through the same cuts, on the same 2-host testbed, per congestion control."""
    from ...testbed.netns import temporary_testbed

    out = {}
    for cc in st.mptcp_congestions:
        with temporary_testbed(2, st.rails, rate=st.rate, prefix="fm") as tb:
            used = cc or namespace_congestion(tb)
            log(f"MPTCP vs linkescape, 2 hosts x {st.rails} rails at {st.rate}, congestion control {used}")
            mp = run_mptcp_series(tb, st, cc, log, st.mptcp_trials)
            raw = run_fault_series(tb, "cut", st, log, count=st.mptcp_trials, hosts=[0, 1], env=cc_env(cc))
            # like MPTCP: cut the sender's... every host in turn is cut; report the same metric
            le = analyze_series(raw, st)
            out[used] = {"mptcp": mp, "linkescape": {
                "half_ms": le["summary"]["restore50_from_fault_ms"],
                "restore90_from_fault_ms": le["summary"]["restore90_from_fault_ms"],
                "lost_ms": le["summary"]["lost_ms"],
                "detect_local_ms": le["summary"]["detect_local_ms"],
                "wrong": le["wrong"], "hangs": le["hangs"], "errors": le["errors"],
                "per_fault": le["per_fault"]}}
    return out


__all__ = ["run_mptcp_series", "run_mptcp_comparison"]
