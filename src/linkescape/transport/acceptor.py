"""Accepting links without ever blocking: every incoming connection runs its
handshake side by side with the others, each with a deadline, and at most
``max_pending_handshakes`` at once.

- ``poll(admit)`` accepts what waits on the listeners, advances every
  handshake with the bytes that arrived, closes the failed and the late ones,
  and returns the links whose dialer proved the key and that ``admit``
  accepted. It never waits on the network: a stranger who sends one byte a
  second costs one read per byte, and the job's own re-dials go through
  beside it.
- A new connection always gets a slot; when the slots are full the least
  advanced handshake makes room: first those still without a HELLO (those
  from an address no expected dialer uses before those from a peer's rail
  address; then the host holding the most slots; then the oldest), then
  those whose HELLO showed the key and that wait for the proof (a second
  dial for the same rank and rail first; then the oldest). A HELLO that does
  not show the key is rejected on arrival, so a stranger who read the job
  from the store holds no slot past its HELLO and never evicts a genuine
  dial waiting for its proof, however many addresses it floods from.
- The rail is the listener's, not only the HELLO's: a HELLO that names
  another rail than the listener that accepted it, or that comes from
  another address than the claimed rank's address on that rail (known after
  the store exchange: ``peer_addrs``), is rejected (``RailMismatch``, reason
  ``BAD_ROUTE``): a mis-routed dial never becomes "rail r" on another NIC.
- ``fileno()`` (an epoll descriptor, which a select/poll loop can wait on) is
  readable when there is work: a connection, bytes, or a deadline that passed
  (a timerfd), so a loop that waits on it reaps stalled handshakes in time.
- Every connection that ends without a link is closed and counted
  (``rejected``), and logged at most once per ``LOG_INTERVAL`` (with a count).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import select
import socket
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..common.config import Config
from ..common.errors import AuthError, HandshakeError, NotYet, RailMismatch
from ..protocol.handshake import AcceptorHandshake, Hello, LinkAuth, Proved
from . import tcp

log = logging.getLogger("linkescape.transport")

LOG_INTERVAL = 10.0
DEFAULT_PENDING = 64
#: connections taken from one listener per poll, so one flood cannot keep the
#: others (and the handshakes in progress) waiting
ACCEPT_BURST = 64

#: admit(peer, rail, epoch) -> the next DATA seq we expect from that peer;
#: raises HandshakeError to turn the (authenticated) dialer down
Admit = Callable[[int, int, int], int]


class Accepted(NamedTuple):
    sock: socket.socket
    peer: int
    rail: int
    epoch: int
    #: the next DATA seq the dialer expects from us
    peer_expected: int
    addr: tuple
    #: the key of this link alone (frame MACs)
    link_key: bytes = b""


class _Timer:
    """A timerfd (Python < 3.13 has no os.timerfd_create): makes the epoll
    descriptor readable when the earliest handshake deadline passes."""

    class _Spec(ctypes.Structure):
        _fields_ = [("interval_s", ctypes.c_long), ("interval_ns", ctypes.c_long),
                    ("value_s", ctypes.c_long), ("value_ns", ctypes.c_long)]

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.timerfd_create(1, os.O_NONBLOCK | os.O_CLOEXEC)  # CLOCK_MONOTONIC
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd = fd
        self.armed: Optional[float] = None

    def arm(self, delay: Optional[float]) -> None:
        if delay is not None:
            delay = max(delay, 1e-6)
        if delay == self.armed:
            return
        spec = self._Spec(0, 0, 0, 0)
        if delay is not None:
            spec.value_s = int(delay)
            spec.value_ns = max(int((delay - int(delay)) * 1e9), 1 if not int(delay) else 0)
        self._libc.timerfd_settime(self.fd, 0, ctypes.byref(spec), None)
        self.armed = delay

    def clear(self) -> None:
        try:
            os.read(self.fd, 8)
        except OSError:
            pass
        self.armed = None

    def close(self) -> None:
        os.close(self.fd)


#: a published address that says nothing about where dials come from
_ANY = ("", "0.0.0.0")


class _Pending:
    __slots__ = ("sock", "addr", "hs", "out", "started")

    def __init__(self, sock: socket.socket, addr, hs: AcceptorHandshake, started: float) -> None:
        self.sock = sock
        self.addr = addr
        self.hs = hs
        self.out = b""
        self.started = started


class Acceptor:
    """``listeners``: one per rail, in rail order (when there are as many as
    the job has rails; otherwise the listener's rail is not checked).
    ``peer_addrs``: every peer's published ``(ip, port)`` per rail (the
    store exchange): a dial for (rank, rail) must come from that rank's
    address on that rail, which is the address its dialer binds."""

    def __init__(self, listeners: Sequence[socket.socket], auth: LinkAuth, config: Config,
                 clock: Callable[[], float] = time.monotonic,
                 peer_addrs: Optional[Dict[int, Sequence[Tuple[str, int]]]] = None) -> None:
        self.listeners = {l.fileno(): l for l in listeners}
        #: the rail each listener is bound to
        self.listener_rail: Dict[int, Optional[int]] = {
            l.fileno(): (i if len(listeners) == auth.rails else None) for i, l in enumerate(listeners)}
        self.peer_addrs = {int(p): [a[0] for a in addrs] for p, addrs in (peer_addrs or {}).items()}
        #: the addresses genuine dials come from (the ranks that dial this one)
        self.dialer_hosts = {a for p, addrs in self.peer_addrs.items() if p > auth.rank for a in addrs
                             if a not in _ANY}
        self.auth = auth
        self.config = config
        self.clock = clock
        self.timeout = config.handshake_timeout
        # Every higher rank dials each rail at start-up at once: room for all
        # of them (twice), so that the job's own dials never evict each other.
        self.limit = config.max_pending_handshakes or max(
            DEFAULT_PENDING, 2 * (auth.world_size - 1 - auth.rank) * auth.rails)
        self.pending: Dict[int, _Pending] = {}
        #: connections closed without a link, in total and by reason
        self.rejected = 0
        self.rejected_by: Dict[str, int] = {}
        #: claimed ranks whose key proof failed (for start-up diagnostics)
        self.auth_failures: Dict[int, int] = {}
        self._epoll = select.epoll()
        for fd in self.listeners:
            self._epoll.register(fd, select.EPOLLIN)
        try:
            self._timer: Optional[_Timer] = _Timer()
            self._epoll.register(self._timer.fd, select.EPOLLIN)
        except (OSError, AttributeError):  # no timerfd: deadlines are checked on the next poll
            self._timer = None
        self._log_at = -LOG_INTERVAL
        self._log_quiet = 0
        self.closed = False

    def fileno(self) -> int:
        return self._epoll.fileno()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` for work (for a thread that does only this)."""
        try:
            return bool(self._epoll.poll(max(timeout, 0.0), 1))
        except InterruptedError:
            return False

    # ------------------------------------------------------------ the step
    def poll(self, admit: Admit) -> List[Accepted]:
        """One non-blocking step; returns the links to hand to the engine."""
        out: List[Accepted] = []
        if self.closed:
            return out
        for fd, mask in self._epoll.poll(0):
            if fd in self.listeners:
                self._accept_burst(self.listeners[fd], admit, out)
            elif self._timer is not None and fd == self._timer.fd:
                self._timer.clear()
            else:
                p = self.pending.get(fd)
                if p is not None:
                    self._step(p, admit, out, writable=bool(mask & select.EPOLLOUT))
        self._expire()
        self._arm()
        return out

    def _accept_burst(self, lsock: socket.socket, admit: Admit, out: List[Accepted]) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                conn, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: the ones pending go first
                log.warning("rank %d: accept failed: %s", self.auth.rank, exc)
                self._evict()
                return
            conn.setblocking(False)
            if len(self.pending) >= self.limit:
                self._evict()
            now = self.clock()
            route = functools.partial(self._route, self.listener_rail.get(lsock.fileno()), addr[0] if addr else None)
            p = _Pending(conn, addr, self.auth.acceptor(now + self.timeout, route=route), now)
            self.pending[conn.fileno()] = p
            self._epoll.register(conn.fileno(), select.EPOLLIN)
            # A real dialer's HELLO is usually here already: read it now, so
            # that it counts as advanced if a flood follows.
            self._step(p, admit, out, writable=False)

    def _step(self, p: _Pending, admit: Admit, out: List[Accepted], writable: bool) -> None:
        hs = p.hs
        try:
            if writable or p.out:
                self._flush(p)
            while not hs.done and hs.want() and not p.out:
                try:
                    data = p.sock.recv(hs.want())
                except (BlockingIOError, InterruptedError):
                    break
                if not data:
                    raise ConnectionResetError("closed by the other side")
                event = hs.receive_data(data, self.clock())
                if isinstance(event, Proved):
                    self._decide(p, event, admit)
                p.out += hs.data_to_send()
                self._flush(p)
            if hs.state == "established" and not p.out:
                self._finish(p, out)
        except (HandshakeError, OSError) as exc:
            self._reject(p, exc)

    def _route(self, listener_rail: Optional[int], source: Optional[str], hello: Hello) -> None:
        """A HELLO that showed the key came in on ``listener_rail``'s listener
        from ``source``: raise RailMismatch unless that is where its link
        belongs."""
        if listener_rail is not None and hello.rail != listener_rail:
            raise RailMismatch(f"rank {hello.src}'s dial for rail {hello.rail} arrived on the listener of rail "
                               f"{listener_rail} (mis-routed)", peer=hello.src, rail=hello.rail)
        addrs = self.peer_addrs.get(hello.src)
        if addrs and hello.rail < len(addrs) and addrs[hello.rail] not in _ANY and source != addrs[hello.rail]:
            raise RailMismatch(f"rank {hello.src}'s dial for rail {hello.rail} comes from {source}, not from its "
                               f"rail-{hello.rail} address {addrs[hello.rail]} (mis-routed)",
                               peer=hello.src, rail=hello.rail)

    def _decide(self, p: _Pending, event: Proved, admit: Admit) -> None:
        try:
            expected = admit(event.peer, event.rail, event.epoch)
        except HandshakeError as exc:
            p.hs.refuse(str(exc))
            p.out += p.hs.data_to_send()
            self._flush(p)
            raise
        p.hs.admit(expected)

    def _flush(self, p: _Pending) -> None:
        if p.out:
            n = p.sock.send(p.out)
            p.out = p.out[n:]
        self._epoll.modify(p.sock.fileno(), select.EPOLLIN | (select.EPOLLOUT if p.out else 0))

    def _finish(self, p: _Pending, out: List[Accepted]) -> None:
        fd = p.sock.fileno()
        self._epoll.unregister(fd)
        del self.pending[fd]
        tcp.tune(p.sock, self.config)
        h = p.hs.hello
        out.append(Accepted(p.sock, h.src, h.rail, h.epoch, h.expected, p.addr, p.hs.link_key))

    # ------------------------------------------------------------ endings
    def _reject(self, p: _Pending, exc: BaseException, reason: Optional[str] = None) -> None:
        fd = p.sock.fileno()
        if self.pending.pop(fd, None) is None:
            return
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass
        if reason is None:
            reason = ("auth" if isinstance(exc, AuthError) else "route" if isinstance(exc, RailMismatch)
                      else "later" if isinstance(exc, NotYet)
                      else "handshake" if isinstance(exc, HandshakeError) else "closed")
        if isinstance(exc, AuthError) and exc.peer is not None:
            self.auth_failures[exc.peer] = self.auth_failures.get(exc.peer, 0) + 1
        self.rejected_by[reason] = self.rejected_by.get(reason, 0) + 1  # (before the total: readers poll it)
        if reason != "later":  # (not a failure: see NotYet)
            self.rejected += 1  # counted before the other side can see the close
        self._log(p, reason, exc)
        if p.hs.state == "failed" and not p.out:  # best effort: tell the dialer why
            rest = p.hs.data_to_send()
            if rest:
                try:
                    p.sock.send(rest)
                except OSError:
                    pass
        p.sock.close()

    def _log(self, p: _Pending, reason: str, exc: BaseException) -> None:
        if reason == "later":  # a backup dialed before our start-up ended: its dialer comes back
            log.debug("rank %d: not yet accepting a connection from %s (%s)", self.auth.rank,
                      p.addr[0] if p.addr else "?", exc)
            return
        if reason == "closed" and p.hs.progress >= 1:
            # A rank of this job (its HELLO showed the key) that went away mid-handshake: a job
            # closing while its backups are dialed, or a dialer that gave up at its deadline. Not a
            # stranger: no warning (a 32-rank job closed right after start-up warned on a third of
            # its ranks); still counted in ``rejected_by``.
            log.info("rank %d: rank %d's connection on rail %d closed before its handshake ended (%s)",
                     self.auth.rank, p.hs.hello.src, p.hs.hello.rail, exc)
            return
        now = time.monotonic()
        if now - self._log_at < LOG_INTERVAL:
            self._log_quiet += 1
            return
        more = f" ({self._log_quiet} more since the last report)" if self._log_quiet else ""
        log.warning("rank %d: rejected a connection from %s:%s (%s: %s)%s; %d rejected in all",
                    self.auth.rank, p.addr[0] if p.addr else "?", p.addr[1] if p.addr else "?", reason, exc, more,
                    self.rejected)
        self._log_at = now
        self._log_quiet = 0

    def _evict(self) -> None:
        if not self.pending:
            return
        per_host: Dict[str, int] = {}
        per_link: Dict[Tuple[int, int], int] = {}
        for q in self.pending.values():
            per_host[q.addr[0]] = per_host.get(q.addr[0], 0) + 1
            if q.hs.progress == 1:
                link = (q.hs.hello.src, q.hs.hello.rail)
                per_link[link] = per_link.get(link, 0) + 1

        def order(q: _Pending):
            """Least advanced first. Without a HELLO: from an address no
            expected dialer uses first, then from the host holding the most
            slots (a flood from one host before a peer's one dial). With a
            HELLO that showed the key: a second dial for the same link
            first (the dialer gave up on the older). Then the oldest."""
            progress = q.hs.progress
            if progress == 0:
                return (0, q.addr[0] in self.dialer_hosts, -per_host[q.addr[0]], q.started)
            if progress == 1:
                return (1, False, -per_link[(q.hs.hello.src, q.hs.hello.rail)], q.started)
            return (progress, False, 0, q.started)
        victim = min(self.pending.values(), key=order)
        self._reject(victim, HandshakeError(f"{self.limit} handshakes pending: the least advanced made room"),
                     reason="evicted")

    def _expire(self) -> None:
        now = self.clock()
        for p in [q for q in self.pending.values() if q.hs.expired(now)]:
            self._reject(p, HandshakeError(f"no handshake within {self.timeout:.3g}s"), reason="timeout")

    def _arm(self) -> None:
        if self._timer is None:
            return
        if not self.pending:
            self._timer.arm(None)
            return
        first = min(p.hs.deadline for p in self.pending.values())
        self._timer.arm(first - self.clock() + 1e-3)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for p in list(self.pending.values()):
            p.sock.close()
        self.pending.clear()
        self._epoll.close()
        if self._timer is not None:
            self._timer.close()


__all__ = ["Acceptor", "Accepted", "Admit", "LOG_INTERVAL"]
