"""The progress engine: turns posted messages into frames on links, and frames
from links into bytes in the caller's memory. This module holds its state,
links and operations; ``datapath`` moves frames, ``loop`` drives progress.

Threading: every socket is non-blocking and every state change happens under
``self.lock``. A caller that waits for an operation drives progress itself
(lowest latency); when nobody waits, a background thread does (async
operations, heartbeats, acks, failure detection).
"""

from __future__ import annotations

import collections
import logging
import os
import select
import threading
import time
from typing import Callable, Dict, List, Optional

from ..config import Config
from ..errors import (CommClosed, PeerLost)
from ..protocol.frames import P2P_FLAG
from ..protocol.linkstate import Ev, PathPolicy
from .link import Link
from .messages import Op
from .datapath import DataPath
from .loop import Loop
from .peer import Peer

log = logging.getLogger("linkescape.engine")

POLLIN = select.POLLIN
POLLOUT = select.POLLOUT
POLLERR = select.POLLERR | select.POLLHUP | select.POLLNVAL
_CAUSE = {Ev.CARRIER_DOWN: "carrier", Ev.PEER_CARRIER_DOWN: "peer_carrier", Ev.SOCKET_ERROR: "socket_error",
          Ev.TIMEOUT: "timeout"}


class Engine(DataPath, Loop):
    def __init__(self, rank: int, world_size: int, nrails: int, config: Config, events=None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.nrails = nrails
        self.config = config
        self.events = events
        self.peers: Dict[int, Peer] = {p: Peer(p, nrails) for p in range(world_size) if p != rank}
        self.policy = PathPolicy(primary=0, holddown=config.failback_holddown, stripe=config.policy == "stripe")
        self.lock = threading.RLock()
        self.poller = select.poll()
        self.by_fd: Dict[int, Link] = {}
        self.masks: Dict[int, int] = {}
        self.extra_fds: Dict[int, Callable[[int], None]] = {}
        self.ops: List[Op] = []
        #: sequence number of the last collective started here
        self.coll_started = 0
        self.fatal: Optional[BaseException] = None
        self.closed = False
        self.scratch = memoryview(bytearray(1 << 16))
        #: links cut by an emulated fault: unused, closed when the rail returns
        self.severed: List[Link] = []
        #: bytes moved by links that are closed now, per rail (for rail_totals)
        self._closed_sent = [0] * nrails
        self._closed_received = [0] * nrails
        self.watermark = 2 * config.chunk_bytes
        self.settle = 0.002
        #: seconds to busy-poll before blocking (0: never)
        self.spin = 0.0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.poller.register(self._wake_r, POLLIN)
        # The background thread waits on its own poll object while idle
        # (CPython forbids two threads in poll() on one object). It does not
        # watch the links: a caller driving an operation must not have a
        # second thread woken by every frame; idle input waits for the next
        # timer tick, and async operations switch the thread to busy polling.
        self.idle_poller = select.poll()
        self.idle_poller.register(self._wake_r, POLLIN)
        self._drivers = 0
        self._drivers_cv = threading.Condition(threading.Lock())
        self._thread: Optional[threading.Thread] = None
        self._next_timer = 0.0
        self._last_timers = time.monotonic()
        #: work other threads hand to whoever drives progress (never block them on the lock)
        self._soon: "collections.deque" = collections.deque()
        self._waiters = 0
        #: peer -> True (it lost every rail itself: a link failure), False
        #: (it did not: it is gone), absent (not known yet); set by Recovery
        self.isolated: Dict[int, bool] = {}
        #: asks Recovery to find out whether a silent peer is isolated
        self.on_suspect: Optional[Callable[[int], None]] = None
        #: called when a down link should be re-dialed now (set by Recovery)
        self.on_redial: Optional[Callable[[], None]] = None
        #: hooks for the failover layer (reconnects, carrier) run on every timer tick
        self.tickers: List[Callable[[float], None]] = []

    # ------------------------------------------------------------ links
    def add_link(self, link: Link) -> None:
        with self.lock:
            peer = self.peers[link.peer]
            old = peer.links[link.rail]
            if old is not None:
                self._drop_link(old)
            peer.links[link.rail] = link
            self.by_fd[link.fd] = link
            self.masks[link.fd] = POLLIN
            self.poller.register(link.fd, POLLIN)
            self._reroute(peer, time.monotonic())
        self.wake()

    def rail_totals(self) -> List[tuple]:
        """(sent, received) bytes per rail, over every link ever opened on it."""
        sent, received = list(self._closed_sent), list(self._closed_received)
        for peer in self.peers.values():
            for link in peer.links:
                if link is not None:
                    sent[link.rail] += link.bytes_sent
                    received[link.rail] += link.bytes_received
        return list(zip(sent, received))

    def snapshot(self) -> dict:
        """A copy of this rank's link and channel state (metrics, status, flight recorder)."""
        now = time.monotonic()
        peers = {}
        for rank, peer in self.peers.items():
            links = []
            for rail, st in enumerate(peer.status):
                sent, received = peer.rail_bytes(rail)
                links.append({
                    "rail": rail,
                    "state": st.state.value,
                    "usable": st.state.value == "up" and peer.links[rail] is not None,
                    "active": rail in peer.active,
                    "bytes_sent": sent,
                    "bytes_received": received,
                    "failures": st.failures,
                    "down_cause": _CAUSE.get(st.down_cause),
                    "since_s": now - st.since if st.since else None,
                })
            peers[rank] = {
                "peer": rank,
                "primary": peer.active[0] if peer.active else None,
                "active": list(peer.active),
                "sent": peer.send.last_seq,
                "acked": peer.send.acked,
                "received": peer.recv.cumulative_ack,
                "unacked_bytes": peer.send.inflight_bytes,
                "no_path_s": None if peer.no_path_since is None else now - peer.no_path_since,
                "lost": None if peer.lost is None else f"{type(peer.lost).__name__}: {peer.lost}",
                "links": links,
            }
        return {"rank": self.rank, "world_size": self.world_size, "rails": self.nrails,
                "ops_pending": len(self.ops), "peers": peers}

    def add_fd(self, fd: int, handler: Callable[[int], None]) -> None:
        """Watch another descriptor (carrier monitor, listener) from both loops."""
        with self.lock:
            self.extra_fds[fd] = handler
            self.poller.register(fd, POLLIN)
            self.idle_poller.register(fd, POLLIN)
        self.wake()

    def remove_fd(self, fd: int) -> None:
        with self.lock:
            self.extra_fds.pop(fd, None)
            for poller in (self.poller, self.idle_poller):
                try:
                    poller.unregister(fd)
                except (KeyError, ValueError, OSError):
                    pass

    def _drop_link(self, link: Link, close: bool = True) -> None:
        log.debug("drop link to rank %d rail %d (fd %d)", link.peer, link.rail, link.fd)
        if self.by_fd.get(link.fd) is link:
            for poller in (self.poller, self.idle_poller):
                try:
                    poller.unregister(link.fd)
                except (KeyError, ValueError, OSError):
                    pass
            del self.by_fd[link.fd]
            self.masks.pop(link.fd, None)
        peer = self.peers[link.peer]
        if peer.links[link.rail] is link:
            peer.links[link.rail] = None
            self._closed_sent[link.rail] += link.bytes_sent
            self._closed_received[link.rail] += link.bytes_received
            peer.closed_sent[link.rail] += link.bytes_sent
            peer.closed_received[link.rail] += link.bytes_received
        if close:
            link.close()
        else:
            self.severed.append(link)  # an emulated cut: silent, as a real one

    def adopt_link(self, link: Link, peer_expected: int) -> None:
        """A re-opened link (either side dialed): put it in service."""
        peer = self.peers[link.peer]
        now = time.monotonic()
        old = peer.links[link.rail]
        if old is not None:
            # the peer re-dialed, so it considers the old connection dead
            self.link_down(old, Ev.SOCKET_ERROR, detail="replaced by a new connection")
        cause = link.status.down_cause
        link.status.apply(Ev.CONNECTED, now)
        peer.links[link.rail] = link
        self.by_fd[link.fd] = link
        self.masks[link.fd] = POLLIN
        self.poller.register(link.fd, POLLIN)
        peer.eof_since = None
        self.isolated.pop(peer.rank, None)
        peer.refused.discard(link.rail)
        if peer.send.acked < peer_expected - 1 <= peer.send.last_seq:
            peer.send.on_ack(peer_expected - 1)  # the peer has all below: replay less
        self._emit("link_up", peer.rank, link.rail, _CAUSE.get(cause), epoch=link.epoch)
        self._reroute(peer, now, cause=_CAUSE.get(cause))
        self._pump(peer)

    def notify_peers(self, kind: int, rail: int) -> None:
        """Tell every peer, over any surviving link, about our NIC on ``rail``."""
        for peer in self.peers.values():
            self.notify(peer, kind, rail)

    def notify(self, peer: Peer, kind: int, rail: int) -> None:
        """Tell ``peer`` about ``rail`` over another rail, if one is left."""
        links = [l for l in peer.live_links() if l.rail != rail]
        if not links:
            return
        link = next((l for l in links if l.rail in peer.active), links[0])
        link.queue_control(kind, peer.recv.cumulative_ack, arg=rail)
        self._flush(link)

    def probe_failed(self, peer_rank: int, rail: int, refused: bool) -> None:
        peer = self.peers[peer_rank]
        if refused:
            peer.refused.add(rail)
        else:
            peer.refused.discard(rail)
        # Nobody listens on any rail while our NICs are fine: the process is gone.
        if (peer.no_path_since is not None and peer.lost is None
                and len(peer.refused) == self.nrails):
            self._peer_lost(peer, f"rank {peer_rank} closed every link and refuses connections on every rail")

    def link_down(self, link: Link, ev: Ev, detail: str = "", close: bool = True) -> None:
        """A link failed: drop it and move its traffic (lossless: replay).
        ``close=False`` keeps the socket open but unused (an emulated cut must
        not send a FIN that a real cut never delivers)."""
        now = time.monotonic()
        peer = self.peers[link.peer]
        was_active = link.rail in peer.active
        link.status.apply(ev, now, backoff_max=self.config.reconnect_max)
        self._drop_link(link, close=close)
        self._emit("link_down", peer.rank, link.rail, _CAUSE[ev], detail=detail)
        peer.replay = True
        # A link parked on a frame ahead may have waited for this one.
        self._resume_parked(peer)
        self._reroute(peer, now, cause=_CAUSE[ev], moved_from=link.rail if was_active else None)

    def _reroute(self, peer: Peer, now: float, cause: Optional[str] = None, moved_from: Optional[int] = None) -> None:
        old = peer.active
        new = self.policy.choose(peer.status, now)
        peer.active = new
        if not new:
            if peer.no_path_since is None:
                peer.no_path_since = now
                self._emit("no_path", peer.rank, moved_from if moved_from is not None else -1, cause or "socket_error",
                           since=time.time())
            return
        if peer.no_path_since is not None:
            peer.no_path_since = None
            peer.replay = True
        if moved_from is not None:
            peer.replay = True  # what was on the dead link is lost: resend all unacked
        if old and new != old:
            if moved_from is not None:
                self._emit("failover", peer.rank, new[0], cause or "socket_error", from_rail=moved_from)
            elif new[0] == self.policy.primary or (self.policy.stripe and len(new) > len(old)):
                self._emit("failback", peer.rank, new[0], None, from_rail=old[0])
        elif not old and moved_from is not None:
            self._emit("failover", peer.rank, new[0], cause or "socket_error", from_rail=moved_from)

    def _emit(self, event: str, peer: int, rail: int, cause: Optional[str], **extra) -> None:
        if self.events is not None:
            try:
                self.events.emit(event, peer=peer, rail=rail, cause=cause, **extra)
            except Exception:  # noqa: BLE001 - the event trail must never break the data path
                log.exception("event %s could not be recorded", event)
        else:
            log.info("%s peer=%s rail=%s cause=%s %s", event, peer, rail, cause, extra)

    # ------------------------------------------------------------ posting





    def _start_locked(self, op: Op) -> None:
        if self.fatal is not None:
            raise self.fatal
        if self.closed:
            raise CommClosed("communicator is closed")
        peers = self.peers
        for m in op.sends:
            peer = peers[m.peer]
            if peer.lost is not None:
                raise peer.lost
            op.peers.add(m.peer)
        for m in op.recvs:
            peer = peers[m.peer]
            if peer.lost is not None:
                raise peer.lost
            op.peers.add(m.peer)
        for m in op.sends:
            peers[m.peer].sendq.append(m)
        for m in op.recvs:
            peer = peers[m.peer]
            if m.msg & P2P_FLAG:
                self._post_p2p_recv(peer, m)
            else:
                peer.coll_recvs.append(m)
        self.ops.append(op)
        if op.collective:
            self.coll_started = op.seq
        for p in op.peers:
            self._resume_parked(peers[p])
        for p in op.peers:
            self._pump(peers[p])
        self._check_op(op, time.monotonic())



    # ------------------------------------------------------------ receiving


    def _peer_lost(self, peer: Peer, why: str, cause: str = "socket_error") -> None:
        peer.lost = PeerLost(why, peer=peer.rank)
        self._emit("peer_lost", peer.rank, -1, cause, detail=why)
        # A collective cannot complete without one of its members: every
        # operation fails now rather than waiting for its deadline.
        self._set_fatal(peer.lost)

    def _fail_ops_needing(self, peer: Peer, exc: BaseException) -> None:
        """Fail the operations that still need something from ``peer``."""
        rank = peer.rank
        acked = peer.send.acked
        for op in list(self.ops):
            if op.done or rank not in op.peers:
                continue
            if (any(m.peer == rank and not m.done for m in op.recvs)
                    or any(m.peer == rank and m.carved < m.nbytes for m in op.sends)
                    or (op.need_ack and op.last_seq.get(rank, 0) > acked)):
                self._fail_op(op, exc)

    # ------------------------------------------------------------ completion
    def _check_op(self, op: Op, now: float) -> None:
        if op.done or not op.transferred:
            return
        if op.need_ack:
            for p, seq in op.last_seq.items():
                if self.peers[p].send.acked < seq:
                    return
            self._complete(op)
            return
        # Settle: the caller gets its memory back only when no zero-copy frame
        # still points into it. Acks usually arrive within microseconds;
        # after a short wait the rest is copied.
        pending = False
        for p, seq in op.last_seq.items():
            schan = self.peers[p].send
            if schan.acked < seq and schan.zc:
                pending = True
                break
        if pending:
            if op.settle_until is None:
                op.settle_until = now + self.settle
                return
            if now < op.settle_until:
                return
            for lo, hi in op.ranges():
                for p in op.last_seq:
                    self.peers[p].send.materialize(lo, hi)
        self._complete(op)

    def _complete(self, op: Op) -> None:
        op.done = True
        try:
            self.ops.remove(op)
        except ValueError:
            pass
        for cb in op.callbacks:
            try:
                cb(op)
            except Exception:  # noqa: BLE001
                log.exception("completion callback failed")

    def _fail_op(self, op: Op, exc: BaseException) -> None:
        if op.done:
            return
        op.error = exc
        # What this op had posted can never be matched now.
        for m in op.sends:
            q = self.peers[m.peer].sendq
            if m in q:
                q.remove(m)
        for m in op.recvs:
            peer = self.peers[m.peer]
            if m in peer.coll_recvs:
                peer.coll_recvs.remove(m)
            for q in peer.p2p_recvs.values():
                if m in q:
                    q.remove(m)
            if peer.cur_in is m:
                peer.cur_in = None
            # A frame half-read for this receive must not land in memory the
            # caller gets back now.
            for link in peer.links:
                if link is not None and link.binding is m:
                    link.binding = None
                    link.sink = self._discard(len(link.sink))
        # ... nor may a replay later read memory the caller rewrites.
        for lo, hi in op.ranges():
            for p in op.last_seq:
                self.peers[p].send.materialize(lo, hi)
        self._complete(op)

    def _set_fatal(self, exc: BaseException) -> None:
        if self.fatal is None:
            self.fatal = exc
            log.error("communicator failed: %s", exc)
        for op in list(self.ops):
            self._fail_op(op, exc)

    # ------------------------------------------------------------ driving
