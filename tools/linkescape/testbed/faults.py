"""Fault injection on a testbed rail: cut, blackhole, lossy, flap, repair, restore.

* **cut** sets the bridge-side veth of (host, rail) down in the root namespace:
  the host's NIC loses carrier (NO-CARRIER, no LOWER_UP), as when a cable is
  pulled or an optic dies. The host can notice it from the kernel.
* **blackhole** installs an nftables ``netdev`` table inside the host that
  drops everything on the NIC's ingress and egress hooks. Carrier stays up, so
  only timeouts and heartbeats can notice it (a bad switch port, a dead ToR
  behind a live link). On kernels without the netdev egress hook (< 5.16) it
  falls back to ingress hooks on both ends of the veth.
* **lossy** is a grey failure: the same hooks drop each packet at random with
  probability ``loss`` percent (nftables ``numgen random``), independently in
  both directions; the carrier stays up and most packets still pass (a dirty
  optic, a marginal cable).
* **flap** alternates down and up with a period; it always ends with the link up.
* **repair** undoes one kind (``cut``, ``blackhole`` or ``lossy``) and leaves
  the others, so overlapping faults on one rail compose and end one by one.
* **restore** undoes every kind; it is idempotent.

Every fault returns a :class:`FaultEvent` whose ``ts`` is the wall time
(``time.time()``) right after the kernel accepted the change, i.e. the moment
from which the fault is in effect. Benchmarks measure detection latency from it.

This module needs a testbed (:mod:`.netns`); the testbed does not need it.
Importing it gives :class:`~linkescape.testbed.netns.Testbed` the convenience
methods ``tb.cut(i, r)``, ``tb.blackhole``, ``tb.lossy``, ``tb.repair``,
``tb.restore``, ``tb.flap`` and ``tb.flap_async`` (importing
:mod:`linkescape.testbed` always does).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Union

from . import nft
from .netns import Testbed
from .shell import TestbedError, require_nft, require_root, run as _run

Rail = Union[int, str]

#: ``auto`` (egress hook, falling back to ingress-only), ``egress`` or ``ingress``.
BLACKHOLE_MODE_ENV = "LINKESCAPE_TESTBED_BLACKHOLE"
_egress_supported: Optional[bool] = None  # learnt on the first blackhole or lossy fault

#: the kinds :func:`repair` undoes one at a time
KINDS = ("cut", "blackhole", "lossy")
LOSS_MIN, LOSS_MAX = 0.01, 100.0  # percent


@dataclass
class FaultEvent:
    """One fault applied (or undone) at wall time ``ts``."""

    ts: float
    fault: str  # cut | blackhole | lossy | repair | restore | flap
    host: int
    rail: Rail
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"ts": self.ts, "fault": self.fault, "host": self.host, "rail": self.rail, **self.extra}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def _rail_tag(rail: Rail) -> str:
    return "m" if rail == "mgmt" else str(int(rail))


def host_table(tb: Testbed, rail: Rail, kind: str = "blackhole") -> str:
    """Name of the drop table inside a host (one per rail and kind, so faults compose)."""
    return nft.host_table(kind, tb.nic(rail))


def root_table(tb: Testbed, i: int, rail: Rail, kind: str = "blackhole") -> str:
    """Root-namespace table of the ingress-only fallback (prefixed: root is shared)."""
    return nft.root_table(kind, tb.name, i, _rail_tag(rail))


def _check(tb: Testbed, i: int, rail: Rail) -> None:
    require_root("fault injection")
    tb.netns(i)  # validates host
    tb.root_veth(i, rail)  # validates rail


def _install(tb: Testbed, i: int, rail: Rail, kind: str, make: Callable[[str, list], str]) -> str:
    """Install the nftables table of a silent fault; returns which hooks it uses."""
    global _egress_supported
    _check(tb, i, rail)
    require_nft()
    nic = tb.nic(rail)
    what = f"{kind} host {i} rail {rail}"
    mode = os.environ.get(BLACKHOLE_MODE_ENV, "auto").strip().lower()
    if mode not in ("auto", "egress", "ingress"):
        raise TestbedError(f"{BLACKHOLE_MODE_ENV}={mode!r}: expected auto, egress or ingress")
    if mode == "egress" or (mode == "auto" and _egress_supported is not False):
        script = make(host_table(tb, rail, kind), [("in", "ingress", nic), ("out", "egress", nic)])
        proc = nft.apply(tb.netns(i), script, check=False)
        if proc.returncode == 0:
            _egress_supported = True
            return "ingress+egress"
        if mode == "egress":
            raise TestbedError(f"{what}: {proc.stderr.strip()}")
        _egress_supported = False  # old kernel or nft: use the fallback from now on
    # Fallback: ingress on the host NIC (traffic to the host) and ingress on the
    # bridge-side veth (traffic from the host). Host side first, so the fault
    # is complete once the second one is in.
    nft.apply(tb.netns(i), make(host_table(tb, rail, kind), [("in", "ingress", nic)]), what=f"{what} (host side)")
    nft.apply(None, make(root_table(tb, i, rail, kind), [("in", "ingress", tb.root_veth(i, rail))]),
              what=f"{what} (bridge side)")
    return "ingress-both-ends"


# ------------------------------------------------------------------ faults
def cut(tb: Testbed, i: int, rail: Rail) -> FaultEvent:
    """Take the bridge-side veth down: host ``i``'s NIC loses carrier."""
    _check(tb, i, rail)
    _run(["ip", "link", "set", tb.root_veth(i, rail), "down"], what=f"cut host {i} rail {rail}")
    return FaultEvent(time.time(), "cut", i, rail)


