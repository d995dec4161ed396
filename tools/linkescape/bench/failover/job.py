"""The failover benchmark's job: one :mod:`.worker` rank per testbed host, as a shared RankJob."""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Sequence

from ...testbed.job import RankJob


class FailoverJob(RankJob):
    """``depth`` all_reduces of ``size`` bytes (float32) in flight on every rank, until stopped.

    Records: ``ready``, ``done`` (per iteration, wall time ``t``), ``links``,
    ``exit``; event trails in ``events-R.jsonl`` of the job's directory.
    """

    def __init__(self, tb, *, size: int, depth: int, rails: Optional[str] = None, env: Optional[Dict] = None,
                 duration: float = 3600.0, hosts: Optional[Sequence[int]] = None) -> None:
        hosts = list(hosts) if hosts is not None else list(range(tb.hosts))
        import tempfile

        workdir = tempfile.mkdtemp(prefix="linkescape-fo-")
        events = os.path.join(workdir, "events-{rank}.jsonl")
        self.count = max(1, size // 4)
        self.nbytes = self.count * 4
        self.rails = rails or ",".join(tb.rail_nics)
        world = len(hosts)
        commands = [[sys.executable, "-m", "linkescape.bench.failover.worker", "--rank", str(rank),
                     "--world", str(world), "--store", os.path.join(workdir, "store"), "--count", str(self.count),
                     "--depth", str(depth), "--duration", str(duration),
                     "--stop-file", os.path.join(workdir, "stop")] for rank in range(world)]
        base = {"LINKESCAPE_RAILS": self.rails, "LINKESCAPE_EVENTS": events, "PYTHONUNBUFFERED": "1",
                "LINKESCAPE_TIMEOUT": "60"}
        super().__init__(commands, tb=tb, hosts=hosts, env={**base, **(env or {})}, workdir=workdir, events=events)
        self._own_dir = True

    def dones(self, rank: int) -> List[dict]:
        return self.records_of(rank, "done")

    def wait_ready(self, iters: int = 2, timeout: float = 120.0) -> None:
        self.wait(lambda: all(len(self.dones(r)) >= iters for r in range(self.world)), timeout,
                  f"{iters} all_reduces on every rank")


__all__ = ["FailoverJob"]
