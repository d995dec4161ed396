"""Escape and return: carrier watching, telling peers, and re-opening links.

- The rank's own NIC losing carrier (netlink) takes down every link on that
  rail at once, and every peer with a link on it is told over a surviving
  link (NOTIFY_DOWN), so neither side waits for a timeout.
- A link that is down is re-opened by the higher rank of the pair, without
  limit, with a capped back-off; the lower rank accepts. Re-opened links are
  re-authenticated with the same handshake as at start-up, with a new epoch.
- Re-dialing never stops, whatever notifications did or did not arrive: a
  peer's word that its NIC is down only leaves the back-off at its cap.
- Nothing here blocks: re-dials are non-blocking connects and handshakes
  (``tcp.Dial``, as at start-up) and listener probes are non-blocking
  connects, all advanced from this thread's one ``poll``, so a blackholed
  rail whose SYNs vanish never delays another. Accepting never blocks (the
  acceptor advances handshakes as bytes arrive). Nothing here holds the
  engine lock while it waits on the network: what it finds goes to the
  engine with ``call_soon``.
- Emulated cuts (``inject``) leave their links open but unused (a real cut
  sends no FIN); they are kept here (``severed``) and closed when the rail
  returns.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from ..common.config import Config
from ..common.errors import HandshakeError
from ..protocol.linkstate import Ev
from ..transport import tcp
from .link import Link
from .env import INF
from .peer import STRANDED_CONNECT
from .ports import RecoveryPort

log = logging.getLogger("linkescape.recovery")

#: dials (and listener probes) in flight at once, at most
MAX_DIALS = 16
#: seconds after the start-up barrier before the links start-up left (backups, and other peers'
#: with connect_at_start=neighbours) are dialed: the ranks that leave the barrier first no longer
#: take the CPU, for the handshakes of their backups, from those still returning from init on a
#: host with more ranks than cores (the slowest rank's init at 32 ranks on 2 cores, 11 runs each
#: alternating: median 182 ms at once, 160 ms 0.1 s later; docs/benchmarks.md)
RELEASE_DELAY = 0.1
#: a probe of a peer's listener that has not connected by then found nothing
PROBE_DEADLINE = 0.5
#: seconds between two probes of one peer's listeners
PROBE_INTERVAL = 0.5
#: seconds a link's first dial may take (connect and handshake), as at start-up
FIRST_DIAL = 10.0
#: how long a graceful close waits for the answer to dials whose proof is sent (see
#: ``Recovery._finish_proved_dials``): an acceptor answers as it adopts, so this is one round trip
#: on a healthy path, more on a loaded host
CLOSE_DIALS = 1.0


class Recovery:
    def __init__(self, engine: RecoveryPort, auth, acceptor, rail_addrs: Sequence[str], rail_ifnames: Sequence[Optional[str]],
                 peer_addrs: Dict[int, List[Tuple[str, int]]], config: Config) -> None:
        self.engine = engine
        self.auth = auth
        self.acceptor = acceptor
        self.rank = engine.rank
        self.rail_addrs = list(rail_addrs)
        self.rail_ifnames = list(rail_ifnames)
        self.peer_addrs = peer_addrs
        self.config = config
        self.clock = engine.clock
        self.local_down: set = set()
        self.epochs: Dict[Tuple[int, int], int] = {}
        #: links being re-opened right now (handed to the engine, not yet adopted)
        self.dialing: set = set()
        self._dials: Dict[int, Tuple[Tuple[int, int], tcp.Dial]] = {}
        self._probes: Dict[int, tcp.ListenerProbe] = {}
        self._probed: Dict[int, float] = {}
        #: links of emulated cuts, closed when their rail returns
        self.severed: List[Link] = []
        self.closed = False
        #: when dials may start: INF until every rank's start-up is done (``release``), then
        #: RELEASE_DELAY later; links are accepted meanwhile, but none is dialed, so that ranks done
        #: first do not take the CPU from those still starting (or still returning from init)
        self.dials_from = 0.0
        #: returns from this thread's poll (the idle-cost tests count them)
        self.wakeups = 0
        self.monitor = None
        watched = [n for n in self.rail_ifnames if n and n != "lo"]
        if config.carrier_watch and watched:
            try:
                from ..health.carrier import CarrierMonitor

                self.monitor = CarrierMonitor(watched)
                for rail, name in enumerate(self.rail_ifnames):
                    if name in watched and not self.monitor.is_up(name):
                        self.local_down.add(rail)
                        engine.set_rail_state(rail, True)
                engine.add_fd(self.monitor.fileno(), self._on_carrier)
            except OSError as exc:
                log.warning("rank %d: no carrier watch (%s); relying on timeouts", self.rank, exc)
                self.monitor = None
        self.thread = threading.Thread(target=self._loop, name=f"linkescape-recovery-{self.rank}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def hold_dials(self) -> None:
        """(before ``start``) Dial nothing until ``release``."""
        self.dials_from = INF

    def release(self) -> None:
        """Every rank's start-up is done: dial the links still to open, RELEASE_DELAY from now."""
        self.dials_from = self.clock.now() + RELEASE_DELAY
        self.wake()

    # ------------------------------------------------------------ carrier (engine thread, lock held)
    def _on_carrier(self, _events: int) -> None:
        for ev in self.monitor.poll():
            for rail, name in enumerate(self.rail_ifnames):
                if name != ev.ifname:
                    continue
                if ev.up:
                    self.rail_up(rail)
                else:
                    self.rail_down(rail, Ev.CARRIER_DOWN, f"{ev.ifname} lost carrier", notify=True)

    def rail_down(self, rail: int, ev: Ev, detail: str, notify: bool, close: bool = True) -> None:
        """(lock held) This rank's NIC on ``rail`` is unusable: every link on
        it goes down at once, the rail is neither dialed nor accepted on until
        it is back, and (for a carrier loss, which we can see) the peers are
        told over a surviving link so that they need not wait for a timeout."""
        self.local_down.add(rail)
        self.severed += self.engine.local_rail_down(rail, ev, detail, notify=notify, close=close)

    def rail_up(self, rail: int) -> None:
        """(lock held) Our NIC on ``rail`` is back: retry its links at once."""
        self.local_down.discard(rail)
        for link in [l for l in self.severed if l.rail == rail]:
            self.severed.remove(link)
            link.close()
        self.engine.local_rail_up(rail)
        self.wake()

    def inject(self, rail: int, kind: str) -> float:
        """(lock held) In-process fault for tests and the no-root demo: ``cut``
        acts as a carrier loss, ``blackhole`` as a silent loss (no
        notification), ``restore`` as the carrier coming back. Returns the
        wall time."""
        if not 0 <= rail < len(self.rail_addrs):
            raise ValueError(f"rail {rail} not in [0, {len(self.rail_addrs)})")
        if kind == "cut":
            self.rail_down(rail, Ev.CARRIER_DOWN, "injected cable cut", notify=True, close=False)
        elif kind == "blackhole":
            self.rail_down(rail, Ev.TIMEOUT, "injected blackhole", notify=False)
        elif kind == "restore":
            self.rail_up(rail)
        else:
            raise ValueError(f"unknown fault {kind!r}: cut, blackhole or restore")
        return self.clock.wall()

    # ------------------------------------------------------------ the thread
    def wake(self) -> None:
        self.engine.recovery_signal.set()

    def _loop(self) -> None:
        signal = self.engine.recovery_signal
        while not self.closed:
            now = self.clock.now()
            timeout = self._next_due(now)
            poller = select.poll()
            poller.register(self.acceptor.fileno(), select.POLLIN)
            poller.register(signal.fileno(), select.POLLIN)
            for fd, (_key, dial) in self._dials.items():
                poller.register(fd, select.POLLIN | (select.POLLOUT if dial.wants_write else 0))
            for fd in self._probes:
                poller.register(fd, select.POLLOUT)
            self.wakeups += 1
            try:
                ready = dict(poller.poll(None if timeout is None else max(timeout - now, 0.0) * 1000.0))
            except (OSError, ValueError):
                if self.closed:
                    return
                continue
            if self.closed:
                return
            if signal.fileno() in ready:
                signal.clear()
            if self.acceptor.fileno() in ready:
                self._accept()
            now = self.clock.now()
            self.engine.trim_heap(now)
            self._advance_dials(ready, now)
            self._advance_probes(ready, now)
            self._start_dials(now)
            self._start_probes(now)

    def _next_due(self, now: float) -> Optional[float]:
        """When something is due: the next re-dial of a link that is down
        (only those are looked at), a dial's or probe's deadline, a wanted
        probe; None when nothing is."""
        due = None
        if self.dials_from <= now:
            for peer, rail, next_probe, _first in self.engine.down_links():
                if rail not in self.local_down and (peer, rail) not in self.dialing:
                    due = next_probe if due is None else min(due, next_probe)
        elif self.dials_from < INF:
            due = self.dials_from  # released: the dials start then
        for _key, dial in self._dials.values():
            due = dial.due if due is None else min(due, dial.due)
        for probe in self._probes.values():
            due = probe.deadline if due is None else min(due, probe.deadline)
        for peer in self.engine.probes_wanted():
            at = self._probed.get(peer, -PROBE_INTERVAL) + PROBE_INTERVAL
            due = at if due is None else min(due, at)
        trim = self.engine.heap_due()  # an outage ended: its freed heap goes back (engine/heap.py)
        if trim is not None:
            due = trim if due is None else min(due, trim)
        return due

    # ------------------------------------------------------------ re-dialing
    def _start_dials(self, now: float) -> None:
        if self.engine.closed or now < self.dials_from:
            return
        # the primary rail's links first: at start-up (backups, and with connect_at_start=neighbours
        # every link but the neighbours') traffic goes on the primary as soon as it can
        for peer, rail, next_probe, first in sorted(self.engine.down_links(), key=lambda d: (d[1], d[2])):
            if len(self._dials) >= MAX_DIALS:
                return
            key = (peer, rail)
            if rail in self.local_down or now < next_probe or key in self.dialing:
                continue
            # The list above was read before `dialing` was: a dial that ended in between (adopted, or
            # failed with a new back-off) left `dialing` only after the engine took its outcome, so
            # the state read now is the one after it (without this, a link adopted in between was
            # dialed again and replaced at once: a link_down on both sides of a healthy pair).
            fresh = self.engine.redial_due(peer, rail)
            if fresh is None or now < fresh[0]:
                continue
            first = fresh[1]
            epoch = self.epochs.get(key, 1) + 1
            self.epochs[key] = epoch
            # The connect is short: on a black-holed path the SYN just vanishes; the back-off brings
            # the next try. A peer that answered gets the acceptor's own time for the handshake: a
            # loaded peer (64 ranks on 2 cores) took longer than 0.5 s, the dialer gave up on links
            # the acceptor had just kept, and the backups churned without end.
            connect_by = now + (STRANDED_CONNECT if self.engine.stranded(peer)
                                else min(0.5, self.config.reconnect_max + 0.25))
            deadline = max(connect_by, now + self.config.handshake_timeout)
            if first:
                # A link's first connection (start-up's backups, and with connect_at_start=neighbours
                # nearly every link): no traffic waits for it, and every rank is opening its links at
                # once (64 ranks on 2 cores: handshakes of several seconds); the short deadlines made
                # dialers give up on links their acceptors kept, and the links churned.
                connect_by = deadline = now + FIRST_DIAL

            self.dialing.add(key)
            try:
                handshake = self.auth.dialer(peer, rail, epoch, self.engine.expected_from(peer), deadline)
                dial = tcp.Dial(self.rail_addrs[rail], self.peer_addrs[peer][rail], handshake, self.config, deadline,
                                connect_by=connect_by)
            except (OSError, HandshakeError) as exc:
                self._dial_failed(key, exc)
                continue
            dial.started, dial.first = now, first
            if dial.done:
                self._adopt(dial.sock, peer, rail, epoch, dial.established)
            else:
                self._dials[dial.fileno()] = (key, dial)

    def _advance_dials(self, ready: dict, now: float) -> None:
        for fd in list(self._dials):
            key, dial = self._dials[fd]
            if not dial.connected and not dial.first and dial.connect_by > dial.started + STRANDED_CONNECT and \
                    self.engine.stranded(key[0]):
                dial.connect_by = dial.started + STRANDED_CONNECT  # the peer lost its last rail meanwhile
            if fd not in ready and now <= dial.due:
                continue
            try:
                done = dial.step(now)
            except (OSError, HandshakeError) as exc:
                del self._dials[fd]
                dial.close()
                self._dial_failed(key, exc, answered=dial.connected)
                continue
            if done:
                del self._dials[fd]
                self._adopt(dial.sock, key[0], key[1], self.epochs[key], dial.established)

    def _dial_failed(self, key: Tuple[int, int], exc: BaseException, answered: bool = False) -> None:
        """A dial ended without a link; ``answered``: the peer's kernel accepted the
        connection (its listener exists) and the handshake failed after."""
        peer, rail = key
        refused = isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED
        log.debug("rank %d: re-open rail %d to rank %d failed: %s", self.rank, rail, peer, exc)
        eng = self.engine

        def failed() -> None:
            try:
                eng.dial_failed(peer, rail, refused, answered)
            finally:
                # only once the back-off is set (see _start_dials)
                self.dialing.discard(key)
            self.wake()
        eng.call_soon(failed)

    # ------------------------------------------------------------ probing a peer's listeners
    def _start_probes(self, now: float) -> None:
        for peer in self.engine.probes_wanted():
            if now - self._probed.get(peer, -PROBE_INTERVAL) < PROBE_INTERVAL:
                continue
            if len(self._probes) + len(self.peer_addrs[peer]) > MAX_DIALS:
                break  # every rail of a peer is probed at once, or none yet: it stays wanted
            self._probed[peer] = now
            self.engine.probe_taken(peer)
            for rail, addr in enumerate(self.peer_addrs[peer]):
                if rail in self.local_down:
                    continue
                probe = tcp.ListenerProbe(peer, rail, self.rail_addrs[rail], addr, now + PROBE_DEADLINE)
                if probe.err != -1:
                    self._probe_done(probe)
                else:
                    self._probes[probe.fileno()] = probe

    def _advance_probes(self, ready: dict, now: float) -> None:
        for fd in list(self._probes):
            probe = self._probes[fd]
            if fd in ready or now > probe.deadline:
                del self._probes[fd]
                self._probe_done(probe, fd in ready)

    def _probe_done(self, probe: tcp.ListenerProbe, ready: bool = True) -> None:
        refused, answered = probe.finish(ready)
        eng = self.engine
        eng.call_soon(lambda: eng.listener_probed(probe.peer, probe.rail, refused, answered))

    # ------------------------------------------------------------ accepting
    def _accept(self) -> None:
        """Advance the incoming handshakes (never blocks: the acceptor bounds
        them and gives each a deadline) and adopt the links whose dialer
        proved the key. Only a dialer that proved it moves an epoch."""
        def admit(src: int, rail: int, epoch: int) -> int:
            last = self.epochs.get((src, rail), 1)
            if epoch <= last:
                raise HandshakeError(f"stale epoch {epoch} (have {last})")
            if rail in self.local_down:
                raise HandshakeError(f"rail {rail} has no carrier here")
            self.epochs[(src, rail)] = epoch
            return self.engine.expected_from(src)

        for acc in self.acceptor.poll(admit):
            self._adopt(acc.sock, acc.peer, acc.rail, acc.epoch, acc)

    def _adopt(self, sock: socket.socket, peer: int, rail: int, epoch: int, hs) -> None:
        """``hs``: what the handshake established (the peer's expected, the link's key)."""
        eng = self.engine
        peer_expected = hs.peer_expected
        link = Link(sock, peer, rail, epoch, self.clock.now(),
                    mac_key=hs.link_key if self.config.frame_auth else None)

        def adopt() -> None:
            try:
                eng.adopt(link, peer_expected)
            finally:
                # only once the link is up (see _start_dials)
                self.dialing.discard((peer, rail))
        eng.call_soon(adopt)

    def _finish_proved_dials(self, until: float) -> None:
        """(closing) Our dials whose proof is sent: the acceptor adopted the
        link as it answered, so closed unfinished they were a reset at a peer
        that counted the link as up (and, with no other link to us, then found
        every rail refused: PeerLost although we left in good order). They get
        until ``until`` to read the answer and be adopted, so that the
        engine's close says BYE on them. Dials that proved nothing yet cannot
        be up anywhere: they are closed at once."""
        while True:
            proved = {fd: kd for fd, kd in self._dials.items() if kd[1].proved}
            now = self.clock.now()
            if not proved or now >= until:
                return
            poller = select.poll()
            for fd in proved:
                poller.register(fd, select.POLLIN)
            try:
                ready = dict(poller.poll(max(until - now, 0.0) * 1000.0))
            except (OSError, ValueError):
                return
            self._advance_dials(ready, self.clock.now())

    def close(self, graceful: bool = True) -> None:
        self.closed = True
        self.wake()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=3.0)
        if graceful and not self.thread.is_alive():
            # Handshakes that completed since the thread's last look (their dialer already counts
            # the link as up): adopted now, so that the engine's close says BYE on them rather than
            # a reset that the dialer would take for a failure (it then finds us refusing every
            # rail: PeerLost, although we left in good order).
            try:
                self._accept()
            except Exception as exc:  # noqa: BLE001 - best effort, we are closing
                log.debug("rank %d: last look at incoming handshakes: %s", self.engine.rank, exc)
            self._finish_proved_dials(self.clock.now() + CLOSE_DIALS)
        for _key, dial in self._dials.values():
            dial.close()
        for probe in self._probes.values():
            probe.sock.close()
        self._dials.clear()
        self._probes.clear()
        if self.monitor is not None:
            self.engine.remove_fd(self.monitor.fileno())
            self.monitor.close()
        for link in self.severed:
            link.close()
        self.severed.clear()


__all__ = ["Recovery", "MAX_DIALS"]
