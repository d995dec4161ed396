"""Fault injection on a testbed rail: cut, blackhole, flap, restore.

* **cut** sets the bridge-side veth of (host, rail) down in the root namespace:
  the host's NIC loses carrier (NO-CARRIER, no LOWER_UP), as when a cable is
  pulled or an optic dies. The host can notice it from the kernel.
* **blackhole** installs an nftables ``netdev`` table inside the host that
  drops everything on the NIC's ingress and egress hooks. Carrier stays up, so
  only timeouts and heartbeats can notice it (a bad switch port, a dead ToR
  behind a live link). On kernels without the netdev egress hook (< 5.16) it
  falls back to ingress hooks on both ends of the veth.
* **flap** alternates down and up with a period; it always ends with the link up.
* **restore** undoes cut and blackhole; it is idempotent.

Every fault returns a :class:`FaultEvent` whose ``ts`` is the wall time
(``time.time()``) right after the kernel accepted the change, i.e. the moment
from which the fault is in effect. Benchmarks measure detection latency from it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Union

from .netns import TestbedError, _run, require_nft, require_root

if TYPE_CHECKING:  # pragma: no cover
    from .netns import Testbed

Rail = Union[int, str]

#: ``auto`` (egress hook, falling back to ingress-only), ``egress`` or ``ingress``.
BLACKHOLE_MODE_ENV = "LINKESCAPE_TESTBED_BLACKHOLE"
_egress_supported: Optional[bool] = None  # learnt on the first blackhole


@dataclass
class FaultEvent:
    """One fault applied (or undone) at wall time ``ts``."""

    ts: float
    fault: str  # cut | blackhole | restore | flap
    host: int
    rail: Rail
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"ts": self.ts, "fault": self.fault, "host": self.host, "rail": self.rail, **self.extra}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def _rail_tag(rail: Rail) -> str:
    return "mgmt" if rail == "mgmt" else str(int(rail))


def host_table(tb: "Testbed", rail: Rail) -> str:
    """Name of the drop table inside a host (one per rail, so faults compose)."""
    return f"le_bh_{tb.nic(rail)}"


def root_table(tb: "Testbed", i: int, rail: Rail) -> str:
    """Root-namespace table of the ingress-only fallback (prefixed: root is shared)."""
    return f"{tb.name}_bh_{i}_{'m' if rail == 'mgmt' else int(rail)}"


def _nft(tb: Optional["Testbed"], i: Optional[int], script: str, check: bool = True,
         what: str = "nft"):
    argv = ["nft", "-f", "-"]
    if tb is not None and i is not None:
        argv = tb.cmd(i, argv)
    return _run(argv, input=script, check=check, what=what)


def _drop_table(table: str, hooks: List[tuple]) -> str:
    # Declare-then-delete makes the replacement idempotent and atomic: nft
    # applies the whole script as one transaction.
    lines = [f"table netdev {table} {{}}", f"delete table netdev {table}", f"table netdev {table} {{"]
    for chain, hook, dev in hooks:
        lines.append(f'  chain {chain} {{ type filter hook {hook} device "{dev}" priority 0; policy drop; }}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _delete_table(table: str) -> str:
    return f"table netdev {table} {{}}\ndelete table netdev {table}\n"


def _check(tb: "Testbed", i: int, rail: Rail) -> None:
    require_root("fault injection")
    tb.netns(i)  # validates host
    tb.root_veth(i, rail)  # validates rail


# ------------------------------------------------------------------ faults
def cut(tb: "Testbed", i: int, rail: Rail) -> FaultEvent:
    """Take the bridge-side veth down: host ``i``'s NIC loses carrier."""
    _check(tb, i, rail)
    _run(["ip", "link", "set", tb.root_veth(i, rail), "down"], what=f"cut host {i} rail {rail}")
    return FaultEvent(time.time(), "cut", i, rail)


