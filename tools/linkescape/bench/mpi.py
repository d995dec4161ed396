"""Open MPI as a backend of ``linkescape bench``: finding it, and the ``mpirun`` job.

Open MPI's ranks cannot live in the benchmark's rank processes (``mpirun``
starts its own), so the job runs beside them and the launcher takes turns:
each (operation, size) is measured by linkescape and Gloo in their ranks,
then by Open MPI in its own, or the other way round, alternating per size
(``runner.LocalLauncher``). Open MPI runs over TCP only, on loopback:
``pml ob1`` (not UCX, which would use shared memory), ``btl tcp,self``,
``btl_tcp_if_include lo``; ``--oversubscribe`` (more ranks than cores) and
otherwise Open MPI's defaults, binding included: it pins each rank to a core
when there are no more ranks than cores, and its ranks poll while they wait;
with ``--bind-to none`` two polling ranks shared one core and a 1 MiB
all_reduce at 2 ranks took 30 ms instead of 0.25 ms (measured here).

Set-up: ``make mpi`` (``apt-get install openmpi-bin``, then ``pip install -e
'.[mpi]'``: mpi4py's wheel from PyPI loads Debian's libmpi). Debian's own
``python3-mpi4py`` with ``/usr/bin/python3`` works too (found when the running
Python has no mpi4py): its ranks then need only mpi4py and numpy.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import types
from typing import Callable, Dict, List, Optional

from ..common import jsonl
from .mpi_rank import EVENT_PREFIX
from .runner import WATCHDOG_GRACE, BenchError, LocalLauncher, _exit_text, make_record
from .spec import BenchSpec

HOW = "make mpi (apt-get install openmpi-bin; pip install 'linkescape[mpi]')"
SYSTEM_PYTHON = "/usr/bin/python3"
RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_rank.py")
MCA = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self", "OMPI_MCA_btl_tcp_if_include": "lo",
       "OMPI_MCA_oob_tcp_if_include": "lo"}


class MpiUnavailable(BenchError):
    """``--backend mpi`` without Open MPI's mpirun or without mpi4py (the message says how to get them)."""


# mpi4py and numpy import, and mpi4py's MPI is Open MPI's (a wheel built for MPICH, started by
# Open MPI's mpirun, makes every rank a world of one); MPI is not initialized by the probe
PROBE = ("import mpi4py, numpy; mpi4py.rc.initialize = False; from mpi4py import MPI; "
         "import sys; sys.exit(0 if 'Open MPI' in MPI.Get_library_version() else 3)")


