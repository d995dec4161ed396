"""Running the memory benchmark's cases and printing its table.

Each case runs twice, the control first: ``world`` rank processes of
:mod:`.rank` (a :class:`linkescape.testbed.job.RankJob`) on reused buffers,
then on fresh ones. Healthy cases run on this machine over two loopback rails
(127.0.0.1, 127.0.0.2); ``cuts`` cases run in a testbed of ``world`` hosts x 2
rails (unshaped veths), where host 0's rail 0 is cut (carrier lost) for 0.2 s
every 0.8 s for as long as the ranks run (their hold-down is 200 ms, so traffic
fails over and back every cycle).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from ...common import jsonl
from ...testbed.job import RankJob
from .cases import Case
from .verdict import MiB, fit, judge

LOOPBACK_RAILS = "127.0.0.1,127.0.0.2"
CUT_S, RESTORED_S = 0.2, 0.6
HOLDDOWN_MS = 200


class MemoryBenchError(RuntimeError):
    pass


class Cutter:
    """Cuts host 0's rail 0 and restores it, again and again, until stopped (then it is restored)."""

    def __init__(self, tb) -> None:
        self.tb = tb
        self.cycles = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="memory-cutter", daemon=True)

    def start(self) -> "Cutter":
        self._thread.start()
        return self

    def _main(self) -> None:
        while not self._stop.is_set():
            self.tb.cut(0, 0)
            self._stop.wait(CUT_S)
            self.tb.restore(0, 0)
            self.cycles += 1
            self._stop.wait(RESTORED_S)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.cycles