def blackhole(tb: "Testbed", i: int, rail: Rail) -> FaultEvent:
    """Drop all traffic in and out of host ``i``'s NIC on ``rail``; carrier stays up."""
    global _egress_supported
    _check(tb, i, rail)
    require_nft()
    nic = tb.nic(rail)
    mode = os.environ.get(BLACKHOLE_MODE_ENV, "auto").strip().lower()
    if mode not in ("auto", "egress", "ingress"):
        raise TestbedError(f"{BLACKHOLE_MODE_ENV}={mode!r}: expected auto, egress or ingress")
    if mode == "egress" or (mode == "auto" and _egress_supported is not False):
        script = _drop_table(host_table(tb, rail), [("in", "ingress", nic), ("out", "egress", nic)])
        proc = _nft(tb, i, script, check=False)
        if proc.returncode == 0:
            _egress_supported = True
            return FaultEvent(time.time(), "blackhole", i, rail, {"hooks": "ingress+egress"})
        if mode == "egress":
            raise TestbedError(f"blackhole host {i} rail {rail}: {proc.stderr.strip()}")
        _egress_supported = False  # old kernel or nft: use the fallback from now on
    # Fallback: ingress on the host NIC (traffic to the host) and ingress on the
    # bridge-side veth (traffic from the host). Host side first, so the fault
    # is complete once the second one is in.
    _nft(tb, i, _drop_table(host_table(tb, rail), [("in", "ingress", nic)]),
         what=f"blackhole host {i} rail {rail} (host side)")
    _nft(None, None, _drop_table(root_table(tb, i, rail), [("in", "ingress", tb.root_veth(i, rail))]),
         what=f"blackhole host {i} rail {rail} (bridge side)")
    return FaultEvent(time.time(), "blackhole", i, rail, {"hooks": "ingress-both-ends"})


def restore(tb: "Testbed", i: int, rail: Rail) -> FaultEvent:
    """Undo cut and blackhole on host ``i``'s NIC on ``rail``; safe to repeat."""
    _check(tb, i, rail)
    if shutil.which("nft"):
        _nft(tb, i, _delete_table(host_table(tb, rail)), what=f"restore host {i} rail {rail}")
        # The fallback's bridge-side table may exist even if this process never
        # made one (another process, LINKESCAPE_TESTBED_BLACKHOLE=ingress).
        _nft(None, None, _delete_table(root_table(tb, i, rail)), what=f"restore host {i} rail {rail}")
    _run(["ip", "-n", tb.netns(i), "link", "set", tb.nic(rail), "up"], what=f"restore host {i} rail {rail}")
    _run(["ip", "link", "set", tb.root_veth(i, rail), "up"], what=f"restore host {i} rail {rail}")
    ts = time.time()
    # Neighbour entries left INCOMPLETE/FAILED by traffic during the fault only
    # re-probe on their retransmit timer (1 s); drop them on this rail in every
    # host so the first packet after restore resolves at once.
    for h in range(tb.hosts):
        _run(["ip", "-n", tb.netns(h), "neigh", "flush", "dev", tb.nic(rail), "nud", "incomplete",
              "nud", "failed"], check=False)
    return FaultEvent(ts, "restore", i, rail)


def _netdev_tables(tb: Optional["Testbed"], i: Optional[int]) -> Set[str]:
    if not shutil.which("nft"):
        return set()
    argv = ["nft", "list", "tables", "netdev"]
    if tb is not None and i is not None:
        argv = tb.cmd(i, argv)
    proc = _run(argv, check=False)
    return {line.split()[2] for line in proc.stdout.splitlines()
            if line.startswith("table netdev ") and len(line.split()) >= 3}


def blackholed_nics(tb: "Testbed", i: int) -> Set[str]:
    """NIC names of host ``i`` that currently have a drop table."""
    return {t[len("le_bh_"):] for t in _netdev_tables(tb, i) if t.startswith("le_bh_")}


def is_blackholed(tb: "Testbed", i: int, rail: Rail) -> bool:
    return tb.nic(rail) in blackholed_nics(tb, i)


def delete_root_tables(name: str) -> List[str]:
    """Remove root-namespace fallback tables of testbed ``name`` (used by down)."""
    pat = re.compile(rf"^{re.escape(name)}_bh_\d+_(\d+|m)$")
    gone = [t for t in _netdev_tables(None, None) if pat.match(t)]
    for t in gone:
        _nft(None, None, _delete_table(t), check=False)
    return gone


# ------------------------------------------------------------------ flapping
_DOWN: Dict[str, Callable[..., FaultEvent]] = {"cut": cut, "blackhole": blackhole}


def flap(tb: "Testbed", i: int, rail: Rail, period: float, *, count: Optional[int] = None,
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
            emit(restore(tb, i, rail), "up")
            is_down = False
            cycle += 1
            # Do not wait after the last up: the flap ends as soon as the link is up.
            last = (count is not None and cycle >= count) or (
                duration is not None and cycle * period >= duration)
            if last or stop.wait(max(0.0, t0 + 2 * cycle * half - time.monotonic())):
                break
    finally:
        if is_down:  # interrupted while down: the contract is to end up
            emit(restore(tb, i, rail), "up")
    return events


class Flapper:
    """Flap a rail in a background thread: ``f = Flapper(...).start(); ...; f.stop()``."""

    def __init__(self, tb: "Testbed", i: int, rail: Rail, period: float, *, count: Optional[int] = None,
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


__all__ = ["FaultEvent", "Flapper", "blackhole", "cut", "flap", "restore", "is_blackholed",
           "blackholed_nics", "BLACKHOLE_MODE_ENV"]
