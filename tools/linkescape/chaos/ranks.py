"""The chaos ranks: one worker process per testbed host, and what they say.

The processes are a :class:`~linkescape.testbed.job.RankJob`; each rank's
stdout JSON lines update its :class:`RankState` (last progress, resources,
mismatches, exit); stderr goes to ``stderr-{rank}.txt`` in the run directory,
so a traceback or a faulthandler dump (SIGUSR1, sent before a hung rank is
killed) is kept for the report's reader.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional


@dataclass
class RankState:
    rank: int
    host: int
    ready: bool = False
    progress: Dict[str, Any] = field(default_factory=dict)
    resources: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    mismatches: List[Dict[str, Any]] = field(default_factory=list)
    exit: Optional[Dict[str, Any]] = None
    hung: bool = False
    returncode: Optional[int] = None
    part: Optional[int] = None  #: which part of the run (None: a run of one part)

    def outstanding(self, now: float) -> Optional[float]:
        """Seconds the current step has been outstanding (None when between steps or not started)."""
        since = self.progress.get("since")
        return None if since is None else max(0.0, now - since)

    def idle(self, now: float) -> Optional[float]:
        """Seconds since this rank last finished a step, or was seen starting one."""
        last = self.progress.get("since") or self.progress.get("last_done")
        return None if last is None else max(0.0, now - last)


class Ranks:
    """Start ``world`` chaos workers, one in each of ``hosts`` of ``tb`` (a :class:`~linkescape.testbed.job.RankJob`)."""

    def __init__(self, tb, hosts: List[int], run_dir: str, *, seed: int, max_bytes: int,
                 env: Mapping[str, str], part: Optional[int] = None) -> None:
        from ..testbed.job import RankJob

        self.tb = tb
        self.dir = run_dir
        self.world = len(hosts)
        self.part = part
        self.states = [RankState(rank, host, part=part) for rank, host in enumerate(hosts)]
        self.lock = threading.Lock()
        # ops and event trails go to the run directory (appended by every part); the job's own files (store,
        # stop file, stderr) to the part's directory when the run has several parts
        workdir = run_dir if part is None else os.path.join(run_dir, f"part-{part}")
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        store = os.path.join(workdir, "store")
        commands = [[sys.executable, "-m", "linkescape.chaos.worker", "--rank", str(rank), "--world", str(self.world),
                     "--store", store, "--seed", str(seed), "--ops", self.ops_path(rank),
                     "--stop-file", os.path.join(workdir, "stop"), "--max-bytes", str(max_bytes)]
                    for rank in range(self.world)]
        self.job = RankJob(commands, tb=tb, hosts=hosts, env=env, workdir=workdir, stderr_files=True,
                           on_record=self._on_record)
        self.stop_file = self.job.stop_file
        self.procs = self.job.procs

    def ops_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"ops-{rank}.jsonl")

    def _on_record(self, rank: int, rec: Dict[str, Any]) -> None:
        st = self.states[rank]
        ev = rec.get("event")
        with self.lock:
            if ev == "progress":
                st.progress = rec
            elif ev == "ready":
                st.ready = True
            elif ev == "resources":
                st.resources[rec.get("at", "?")] = {**{k: v for k, v in rec.items()
                                                       if k not in ("event", "at", "rank")}, "t": time.time()}
            elif ev == "mismatch":
                st.mismatches.append(rec)
            elif ev == "exit":
                st.exit = rec

    # ------------------------------------------------------------ waiting
    def dead(self) -> List[int]:
        """Ranks whose process ended."""
        return self.job.dead()

    def wait(self, pred, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if self.dead():
                raise RuntimeError(f"rank(s) {self.dead()} exited while waiting for {what}; see {self.dir}/stderr-*.txt")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f}s; see {self.dir}/stderr-*.txt")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 120.0, steps: int = 20) -> None:
        self.wait(lambda: all(s.ready for s in self.states), timeout, "every rank connected")
        self.wait(lambda: all(s.progress.get("steps", 0) >= steps for s in self.states), timeout,
                  f"{steps} steps on every rank")

    def finish(self, timeout: float) -> None:
        """Ask every rank to stop (together) and wait for their exits; a rank still
        running after ``timeout`` is hung: its Python stacks are dumped to its stderr, then it is killed."""
        self.job.finish(timeout, dump_wait=1.5)
        for r, p in enumerate(self.procs):
            self.states[r].hung = self.job.hung[r]
            self.states[r].returncode = p.returncode

    def kill(self) -> None:
        self.job.kill()

    # ------------------------------------------------------------ results
    def resources(self) -> List[Optional[Dict[str, float]]]:
        """Each rank's RSS (MB), open fds and OS threads, read from ``/proc`` (None once it ended)."""
        return [proc_resources(p.pid) if p.poll() is None else None for p in self.procs]

    def tcp_counters(self) -> List[Optional[Dict[str, int]]]:
        """Each rank's namespace's TCP counters (``/proc/PID/net``: no process to spawn), None once it ended."""
        return [tcp_counters(p.pid) if p.poll() is None else None for p in self.procs]

    def stderr_tail(self, rank: int, n: int = 4000) -> str:
        return self.job.stderr_tail(rank, n)


def proc_resources(pid: int) -> Optional[Dict[str, float]]:
    """RSS in MB, open file descriptors and OS threads of process ``pid`` (None if it is gone)."""
    out: Dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    out["rss_mb"] = round(int(line.split()[1]) / 1024.0, 2)
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        return None
    return out if "rss_mb" in out else None


_TCP_KEYS = {("TcpExt:", "TCPTimeouts"): "rto", ("TcpExt:", "TCPLossProbes"): "tlp",
             ("TcpExt:", "TCPSynRetrans"): "syn_retrans", ("Tcp:", "RetransSegs"): "retrans"}


def tcp_counters(pid: int) -> Optional[Dict[str, int]]:
    """Retransmission timeouts, tail-loss probes, SYN and segment retransmissions of ``pid``'s namespace."""
    out: Dict[str, int] = {}
    for name in ("netstat", "snmp"):
        try:
            with open(f"/proc/{pid}/net/{name}") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return None
        for head, vals in zip(lines[::2], lines[1::2]):
            keys, nums = head.split(), vals.split()
            for (sect, key), short in _TCP_KEYS.items():
                if keys and keys[0] == sect and key in keys:
                    out[short] = int(nums[keys.index(key)])
    return out


__all__ = ["Ranks", "RankState", "tcp_counters", "proc_resources"]