def _imports(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", PROBE], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.lru_cache(maxsize=None)
def _python_for_mpi(executable: str) -> Optional[str]:
    for python in (executable, SYSTEM_PYTHON):
        if os.path.exists(python) and _imports(python):
            return python
    return None


def find(path: Optional[str] = None) -> Dict[str, str]:
    """``{"mpirun": ..., "python": ...}``; ``MpiUnavailable`` with a one-line how-to when missing."""
    mpirun = shutil.which("mpirun", path=path if path is not None else os.environ.get("PATH"))
    if mpirun is None:
        raise MpiUnavailable(f"backend mpi needs Open MPI's mpirun, which is not on PATH: {HOW}")
    python = _python_for_mpi(sys.executable)
    if python is None:
        raise MpiUnavailable(f"backend mpi needs mpi4py (and numpy) in {sys.executable} or {SYSTEM_PYTHON}: {HOW}")
    return {"mpirun": mpirun, "python": python}


def command(found: Dict[str, str], world_size: int, spec_json: str) -> List[str]:
    args = [found["mpirun"], "-n", str(world_size), "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-run-as-root")
    return args + [found["python"], RANK_SCRIPT, "--spec", spec_json]


def env(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    out = dict(os.environ if base is None else base)
    for key, value in MCA.items():
        out.setdefault(key, value)
    out.setdefault("OMP_NUM_THREADS", "1")
    out["PYTHONUNBUFFERED"] = "1"
    # the ranks' Python finds this linkescape (its cases and checks) when it is not installed there
    import linkescape

    src = os.path.dirname(os.path.dirname(os.path.abspath(linkescape.__file__)))  # its library half's root
    out["PYTHONPATH"] = src + (os.pathsep + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    return out


class MpiLauncher(LocalLauncher):
    """``LocalLauncher`` with Open MPI's job beside the ranks, taking turns per (op, size):
    even steps the ranks first (linkescape, Gloo in their own alternating order), then
    Open MPI; odd steps Open MPI first. Each row is reported once every backend measured it."""

    def __init__(self, spec: BenchSpec, on_event: Callable[[dict], None], verbose: bool = False,
                 python: Optional[str] = None, found: Optional[Dict[str, str]] = None) -> None:
        super().__init__(spec, on_event, verbose=verbose, python=python)
        self.found = found or find()
        spec.gated = True  # the ranks wait for their turns (Rank.gate)
        self.steps = spec.steps()
        self.step = 0
        self.ready = {"ranks": False, "mpi": False}
        self.results: Dict[str, Optional[list]] = {"ranks": None, "mpi": None}
        self.asked: Dict[str, bool] = {"ranks": False, "mpi": False}
        self.asked_at = 0.0
        self.finished_at = 0.0  # when the last step's row was reported
        self.mpi: Optional[subprocess.Popen] = None
        self.started_at = time.monotonic()
        # MPI_Init and rank 0's "ready": as long as one call may take, and the watchdog's grace
        self.start_limit = spec.timeout + WATCHDOG_GRACE
        self.mpi_tail: collections.deque = collections.deque(maxlen=40)
        self.mpi_info: dict = {}
        # a step of Open MPI's: a checked run, warm-up and timed calls, each within --timeout
        self.step_limit = (spec.warmup + spec.iters + 2) * spec.timeout + WATCHDOG_GRACE

    # --------------------------------------------------------------- the mpirun job
    def run(self) -> None:
        cmd = command(self.found, self.spec.world_size, json.dumps(self.spec.to_dict()))
        self.started_at = time.monotonic()
        self.mpi = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env())
        for stream, name in ((self.mpi.stdout, "stdout"), (self.mpi.stderr, "stderr")):
            threading.Thread(target=self._read_mpi, args=(stream, name), daemon=True).start()
        super().run()

    def _read_mpi(self, stream, name: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if name == "stdout" and line.startswith(EVENT_PREFIX):
                event = jsonl.parse(line[len(EVENT_PREFIX):])
                if event is not None:
                    self.events.put(("mpi", event))
                    continue
            self.events.put(("mpi", {"event": "line", "stream": name, "line": line}))
        stream.close()
        self.events.put(("mpi", {"event": "eof", "stream": name}))

    def _order(self, step: int) -> List[str]:
        return ["ranks", "mpi"] if step % 2 == 0 else ["mpi", "ranks"]

    def _ask(self, who: str) -> None:
        self.asked[who] = True
        self.asked_at = time.monotonic()
        if who == "ranks":
            self.go()
        else:
            self.mpi.stdin.write(b"go\n")
            self.mpi.stdin.flush()

    def _advance(self) -> None:
        """Asks the next backend group for its turn, or reports the finished row."""
        if not (self.ready["ranks"] and self.ready["mpi"]) or self.step >= len(self.steps):
            return
        for who in self._order(self.step):
            if self.results[who] is None:
                if not self.asked[who]:
                    self._ask(who)
                return
        op, _size = self.steps[self.step]
        by = {r["backend"]: r for r in self.results["ranks"] + self.results["mpi"]}
        self.on_event({"event": "row", "op": op, "records": [by[b] for b in self.spec.backends]})
        self.step += 1
        self.results = {"ranks": None, "mpi": None}
        self.asked = {"ranks": False, "mpi": False}
        self._advance()

    # --------------------------------------------------------------- hooks
    def _deliver(self, rank: int, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "row":
            self.results["ranks"] = ev["records"]
            self._advance()
            return
        self.on_event(ev)
        if kind == "ranks":
            self.ready["ranks"] = True
            self._advance()

    def _other(self, rank, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "line":
            self.mpi_tail.append(ev["line"])
            if self.verbose:
                print(f"[mpi] {ev['line']}", file=sys.stderr, flush=True)
        elif kind == "ready":
            if ev.get("world_size") != self.spec.world_size:
                raise self._mpi_failure(f"its ranks see a world of {ev.get('world_size')}, not "
                                        f"{self.spec.world_size}: mpi4py in {ev.get('python')} is not built for "
                                        f"this mpirun's MPI ({ev.get('library')})")
            self.mpi_info = ev
            self.ready["mpi"] = True
            self._advance()
        elif kind == "result":
            self.results["mpi"] = [self._record(ev)]
            self._advance()
        elif kind == "eof" and ev.get("stream") == "stdout":
            measured = self.step + (self.results["mpi"] is not None)  # the steps Open MPI finished
            if measured < len(self.steps):
                raise self._mpi_failure(f"mpirun ended before step {measured + 1} of {len(self.steps)}")

    def _record(self, ev: dict) -> dict:
        op, size = self.steps[self.step]
        case = types.SimpleNamespace(nbytes=ev["nbytes"], count=ev["count"])
        spec = self.spec
        if spec.check and any(r["wrong"] is None for r in ev["ranks"]):
            spec = dataclasses.replace(spec, check=False)  # a Python without linkescape's checks
        rec = make_record(spec, op, "mpi", case, ev["ranks"], ["lo"], size)
        rec["library"] = self.mpi_info.get("library")
        return rec

    def _others_check(self) -> None:
        rc = self.mpi.poll() if self.mpi is not None else None
        if rc is not None and rc != 0:
            raise self._mpi_failure(f"mpirun {_exit_text(rc)}")
        if not self.ready["mpi"] and time.monotonic() - self.started_at > self.start_limit:
            raise self._mpi_failure(f"Open MPI's ranks did not start within {self.start_limit:.0f}s")
        if self.step >= len(self.steps) and rc is None:
            self.finished_at = self.finished_at or time.monotonic()
            if time.monotonic() - self.finished_at > WATCHDOG_GRACE:
                raise self._mpi_failure(f"mpirun did not exit within {WATCHDOG_GRACE:g}s of its last step")
        waiting = [w for w in ("ranks", "mpi") if self.asked[w] and self.results[w] is None]
        if "mpi" in waiting and time.monotonic() - self.asked_at > self.step_limit:
            raise self._mpi_failure(f"Open MPI's ranks took more than {self.step_limit:.0f}s for one step")

    def _mpi_failure(self, what: str) -> BenchError:
        self.kill_all()
        deadline = time.monotonic() + 1.0  # mpirun's last words, still in the pipe
        while time.monotonic() < deadline:
            try:
                who, ev = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            if who == "mpi" and ev.get("event") == "line":
                self.mpi_tail.append(ev["line"])
        lines = [f"Open MPI's job ({' '.join(self.found.values())}): {what}"]
        tail = [line for line in self.mpi_tail if line.strip()]
        if tail:
            lines.append("  last output of mpirun:")
            lines.extend("    " + line for line in tail[-15:])
        return BenchError("\n".join(lines))

    def _others_done(self) -> bool:
        return self.step >= len(self.steps) and (self.mpi is None or self.mpi.poll() == 0)

    def kill_all(self) -> None:
        if self.mpi is not None and self.mpi.poll() is None:
            try:
                self.mpi.stdin.close()  # its rank 0 reads an end: the job ends at the next turn
            except OSError:
                pass
            self.mpi.terminate()
            try:
                self.mpi.wait(5.0)
            except subprocess.TimeoutExpired:
                self.mpi.kill()
                self.mpi.wait()
        super().kill_all()


__all__ = ["MpiUnavailable", "MpiLauncher", "find", "command", "env", "HOW", "RANK_SCRIPT"]
