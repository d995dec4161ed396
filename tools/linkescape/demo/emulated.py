"""Emulated faults for the no-root demo: faults injected inside the process.

On loopback there is no cable to pull, so a rank "cuts" one of its own rails
by doing what the library does when the kernel reports a carrier loss: it
takes every link on that rail down, tells its peers, and refuses to re-open
links on it until the rail is "repaired". A "blackhole" takes the links down
as a silent failure would (cause ``timeout``) without telling anyone.

It goes through ``Communicator.inject_fault(rail, kind)``, which does what
the library does for a real carrier loss (``cut``), a silent loss
(``blackhole``) or a repaired rail (``restore``).

The controller (another process) drives it through a control directory:
it appends ``{"id", "action", "rail"}`` lines to ``rank{R}.cmd.jsonl``; the
rank applies each one and appends ``{"id", "action", "rail", "ts"}`` to
``rank{R}.applied.jsonl``, ``ts`` being the wall time the fault took effect.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict

from ..common import jsonl

ACTIONS = ("cut", "blackhole", "restore")


# ------------------------------------------------------------ in the rank
def find_communicator():
    """The linkescape Communicator behind the default torch process group."""
    from ..torch import get_communicator

    return get_communicator()


def apply_fault(comm, action: str, rail: int) -> float:
    """Apply one emulated fault to ``rail`` of this rank; returns the wall time it took effect."""
    if action not in ACTIONS:
        raise ValueError(f"unknown emulated fault {action!r}")
    return comm.inject_fault(rail, action)


class _Ticker:
    """A daemon thread in a rank that calls :meth:`tick` every ``interval`` s until :meth:`stop`."""

    def __init__(self, name: str, comm_getter: Callable[[], Any], interval: float) -> None:
        self._get = comm_getter
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.tick()

    def tick(self) -> None:  # pragma: no cover - every ticker has its own
        raise NotImplementedError


class FaultAgent(_Ticker):
    """Thread in a rank that applies the controller's emulated faults."""

    def __init__(self, control_dir: str, rank: int, comm_getter: Callable[[], Any] = find_communicator,
                 interval: float = 0.01) -> None:
        super().__init__(f"demo-fault-agent-{rank}", comm_getter, interval)
        self.cmd_path = os.path.join(control_dir, f"rank{rank}.cmd.jsonl")
        self.applied_path = os.path.join(control_dir, f"rank{rank}.applied.jsonl")
        self.rank = rank
        self._commands = jsonl.Tail(self.cmd_path)

    def tick(self) -> None:
        for cmd in self._commands.read():
            rec: Dict[str, Any] = dict(cmd)
            try:
                rec["ts"] = apply_fault(self._get(), cmd["action"], int(cmd["rail"]))
            except Exception as exc:  # noqa: BLE001 - reported to the controller
                rec["ts"] = time.time()
                rec["error"] = f"{type(exc).__name__}: {exc}"
            jsonl.append(self.applied_path, rec)


# ------------------------------------------------------------ in the controller
class FaultClient:
    """Controller side: send an emulated fault to a rank and wait until it is applied."""

    def __init__(self, control_dir: str) -> None:
        self.dir = control_dir
        os.makedirs(control_dir, exist_ok=True)
        self._next = 0

    def apply(self, rank: int, action: str, rail: int, timeout: float = 10.0) -> float:
        self._next += 1
        cid = self._next
        jsonl.append(os.path.join(self.dir, f"rank{rank}.cmd.jsonl"), {"id": cid, "action": action, "rail": rail})
        path = os.path.join(self.dir, f"rank{rank}.applied.jsonl")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in jsonl.read(path):
                if rec.get("id") == cid:
                    if rec.get("error"):
                        raise RuntimeError(f"rank {rank}: emulated {action} on rail {rail} failed: {rec['error']}")
                    return float(rec["ts"])
            time.sleep(0.005)
        raise TimeoutError(f"rank {rank} did not apply emulated {action} on rail {rail} within {timeout}s")


# ------------------------------------------------------------ per-rail byte counters (no NIC to read)
class RailByteSampler(_Ticker):
    """Thread in a rank that writes its bytes sent per rail every ``interval`` s.

    Used where the rails have no NIC of their own (loopback): the bytes the
    library wrote into each rail's sockets, summed over peers and kept
    across re-opened links. Lines: ``{"t": wall time, "tx": [bytes per rail]}``.
    """

    def __init__(self, path: str, comm_getter: Callable[[], Any] = find_communicator, interval: float = 0.05):
        super().__init__("demo-rail-bytes", comm_getter, interval)
        self.path = path

    def stop(self) -> None:
        super().stop()
        self.tick()  # the last count

    def tick(self) -> None:
        try:
            jsonl.append(self.path, {"t": time.time(), "tx": [r["sent"] for r in self._get().rail_bytes()]})
        except Exception:  # noqa: BLE001 - best effort
            pass


__all__ = ["apply_fault", "find_communicator", "FaultAgent", "FaultClient", "RailByteSampler", "ACTIONS"]