def run_ranks(case: Case, buffers: str, *, world: int = 2, tb=None, keep_every: int = 0,
              timeout: float = 900.0, env: Optional[Dict[str, str]] = None,
              backend: str = "linkescape") -> Dict[str, Any]:
    """One run of ``case`` on ``buffers`` (fresh or reused): every rank's series, the cut cycles, the wall time.

    ``backend="gloo"`` (torch cases): the same calls on torch's Gloo over loopback, no cuts (Gloo has no
    second rail to fail over to); what fresh tensors cost a job under the library it replaces."""
    if case.condition == "cuts" and tb is None and backend == "linkescape":
        raise MemoryBenchError(f"{case.name}: cuts need a testbed")
    spec = json.dumps(dataclasses.asdict(case))
    # healthy cases, and the reference runs, are on loopback even when a testbed exists
    on_testbed = case.condition == "cuts" and backend == "linkescape"
    job_env = {"LINKESCAPE_RAILS": ",".join(tb.rail_nics) if on_testbed else LOOPBACK_RAILS,
               "LINKESCAPE_POLICY": case.policy, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if backend == "gloo":
        job_env["GLOO_SOCKET_IFNAME"] = "lo"
    if on_testbed:
        job_env["LINKESCAPE_FAILBACK_HOLDDOWN_MS"] = str(HOLDDOWN_MS)
    job_env.update(env or {})
    t0 = time.monotonic()
    job = None
    cutter = None
    try:
        workdir = tempfile.mkdtemp(prefix="linkescape-mem-")
        job = RankJob(_commands(case, buffers, world, spec, keep_every, os.path.join(workdir, "store"), backend),
                      tb=tb if on_testbed else None, env=job_env, workdir=workdir)
        job._own_dir = True  # removed at close, as the testbed's Job does
        job.wait(lambda: all(job.records_of(r, "ready") for r in range(world)), 180, "every rank ready")
        if on_testbed:
            cutter = Cutter(tb).start()
        exits = job.finish(timeout, stop=False)
        cycles = cutter.stop() if cutter is not None else 0
        cutter = None
        bad = [e for e in exits if e.get("error")]
        series = [job.records_of(r, "series") for r in range(world)]
        if bad or not all(series):
            raise MemoryBenchError(f"{case.name} ({buffers}): " + "; ".join(
                f"rank {e['rank']}: {e.get('error')}\n{e.get('stderr', '')[-2000:]}" for e in bad))
        return {"buffers": buffers, "backend": backend, "series": [s[0] for s in series], "cut_cycles": cycles,
                "wall_s": time.monotonic() - t0}
    finally:
        if cutter is not None:
            cutter.stop()
        if job is not None:
            job.close()


def _commands(case: Case, buffers: str, world: int, spec: str, keep_every: int, store: str,
              backend: str = "linkescape") -> List[List[str]]:
    return [[sys.executable, "-m", "linkescape.bench.memory.rank", "--rank", str(r), "--world", str(world),
             "--store", store, "--case", spec, "--buffers", buffers, "--keep-every", str(keep_every),
             "--backend", backend]
            for r in range(world)]


def run_case(case: Case, *, world: int = 2, tb=None, keep_every: int = 0,
             env: Optional[Dict[str, str]] = None, reference: Optional[bool] = None) -> Dict[str, Any]:
    """The control, then fresh buffers (and, for a torch case, fresh tensors on Gloo: ``reference``,
    on by default for torch cases); the case's record with its verdict."""
    runs = {b: run_ranks(case, b, world=world, tb=tb, keep_every=keep_every if b == "fresh" else 0, env=env)
            for b in ("reused", "fresh")}
    if reference is None:
        reference = case.api == "torch"
    if reference:
        runs["gloo"] = run_ranks(case, "fresh", world=world, env=env, backend="gloo")
    fits = {b: [fit(s["ops"], s["rss"]) for s in runs[b]["series"]] for b in runs}
    verdict = judge(fits["fresh"], fits["reused"], case.step_bytes(world), reference=fits.get("gloo"))
    wrong = sum(s["wrong"] for b in runs for s in runs[b]["series"])
    return {"case": case.name, **dataclasses.asdict(case), "world_size": world, "keep_every": keep_every,
            "step_bytes": case.step_bytes(world), "flat": verdict["flat"] and wrong == 0, "wrong": wrong,
            "verdict": verdict, "runs": runs}


# ---------------------------------------------------------------- the table
COLUMNS = ("case", "ops", "fresh RSS warm -> end (MiB)", "fresh slope (MiB/1k ops)", "fresh climb (MiB)",
           "control RSS warm -> end (MiB)", "control slope (MiB/1k ops)", "control climb (MiB)",
           "gloo fresh warm -> end (MiB)", "gloo fresh climb (MiB)", "allowance (MiB)", "s/run", "verdict")


def row(rec: Dict[str, Any]) -> List[str]:
    v = rec["verdict"]
    w = v["ranks"][v["worst_rank"]]
    f, c = w["fresh"], w["control"]
    secs = max(s["seconds"] + s["warmup_seconds"] for s in rec["runs"]["fresh"]["series"])
    if rec["wrong"]:
        verdict = "WRONG RESULTS"
    elif not rec["flat"]:
        verdict = "GROWS"
    else:
        verdict = "flat" if v["flat_own"] else "as gloo"
    refs = [d["reference"] for d in v["ranks"] if "reference" in d]
    g = max(refs, key=lambda x: x["climb"]) if refs else None  # the reference's worst rank
    gloo = [f"{g['warm'] / MiB:.1f} -> {g['end'] / MiB:.1f}", f"{g['climb'] / MiB:.1f}"] if g else ["-", "-"]
    if rec["condition"] == "cuts":
        verdict += f" ({rec['runs']['fresh']['cut_cycles']} cuts)"
    return [rec["case"], f"{rec['warmup']}+{rec['ops']}", f"{f['warm'] / MiB:.1f} -> {f['end'] / MiB:.1f}",
            f"{f['slope_per_1k'] / MiB:+.3f}", f"{f['climb'] / MiB:.1f}",
            f"{c['warm'] / MiB:.1f} -> {c['end'] / MiB:.1f}", f"{c['slope_per_1k'] / MiB:+.3f}",
            f"{c['climb'] / MiB:.1f}", *gloo, f"{v['allowance'] / MiB:.0f}", f"{secs:.1f}", verdict]


def table_line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def header_lines(command: str, world: int) -> List[str]:
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = ["?"]
    return [f"# {command}",
            f"# date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}  host: "
            f"{platform.node()}  kernel: {platform.release()}  cpus: {os.cpu_count()}  loadavg: {' '.join(load)}",
            f"# {world} ranks; healthy: loopback rails {LOOPBACK_RAILS}; cuts: a testbed of {world} hosts x 2 "
            f"unshaped rails, host 0 rail 0 cut {CUT_S:g} s every {CUT_S + RESTORED_S:g} s, hold-down "
            f"{HOLDDOWN_MS} ms",
            "# RSS of the worst rank, sampled 20 times after the warm-up; slope: least squares; "
            "climb: the most RSS rose above an earlier sample; "
            "flat: fresh rise - control rise <= allowance and fresh climb <= control climb + allowance; "
            "torch cases: 'as gloo' when not, but within the reference allowance of the same fresh tensors on "
            "gloo (loopback, no cuts)",
            table_line(COLUMNS), table_line(["---"] * len(COLUMNS))]


def run_memory(cases: Sequence[Case], *, json_path: Optional[str] = None, echo: Callable[[str], None] = print,
               world: int = 2, command: str = "linkescape bench --memory", keep_every: int = 0,
               env: Optional[Dict[str, str]] = None) -> List[Dict[str, Any]]:
    """Run ``cases``, print the table (a row as each case ends), write JSON lines; returns the records."""
    for line in header_lines(command, world):
        echo(line)
    if json_path:
        open(json_path, "w").close()  # a fresh file; each record is appended as its case ends
    tb = None
    records: List[Dict[str, Any]] = []
    try:
        if any(c.condition == "cuts" for c in cases):
            from ...testbed.netns import make_temporary

            tb = make_temporary(world, 2, prefix="m")
            echo(f"# testbed {tb.name} up (torn down at the end, on Ctrl-C and on SIGTERM)")
        for case in cases:
            rec = run_case(case, world=world, tb=tb, keep_every=keep_every, env=env)
            records.append(rec)
            echo(table_line(row(rec)))
            if json_path:
                jsonl.append(json_path, rec)
    finally:
        if tb is not None:
            from ...testbed.netns import release

            release(tb)
    flat = sum(1 for r in records if r["flat"])
    as_gloo = sum(1 for r in records if r["flat"] and not r["verdict"]["flat_own"])
    echo(f"# {flat} of {len(records)} cases flat" + (f" ({as_gloo} of them as gloo: by the reference run on "
                                                      f"the same fresh tensors, not by the control)" if as_gloo else ""))
    return records


__all__ = ["run_memory", "run_case", "run_ranks", "row", "header_lines", "MemoryBenchError", "Cutter"]
