"""Run one worker per testbed host and follow their JSON lines.

Used by the fault tests, the failover benchmark and the demo's emulation.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

from .netns import Testbed


class Job:
    def __init__(self, tb: Testbed, op: str = "all_reduce", count: int = 1 << 20, iters: int = 10,
                 gap: float = 0.0, duration: float = 0.0, dtype: str = "float32", env: Optional[Dict] = None,
                 hosts: Optional[Sequence[int]] = None, async_depth: int = 0) -> None:
        self.tb = tb
        self.hosts = list(hosts) if hosts is not None else list(range(tb.hosts))
        self.dir = tempfile.mkdtemp(prefix="linkescape-job-")
        os.chmod(self.dir, 0o777)
        self.store = os.path.join(self.dir, "store")
        self.events = os.path.join(self.dir, "events-{rank}.jsonl")
        self.lines: "queue.Queue[dict]" = queue.Queue()
        self.records: List[dict] = []
        self.procs: List[subprocess.Popen] = []
        self.stderr: List[str] = ["" for _ in self.hosts]
        rails = ",".join(tb.rail_nics)
        world = len(self.hosts)
        for rank, host in enumerate(self.hosts):
            e = dict(os.environ)
            e.update({"LINKESCAPE_RAILS": rails, "LINKESCAPE_EVENTS": self.events, "PYTHONUNBUFFERED": "1"})
            e.update(env or {})
            argv = [sys.executable, "-m", "linkescape.testbed.worker", "--rank", str(rank), "--world", str(world),
                    "--store", self.store, "--op", op, "--count", str(count), "--iters", str(iters),
                    "--gap", str(gap), "--duration", str(duration), "--dtype", dtype,
                    "--async-depth", str(async_depth)]
            proc = tb.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
            self.procs.append(proc)
            threading.Thread(target=self._pump, args=(rank, proc), daemon=True).start()
            threading.Thread(target=self._pump_err, args=(rank, proc), daemon=True).start()

    def _pump(self, rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            rec["rank"] = rank
            self.lines.put(rec)

    def _pump_err(self, rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            self.stderr[rank] += line

    def wait_for(self, event: str, rank: Optional[int] = None, iter: Optional[int] = None,
                 timeout: float = 60.0) -> dict:
        """The next record matching; records seen on the way are kept."""
        deadline = time.monotonic() + timeout
        for rec in self.records:
            if _matches(rec, event, rank, iter) and not rec.get("_taken"):
                rec["_taken"] = True
                return rec
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {event} (rank={rank}, iter={iter}) within {timeout}s; "
                                   f"stderr: {self.stderr}")
            try:
                rec = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.records.append(rec)
            if _matches(rec, event, rank, iter):
                rec["_taken"] = True
                return rec

    def finish(self, timeout: float = 120.0) -> List[dict]:
        """Wait for every rank's ``exit`` record; a rank that hangs is killed
        and reported as hung."""
        exits: Dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        for rec in self.records:
            if rec.get("event") == "exit":
                exits[rec["rank"]] = rec
        while len(exits) < len(self.procs) and time.monotonic() < deadline:
            try:
                rec = self.lines.get(timeout=0.2)
            except queue.Empty:
                if all(p.poll() is not None for p in self.procs) and self.lines.empty():
                    break
                continue
            self.records.append(rec)
            if rec.get("event") == "exit":
                exits[rec["rank"]] = rec
        import signal

        hung = [r for r in range(len(self.procs)) if r not in exits and self.procs[r].poll() is None]
        for rank in hung:
            self.procs[rank].send_signal(signal.SIGUSR1)  # Python stacks of every thread, on stderr
        if hung:
            time.sleep(1.0)
        for rank, proc in enumerate(self.procs):
            if rank not in exits:
                exits[rank] = {"event": "exit", "rank": rank, "hung": True, "wrong": None,
                               "error": "hung or died", "stderr": self.stderr[rank][-2000:]}
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return [exits[r] for r in range(len(self.procs))]

    def event_trail(self, rank: int) -> List[dict]:
        from ..events import read_events

        path = self.events.format(rank=rank)
        return read_events(path) if os.path.exists(path) else []

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _matches(rec: dict, event: str, rank: Optional[int], it: Optional[int]) -> bool:
    return (rec.get("event") == event and (rank is None or rec.get("rank") == rank)
            and (it is None or rec.get("iter") == it))