def blackhole(tb: Testbed, i: int, rail: Rail) -> FaultEvent:
    """Drop all traffic in and out of host ``i``'s NIC on ``rail``; carrier stays up."""
    hooks = _install(tb, i, rail, "blackhole", nft.drop_table)
    return FaultEvent(time.time(), "blackhole", i, rail, {"hooks": hooks})


def lossy(tb: Testbed, i: int, rail: Rail, loss: float = 5.0) -> FaultEvent:
    """Drop ``loss`` percent of the packets in and out of host ``i``'s NIC, at random; carrier stays up.

    Applying it again changes the share. The granularity is 0.01 %.
    """
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        raise TestbedError(f"lossy: loss must be a number of percent, got {loss!r}") from None
    if not LOSS_MIN <= loss <= LOSS_MAX:
        raise TestbedError(f"lossy: loss {loss}% is not in [{LOSS_MIN}, {LOSS_MAX}]")
    units = max(1, round(loss * nft.LOSS_SCALE / 100.0))
    hooks = _install(tb, i, rail, "lossy", lambda table, h: nft.loss_table(table, h, units))
    return FaultEvent(time.time(), "lossy", i, rail, {"loss": units * 100.0 / nft.LOSS_SCALE, "hooks": hooks})


def _delete_tables(tb: Testbed, i: int, rail: Rail, kind: str) -> None:
    if shutil.which("nft") is None:
        return  # no nftables: no table can exist
    what = f"repair {kind} host {i} rail {rail}"
    nft.apply(tb.netns(i), nft.delete_table(host_table(tb, rail, kind)), what=what)
    # The fallback's bridge-side table may exist even if this process never
    # made one (another process, LINKESCAPE_TESTBED_BLACKHOLE=ingress).
    nft.apply(None, nft.delete_table(root_table(tb, i, rail, kind)), what=what)


def _flush_neighbours(tb: Testbed, rail: Rail) -> None:
    # Neighbour entries left INCOMPLETE/FAILED by traffic during the fault only
    # re-probe on their retransmit timer (1 s); drop them on this rail in every
    # host so the first packet after the repair resolves at once.
    for h in range(tb.hosts):
        _run(["ip", "-n", tb.netns(h), "neigh", "flush", "dev", tb.nic(rail), "nud", "incomplete",
              "nud", "failed"], check=False)


