"""How a planned fault reaches a rail: one interface, two implementations.

An :class:`Injector` applies and repairs the three mechanisms of a fault
schedule (``cut``, ``blackhole``, ``lossy``) on (host, rail), one at a time,
and returns the wall time (``time.time()``) at which each change took effect.

* :class:`TestbedInjector`: real faults on a testbed's kernel objects
  (:mod:`linkescape.testbed.faults`): the bridge-side veth down (carrier
  loss), nftables drop tables (blackhole) and ``numgen random`` drops (lossy).
  Mechanisms compose on one NIC: each is repaired on its own.
* :class:`EmulatedInjector`: ``Communicator.inject_fault`` inside the ranks
  (no root, loopback rails): ``cut`` is a carrier loss, ``blackhole`` a silent
  loss, ``restore`` the rail repaired. ``lossy`` cannot be emulated and is
  refused with :class:`~linkescape.faults.schedule.UnsupportedFault`. How a
  call reaches a rank is a function ``send(host, action, rail) -> ts``: a
  control channel to other processes (the demo's ``FaultClient.apply``), or
  :meth:`EmulatedInjector.in_process` for communicators in this process.
"""

from __future__ import annotations

import abc
import threading
import time
from typing import Callable, Dict, FrozenSet, Iterable, Optional, Sequence, Set, Tuple

from .schedule import KINDS, MECHANISMS, Schedule, ScheduleError, UnsupportedFault

Send = Callable[[int, str, int], float]


class Injector(abc.ABC):
    """Applies and repairs fault mechanisms on (host, rail); thread-safe."""

    #: True when the faults are emulated inside the ranks, not made in the kernel
    emulated: bool = False
    #: the mechanisms this injector can make
    mechanisms: FrozenSet[str] = frozenset(MECHANISMS)

    @abc.abstractmethod
    def apply(self, mechanism: str, host: int, rail: int, *, loss: Optional[float] = None) -> float:
        """Make ``mechanism`` on (host, rail); returns when it took effect (wall time)."""

    @abc.abstractmethod
    def repair(self, mechanism: str, host: int, rail: int) -> float:
        """Undo ``mechanism`` on (host, rail) and nothing else; safe to repeat."""

    def kinds(self) -> Tuple[str, ...]:
        """The schedule kinds this injector can play."""
        need = {"cut": {"cut"}, "blackhole": {"blackhole"}, "lossy": {"lossy"}, "flap": {"cut"},
                "isolate": {"cut"}, "cross": {"cut"}}
        return tuple(k for k in KINDS if need[k] <= self.mechanisms)

    def check(self, schedule: Schedule) -> None:
        """Raise :class:`UnsupportedFault` if the schedule needs a mechanism this injector lacks."""
        missing = sorted({iv[4] for iv in schedule.intervals()} - set(self.mechanisms))
        if missing:
            raise UnsupportedFault(f"{type(self).__name__} cannot make {', '.join(missing)} faults "
                                   f"({'emulated in the ranks' if self.emulated else 'this testbed'}); "
                                   f"it makes {', '.join(sorted(self.mechanisms))}")

    def _check_mechanism(self, mechanism: str) -> None:
        if mechanism not in MECHANISMS:
            raise ScheduleError(f"unknown fault mechanism {mechanism!r}; expected one of {MECHANISMS}")
        if mechanism not in self.mechanisms:
            raise UnsupportedFault(f"{type(self).__name__} cannot make {mechanism} faults")


class TestbedInjector(Injector):
    """Real faults on a :class:`~linkescape.testbed.netns.Testbed`."""

    __test__ = False  # not a pytest class

    def __init__(self, tb) -> None:
        from ..testbed import faults  # the testbed floor; imported here so no-root users need none of it

        self.tb = tb
        self._faults = faults
        self._lock = threading.Lock()  # one nft/ip change at a time: each is one kernel transaction

    def apply(self, mechanism: str, host: int, rail: int, *, loss: Optional[float] = None) -> float:
        self._check_mechanism(mechanism)
        with self._lock:
            if mechanism == "cut":
                return self._faults.cut(self.tb, host, rail).ts
            if mechanism == "blackhole":
                return self._faults.blackhole(self.tb, host, rail).ts
            if loss is None:
                raise ScheduleError("a lossy fault needs loss (percent)")
            return self._faults.lossy(self.tb, host, rail, loss).ts

    def repair(self, mechanism: str, host: int, rail: int) -> float:
        self._check_mechanism(mechanism)
        with self._lock:
            return self._faults.repair(self.tb, host, rail, mechanism).ts

    def restore_all(self, hosts: Optional[Iterable[int]] = None, rails: Optional[Iterable[int]] = None) -> None:
        """Every fault off every rail NIC (cleanup after a crash)."""
        with self._lock:
            for h in (range(self.tb.hosts) if hosts is None else hosts):
                for r in (range(self.tb.rails) if rails is None else rails):
                    self._faults.restore(self.tb, h, r)


class EmulatedInjector(Injector):
    """Faults emulated by the ranks themselves through ``Communicator.inject_fault``.

    The library knows one state per rail (faulted or not), so overlapping
    mechanisms on one rail are tracked here: the rail is restored only when
    the last one is repaired, and a carrier loss outranks a silent loss.
    """

    emulated = True
    mechanisms = frozenset(("cut", "blackhole"))

    def __init__(self, send: Send) -> None:
        self._send = send
        self._down: Dict[Tuple[int, int], Set[str]] = {}
        self._lock = threading.Lock()

    @classmethod
    def in_process(cls, comms: Sequence) -> "EmulatedInjector":
        """Host ``i`` is the communicator ``comms[i]`` (same process: tests, notebooks)."""
        return cls(lambda host, action, rail: comms[host].inject_fault(rail, action))

    def apply(self, mechanism: str, host: int, rail: int, *, loss: Optional[float] = None) -> float:
        self._check_mechanism(mechanism)
        with self._lock:
            held = self._down.setdefault((host, rail), set())
            was = _strongest(held)
            held.add(mechanism)
            if was == "cut" or was == mechanism:
                return time.time()  # already as down as it gets
            return self._send(host, mechanism, rail)

    def repair(self, mechanism: str, host: int, rail: int) -> float:
        self._check_mechanism(mechanism)
        with self._lock:
            held = self._down.get((host, rail), set())
            if mechanism not in held:
                return time.time()
            was = _strongest(held)
            held.discard(mechanism)
            now = _strongest(held)
            if now is None:
                self._down.pop((host, rail), None)
                return self._send(host, "restore", rail)
            if now != was:  # a cut ended under a blackhole: the rail stays silent
                self._send(host, "restore", rail)
                return self._send(host, now, rail)
            return time.time()


def _strongest(held: Set[str]) -> Optional[str]:
    return "cut" if "cut" in held else ("blackhole" if "blackhole" in held else None)


__all__ = ["Injector", "TestbedInjector", "EmulatedInjector"]
