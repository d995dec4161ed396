"""Escape and return: carrier watching, telling peers, and re-opening links.

- The rank's own NIC losing carrier (netlink) takes down every link on that
  rail at once, and every peer is told over a surviving link (NOTIFY_DOWN), so
  neither side waits for a timeout.
- A link that is down is re-opened by the higher rank of the pair, without
  limit, with a capped back-off; the lower rank accepts. Re-opened links are
  re-authenticated with the same handshake as at start-up, with a new epoch.
- Re-dialing never stops, whatever notifications did or did not arrive: a
  peer's word that its NIC is down only leaves the back-off at its cap.
- Dials block (connect, then the handshake, with a short deadline), so each
  runs on a short-lived thread of its own: a blackholed rail whose SYNs vanish
  never delays the re-dial of another. Accepting never blocks (the acceptor
  advances handshakes as bytes arrive). Neither holds the engine lock while it
  waits on the network.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from ..config import Config
from ..errors import HandshakeError
from ..protocol.frames import Kind
from ..protocol.linkstate import Ev, State
from ..transport import tcp
from .link import Link

log = logging.getLogger("linkescape.recovery")

#: dials (and listener probes) in flight at once, at most
MAX_DIALS = 16


class Recovery:
    def __init__(self, engine, rail_addrs: Sequence[str], rail_ifnames: Sequence[Optional[str]],
                 listeners: List[socket.socket], peer_addrs: Dict[int, List[Tuple[str, int]]], job: bytes,
                 config: Config, store=None) -> None:
        self.engine = engine
        self.store = store
        self.rank = engine.rank
        self.rail_addrs = list(rail_addrs)
        self.rail_ifnames = list(rail_ifnames)
        self.listeners = listeners
        self.peer_addrs = peer_addrs
        self.job = job
        self.config = config
        self.local_down: set = set()
        self.epochs: Dict[Tuple[int, int], int] = {}
        #: links being re-opened right now (handed to the engine, not yet adopted)
        self.dialing: set = set()
        self._threads: set = set()
        self._threads_lock = threading.Lock()
        #: peers whose listeners to probe (every link ended with FIN/RST), and when last probed
        self._probe_wanted: set = set()
        self._probed: Dict[int, float] = {}
        self.closed = False
        #: returns from this thread's select (the idle-cost tests count them)
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
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        engine.on_redial = self.wake
        engine.liveness.on_probe = self._want_probe
        self.thread = threading.Thread(target=self._loop, name=f"linkescape-recovery-{self.rank}", daemon=True)
        self.thread.start()

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
        """This rank's NIC on ``rail`` is unusable: every link on it goes down
        at once, the rail is neither dialed nor accepted on until it is back,
        and (for a carrier loss, which we can see) the peers are told over a
        surviving link so that they need not wait for a timeout."""
        eng = self.engine
        self.local_down.add(rail)
        if ev is Ev.CARRIER_DOWN:
            eng.set_rail_state(rail, True)  # every frame from now on says so
        if notify:  # first: the peers learn it before anything else happens
            eng.notify_peers(Kind.NOTIFY_DOWN, rail)
        for peer in eng.peers.values():
            link = peer.links[rail]
            if link is not None:
                eng.link_down(link, ev, detail=detail, close=close)

    def rail_up(self, rail: int) -> None:
        eng = self.engine
        now = time.monotonic()
        self.local_down.discard(rail)
        eng.set_rail_state(rail, False)
        for link in [l for l in eng.severed if l.rail == rail]:
            eng.severed.remove(link)
            link.close()
        for peer in eng.peers.values():
            st = peer.status[rail]
            if st.state is State.DOWN:
                st.next_probe = now  # retry at once: the cable is back
                st.backoff = 0.0
        eng.notify_peers(Kind.NOTIFY_UP, rail)
        self.wake()

    def inject(self, rail: int, kind: str) -> float:
        """In-process fault for tests and the no-root demo: ``cut`` acts as a
        carrier loss, ``blackhole`` as a silent loss (no notification),
        ``restore`` as the carrier coming back. Returns the wall time."""
        if not 0 <= rail < len(self.rail_addrs):
            raise ValueError(f"rail {rail} not in [0, {len(self.rail_addrs)})")
        eng = self.engine
        eng._acquire()
        try:
            if kind == "cut":
                self.rail_down(rail, Ev.CARRIER_DOWN, "injected cable cut", notify=True, close=False)
            elif kind == "blackhole":
                self.rail_down(rail, Ev.TIMEOUT, "injected blackhole", notify=False)
            elif kind == "restore":
                self.rail_up(rail)
            else:
                raise ValueError(f"unknown fault {kind!r}: cut, blackhole or restore")
            ts = time.time()
        finally:
            eng.lock.release()
        eng.wake()
        return ts

    # ------------------------------------------------------------ thread
    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _loop(self) -> None:
        while not self.closed:
            due = self._next_due()
            # nothing down and nothing to probe: sleep until woken (a link
            # went down, a connection arrives, close)
            timeout = None if due is None else max(due - time.monotonic(), 0.0)
            self.wakeups += 1
            try:
                ready, _, _ = select.select(self.listeners + [self._wake_r], [], [], timeout)
            except (OSError, ValueError):
                if self.closed:
                    return
                time.sleep(0.05)
                continue
            if self.closed:
                return
            for fd in ready:
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except OSError:
                        pass
                else:
                    self._accept(fd)
            for peer, rail in self._due_dials():
                if self.closed:
                    break
                self.dialing.add((peer, rail))
                if not self._spawn(self._dial, peer, rail):
                    self.dialing.discard((peer, rail))
                    break
            for peer in self._due_probes():
                if self.closed or not self._spawn(self._probe, peer):
                    break

    def _spawn(self, fn, *args) -> bool:
        """Run ``fn`` on a short-lived thread; False when too many run."""
        with self._threads_lock:
            if len(self._threads) >= MAX_DIALS:
                return False

            def run() -> None:
                try:
                    fn(*args)
                except Exception:  # noqa: BLE001 - a failed dial must not end recovery
                    log.exception("rank %d: %s%s failed", self.rank, fn.__name__, args)
                finally:
                    with self._threads_lock:
                        self._threads.discard(threading.current_thread())
                    self.wake()
            t = threading.Thread(target=run, name=f"linkescape-dial-{self.rank}", daemon=True)
            self._threads.add(t)
        t.start()
        return True

    def _next_due(self) -> Optional[float]:
        """When the next re-dial is due: exactly the links ``_due_dials``
        would dial (one being dialed is not due: waking for it would spin);
        None when nothing is. Only the links that are down are looked at."""
        due = None
        for peer, st in self._down_statuses():
            if st.rail not in self.local_down and (peer.rank, st.rail) not in self.dialing:
                due = st.next_probe if due is None else min(due, st.next_probe)
        if self._probe_wanted:
            p = min(self._probed.get(p, 0.0) + 0.5 for p in self._probe_wanted)
            due = p if due is None else min(due, p)
        return due

    def _down_statuses(self):
        """(peer, status) of the down links this rank re-dials (it is the
        higher rank of the pair). Read without the engine lock: a copy of
        the set, and states re-checked."""
        eng = self.engine
        for rank, rail in list(eng.down):
            peer = eng.peers.get(rank)
            if peer is None or rank > self.rank or peer.lost is not None:
                continue  # the higher rank of a pair dials
            st = peer.status[rail]
            if st.state is State.DOWN:
                yield peer, st

    def _due_dials(self) -> List[Tuple[int, int]]:
        """Down links this rank should re-dial now. Read without the engine
        lock (a driver may hold it until the very link we re-open is back)."""
        eng = self.engine
        now = time.monotonic()
        out = []
        if eng.closed:
            return out
        for peer, st in self._down_statuses():
            if st.rail not in self.local_down and now >= st.next_probe and (peer.rank, st.rail) not in self.dialing:
                out.append((peer.rank, st.rail))
        return out

    # ------------------------------------------------------------ probing a peer's listeners
    def _want_probe(self, peer: int) -> None:
        """(engine, lock held) Every link to ``peer`` ended with FIN/RST and we
        are the accepting side: find out whether its listeners still exist."""
        if peer not in self._probe_wanted:
            self._probe_wanted.add(peer)
            self.wake()

    def _due_probes(self) -> List[int]:
        now = time.monotonic()
        out = []
        for peer in list(self._probe_wanted):
            if now - self._probed.get(peer, 0.0) >= 0.5:
                self._probe_wanted.discard(peer)
                self._probed[peer] = now
                out.append(peer)
        return out

    def _probe(self, peer: int) -> None:
        """Connect to every listener of ``peer`` and close at once: a refusal
        on every rail means its process is gone (its host answers RST)."""
        eng = self.engine
        for rail, addr in enumerate(self.peer_addrs[peer]):
            if rail in self.local_down or self.closed:
                continue
            refused = False
            try:
                sock = socket.create_connection(addr, timeout=0.5, source_address=(self.rail_addrs[rail], 0))
                sock.close()
            except OSError as exc:
                refused = exc.errno == errno.ECONNREFUSED
            eng.call_soon(lambda rail=rail, refused=refused: eng.probe_failed(peer, rail, refused))

    def _dial(self, peer: int, rail: int) -> None:
        """(dial thread) Re-open the link to ``peer`` on ``rail``."""
        eng = self.engine
        with self._threads_lock:
            epoch = self.epochs.get((peer, rail), 1) + 1
            self.epochs[(peer, rail)] = epoch
        expected = eng.peers[peer].recv.expected  # an int: a racy read is fine, replay trims less
        # Short: on a black-holed path the SYN just vanishes; the back-off
        # brings the next try.
        deadline = time.monotonic() + min(0.5, self.config.reconnect_max + 0.25)
        try:
            # the same key proof as at start-up (the acceptor holds the job's LinkAuth)
            handshake = self.listeners[0].auth.dialer(peer, rail, epoch, expected, deadline)
            sock, reply = tcp.connect(self.rail_addrs[rail], self.peer_addrs[peer][rail], handshake, self.config,
                                      deadline)
        except (OSError, HandshakeError) as exc:
            refused = isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED
            log.debug("rank %d: re-open rail %d to rank %d failed: %s", self.rank, rail, peer, exc)

            def failed(peer=peer, rail=rail, refused=refused):
                self.dialing.discard((peer, rail))
                st = eng.peers[peer].status[rail]
                if st.state is State.DOWN:
                    st.apply(Ev.PROBE, time.monotonic())
                    st.apply(Ev.PROBE_FAILED, time.monotonic(), backoff_min=0.05,
                             backoff_max=self.config.reconnect_max)
                eng.probe_failed(peer, rail, refused)
                self.wake()
            eng.call_soon(failed)
            return
        self._adopt(sock, peer, rail, epoch, reply.peer_expected)

    def _accept(self, acceptor) -> None:
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
            return self.engine.peers[src].recv.expected  # racy read of an int: fine

        for link in acceptor.poll(admit):
            self._adopt(link.sock, link.peer, link.rail, link.epoch, link.peer_expected)

    def _adopt(self, sock: socket.socket, peer: int, rail: int, epoch: int, peer_expected: int) -> None:
        eng = self.engine
        status = eng.peers[peer].status[rail]
        link = Link(sock, peer, rail, epoch, status, time.monotonic())

        def adopt() -> None:
            self.dialing.discard((peer, rail))
            if eng.closed:
                sock.close()
                return
            eng.adopt_link(link, peer_expected)
        eng.call_soon(adopt)

    def close(self) -> None:
        self.closed = True
        self.wake()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=3.0)
        with self._threads_lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=1.0)
        if self.monitor is not None:
            self.engine.remove_fd(self.monitor.fileno())
            self.monitor.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