def repair(tb: Testbed, i: int, rail: Rail, kind: str) -> FaultEvent:
    """Undo one kind of fault (``cut``, ``blackhole`` or ``lossy``) on host ``i``'s NIC; safe to repeat.

    The other kinds stay: a rail that is cut and blackholed carries nothing
    until both are repaired.
    """
    if kind not in KINDS:
        raise TestbedError(f"repair: unknown fault kind {kind!r}; expected one of {KINDS}")
    _check(tb, i, rail)
    if kind == "cut":
        _run(["ip", "-n", tb.netns(i), "link", "set", tb.nic(rail), "up"], what=f"repair cut host {i} rail {rail}")
        _run(["ip", "link", "set", tb.root_veth(i, rail), "up"], what=f"repair cut host {i} rail {rail}")
    else:
        _delete_tables(tb, i, rail, kind)
    ts = time.time()
    if kind != "lossy":
        _flush_neighbours(tb, rail)
    return FaultEvent(ts, "repair", i, rail, {"kind": kind})


def restore(tb: Testbed, i: int, rail: Rail) -> FaultEvent:
    """Undo every fault (cut, blackhole, lossy) on host ``i``'s NIC on ``rail``; safe to repeat."""
    _check(tb, i, rail)
    for kind in ("blackhole", "lossy"):
        _delete_tables(tb, i, rail, kind)
    _run(["ip", "-n", tb.netns(i), "link", "set", tb.nic(rail), "up"], what=f"restore host {i} rail {rail}")
    _run(["ip", "link", "set", tb.root_veth(i, rail), "up"], what=f"restore host {i} rail {rail}")
    ts = time.time()
    _flush_neighbours(tb, rail)
    return FaultEvent(ts, "restore", i, rail)


def blackholed_nics(tb: Testbed, i: int) -> set:
    """NIC names of host ``i`` that currently have a drop table."""
    return nft.blackholed_nics(tb.netns(i))


def is_blackholed(tb: Testbed, i: int, rail: Rail) -> bool:
    return tb.nic(rail) in blackholed_nics(tb, i)


def lossy_share(tb: Testbed, i: int, rail: Rail) -> Optional[float]:
    """Percent of packets host ``i``'s NIC on ``rail`` drops at random, or None when it is not lossy."""
    return nft.lossy_nics(tb.netns(i)).get(tb.nic(rail))


def delete_root_tables(name: str) -> List[str]:
    """Remove root-namespace fallback tables of testbed ``name`` (``down`` does this too)."""
    return nft.delete_root_tables(name)


# ------------------------------------------------------------------ flapping
_DOWN: Dict[str, Callable[..., FaultEvent]] = {"cut": cut, "blackhole": blackhole}


def flap(tb: Testbed, i: int, rail: Rail, period: float, *, count: Optional[int] = None,
         duration: Optional[float] = None, mode: str = "cut", stop: Optional[threading.Event] = None,
         on_event: Optional[Callable[[FaultEvent], None]] = None) -> List[FaultEvent]:
    """Alternate down (period/2) and up (period/2) on one rail; always end up.

    Runs ``count`` cycles, or cycles until ``duration`` seconds have passed, or
    (with neither) until ``stop`` is set. ``mode`` is ``cut`` or ``blackhole``.
    Every transition is appended to the returned list and passed to
    ``on_event`` as soon as it happens. The schedule is absolute, so the
    period does not drift with the time the commands take.
    """
    if period <= 0:
        raise TestbedError(f"flap period must be positive, got {period}")
    if mode not in _DOWN:
        raise TestbedError(f"flap mode {mode!r}: expected one of {sorted(_DOWN)}")
    if count is None and duration is None and stop is None:
        raise TestbedError("flap needs count, duration or a stop event")
    stop = stop or threading.Event()
    half = period / 2.0
    events: List[FaultEvent] = []
    t0 = time.monotonic()
    cycle = 0
    is_down = False

    def emit(ev: FaultEvent, state: str) -> None:
        ev = FaultEvent(ev.ts, "flap", i, rail, {"state": state, "cycle": cycle, "mode": mode, **ev.extra})
        events.append(ev)
        if on_event is not None:
            on_event(ev)

    try:
        while not stop.is_set():
            if count is not None and cycle >= count:
                break
            if duration is not None and cycle * period >= duration:
                break
            is_down = True
            emit(_DOWN[mode](tb, i, rail), "down")
            if stop.wait(max(0.0, t0 + (2 * cycle + 1) * half - time.monotonic())):
                break
            emit(repair(tb, i, rail, mode), "up")
            is_down = False
            cycle += 1
            # Do not wait after the last up: the flap ends as soon as the link is up.
            last = (count is not None and cycle >= count) or (
                duration is not None and cycle * period >= duration)
            if last or stop.wait(max(0.0, t0 + 2 * cycle * half - time.monotonic())):
                break
    finally:
        if is_down:  # interrupted while down: the contract is to end up
            emit(repair(tb, i, rail, mode), "up")
    return events


class Flapper:
    """Flap a rail in a background thread: ``f = Flapper(...).start(); ...; f.stop()``."""

    def __init__(self, tb: Testbed, i: int, rail: Rail, period: float, *, count: Optional[int] = None,
                 duration: Optional[float] = None, mode: str = "cut",
                 on_event: Optional[Callable[[FaultEvent], None]] = None):
        self._stop = threading.Event()
        self.events: List[FaultEvent] = []
        self.error: Optional[BaseException] = None
        self._args = (tb, i, rail, period)
        self._kwargs = dict(count=count, duration=duration, mode=mode, stop=self._stop, on_event=on_event)
        self._thread = threading.Thread(target=self._main, name=f"flap-h{i}-r{rail}", daemon=True)

    def _main(self) -> None:
        user_cb = self._kwargs["on_event"]

        def record(ev: FaultEvent) -> None:
            self.events.append(ev)
            if user_cb is not None:
                user_cb(ev)

        try:
            flap(*self._args, **{**self._kwargs, "on_event": record})
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    def start(self) -> "Flapper":
        self._thread.start()
        return self

    def stop(self, timeout: Optional[float] = 10.0) -> List[FaultEvent]:
        """Stop flapping (the link ends up) and return the events."""
        self._stop.set()
        return self.join(timeout)

    def join(self, timeout: Optional[float] = None) -> List[FaultEvent]:
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.events

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> "Flapper":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ------------------------------------------------- the testbed's fault methods
def _cut(self: Testbed, i: int, rail: Rail) -> float:
    """Unplug the cable: host ``i``'s NIC on ``rail`` loses carrier. Returns the time applied."""
    return cut(self, i, rail).ts


def _blackhole(self: Testbed, i: int, rail: Rail) -> float:
    """Silently drop every packet in and out of the NIC; carrier stays up. Returns the time applied."""
    return blackhole(self, i, rail).ts


def _lossy(self: Testbed, i: int, rail: Rail, loss: float = 5.0) -> float:
    """Drop ``loss`` percent of the NIC's packets at random; carrier stays up. Returns the time applied."""
    return lossy(self, i, rail, loss).ts


def _repair(self: Testbed, i: int, rail: Rail, kind: str) -> float:
    """Undo one kind of fault (cut, blackhole, lossy) on that NIC. Returns the time repaired."""
    return repair(self, i, rail, kind).ts


def _restore(self: Testbed, i: int, rail: Rail) -> float:
    """Undo every fault on that NIC (idempotent). Returns the time repaired."""
    return restore(self, i, rail).ts


def _flap(self: Testbed, i: int, rail: Rail, period: float, count: Optional[int] = None,
          duration: Optional[float] = None, mode: str = "cut") -> List[FaultEvent]:
    """Down for period/2, up for period/2, ``count`` times or for ``duration`` s; ends up."""
    return flap(self, i, rail, period, count=count, duration=duration, mode=mode)


def _flap_async(self: Testbed, i: int, rail: Rail, period: float, count: Optional[int] = None,
                duration: Optional[float] = None, mode: str = "cut") -> Flapper:
    """Start flapping in a background thread; ``.stop()`` ends it with the link up."""
    return Flapper(self, i, rail, period, count=count, duration=duration, mode=mode).start()


for _name, _fn in (("cut", _cut), ("blackhole", _blackhole), ("lossy", _lossy), ("repair", _repair),
                   ("restore", _restore), ("flap", _flap), ("flap_async", _flap_async)):
    _fn.__name__ = _fn.__qualname__ = _name
    setattr(Testbed, _name, _fn)
del _name, _fn


__all__ = ["FaultEvent", "Flapper", "blackhole", "cut", "lossy", "flap", "repair", "restore", "is_blackholed",
           "blackholed_nics", "lossy_share", "BLACKHOLE_MODE_ENV", "KINDS"]
