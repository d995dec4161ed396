"""The progress engine: turns posted messages into frames on links, and frames
from links into bytes in the caller's memory.

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
from ..errors import (CollectiveMismatch, CommClosed, CommTimeout, LinkEscapeError, LinkFailure, PeerLost,
                      ProtocolError)
from ..protocol.channel import AHEAD, DUPLICATE, NEW, address_range
from ..protocol.frames import FLAG_ACK_NOW, P2P_FLAG, Header, Kind, pack_header
from ..protocol.linkstate import Ev, PathPolicy, State
from ..transport.tcp import ack_silence, tcp_info_summary
from .link import Link, WireItem, is_disconnect
from .messages import InMessage, Op, OutMessage
from .peer import Peer, Unexpected

log = logging.getLogger("linkescape.engine")

POLLIN = select.POLLIN
POLLOUT = select.POLLOUT
POLLERR = select.POLLERR | select.POLLHUP | select.POLLNVAL
_CAUSE = {Ev.CARRIER_DOWN: "carrier", Ev.PEER_CARRIER_DOWN: "peer_carrier", Ev.SOCKET_ERROR: "socket_error",
          Ev.TIMEOUT: "timeout"}


class Engine:
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
        #: work other threads hand to whoever drives progress (never block them on the lock)
        self._soon: "collections.deque" = collections.deque()
        self._waiters = 0
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
            peer.eof_rails.discard(link.rail)
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
        peer.eof_rails.discard(link.rail)
        peer.eof_since = None
        peer.refused.discard(link.rail)
        if peer.send.acked < peer_expected - 1 <= peer.send.last_seq:
            peer.send.on_ack(peer_expected - 1)  # the peer has all below: replay less
        self._emit("link_up", peer.rank, link.rail, _CAUSE.get(cause), epoch=link.epoch)
        self._reroute(peer, now, cause=_CAUSE.get(cause))
        self._pump(peer)

    def notify_peers(self, kind: int, rail: int) -> None:
        """Tell every peer, over any surviving link, about our NIC on ``rail``."""
        for peer in self.peers.values():
            links = [l for l in peer.live_links() if l.rail != rail]
            if not links:
                continue
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
    def _acquire(self) -> None:
        if not self.lock.acquire(blocking=False):
            self._waiters += 1
            try:
                self.wake()  # whoever holds it may sit in poll(): make it let go
                self.lock.acquire()
            finally:
                self._waiters -= 1

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` under the lock in the next progress round, from any
        thread, without waiting for the lock (the driver may hold it for long)."""
        self._soon.append(fn)
        self.wake()

    def _run_soon(self) -> None:
        soon = self._soon
        while soon:
            fn = soon.popleft()
            try:
                fn()
            except LinkEscapeError as exc:
                self._set_fatal(exc)

    def start(self, op: Op) -> None:
        """Hand an asynchronous op (messages attached) to the engine; the
        background thread drives it until someone waits."""
        self._acquire()
        try:
            self._start_locked(op)
        finally:
            self.lock.release()
        self.wake()

    def run(self, op: Op, posted=None) -> None:
        """Start ``op`` and drive it to completion from the calling thread;
        ``posted`` (a held lock) is released once the op is in the engine."""
        with self._drivers_cv:
            self._drivers += 1
        try:
            self._acquire()
            try:
                try:
                    self._start_locked(op)
                finally:
                    if posted is not None:
                        posted.release()
                self._drive_locked(op, None)
            finally:
                self.lock.release()
        finally:
            self._driver_done()

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
        op.started = True
        if op.collective:
            self.coll_started = op.seq
        for p in op.peers:
            self._resume_parked(peers[p])
        for p in op.peers:
            self._pump(peers[p])
        self._check_op(op, time.monotonic())

    def _post_p2p_recv(self, peer: Peer, m: InMessage) -> None:
        tag = m.msg
        queue = peer.unexpected.get(tag)
        if queue and queue[0].done:
            self._take_unexpected(peer, queue.popleft(), m)
            return
        peer.p2p_recvs.setdefault(tag, __import__("collections").deque()).append(m)

    def _take_unexpected(self, peer: Peer, u: Unexpected, m: InMessage) -> None:
        if u.nbytes != m.nbytes:
            self._fail_op(m.op, CollectiveMismatch(
                f"recv of {m.nbytes} bytes from rank {peer.rank} matched a send of {u.nbytes} bytes",
                peer=peer.rank, op_seq=m.op.seq))
            return
        if m.nbytes:
            self._protect_range(m.dst)
            m.dst[:] = u.buf
        m.received = m.nbytes
        self._recv_done(peer, m)

    # ------------------------------------------------------------ sending
    def _pump(self, peer: Peer) -> None:
        if not peer.active:
            return
        links = [peer.links[r] for r in peer.active]
        links = [l for l in links if l is not None]
        if not links:
            return
        if peer.replay:
            peer.replay = False
            ack = peer.recv.cumulative_ack
            for i, frame in enumerate(peer.send.unacked):
                link = links[i % len(links)]
                link.queue(WireItem(pack_header(Kind.DATA, frame.seq, ack, frame.msg, frame.offset, frame.length,
                                                frame.sig, arg=frame.arg, flags=frame.flags), frame))
            peer.recv.ack_sent_upto(ack)
        sendq = peer.sendq
        chunk = self.config.chunk_bytes
        copy_bytes = self.config.copy_bytes
        schan = peer.send
        while sendq:
            m = sendq[0]
            if m.carved >= m.ready and m.nbytes:
                break
            if len(links) == 1:
                link = links[0]
            else:
                link = min(links, key=lambda l: l.out_bytes)
            if link.out_bytes >= self.watermark:
                break
            n = min(chunk, m.ready - m.carved)
            off = m.carved
            copy = n <= copy_bytes
            frame = schan.emit(m.msg, m.sig, off, m.view[off:off + n], copy=copy)
            frame.arg = m.nbytes
            op = m.op
            op.last_seq[peer.rank] = frame.seq
            flags = 0 if copy and not op.need_ack else FLAG_ACK_NOW
            frame.flags = flags
            ack = peer.recv.cumulative_ack
            link.queue(WireItem(pack_header(Kind.DATA, frame.seq, ack, m.msg, off, n, m.sig, arg=m.nbytes,
                                            flags=flags), frame))
            peer.recv.ack_sent_upto(ack)
            m.carved += n
            if m.carved == m.nbytes:
                sendq.popleft()
        for link in links:
            if link.out:
                self._flush(link)

    def _flush(self, link: Link) -> None:
        try:
            emptied = link.flush()
        except OSError as exc:
            self.link_down(link, Ev.SOCKET_ERROR, detail=f"send: {exc}")
            return
        link.last_sent = time.monotonic()
        want = POLLIN if emptied else POLLIN | POLLOUT
        if link.parked:
            want &= ~POLLIN
        if self.masks.get(link.fd) != want:
            self.masks[link.fd] = want
            self.poller.modify(link.fd, want)

    def _set_reading(self, link: Link, reading: bool) -> None:
        want = (POLLIN if reading else 0) | (POLLOUT if link.out else 0)
        if self.masks.get(link.fd) != want:
            self.masks[link.fd] = want
            self.poller.modify(link.fd, want)

    # ------------------------------------------------------------ receiving
    def _on_readable(self, link: Link) -> None:
        peer = self.peers[link.peer]
        if link.parked:
            return  # waiting for an earlier frame or a posted receive
        try:
            while True:
                if link.hdr is None:
                    hdr = link.read_header()
                    if hdr is None:
                        continue
                    link.last_heard = time.monotonic()
                    if hdr.ack:
                        peer.send.on_ack(hdr.ack)
                    if hdr.kind != Kind.DATA:
                        self._on_control(peer, link, hdr)
                        if link.status.state is not State.UP:
                            return
                        continue
                    link.hdr = hdr
                    if not self._bind(peer, link):
                        return
                if link.sink_got < len(link.sink):
                    if not link.read_payload():
                        continue
                link.last_heard = time.monotonic()
                self._deliver(peer, link)
        except (BlockingIOError, InterruptedError):
            return
        except LinkEscapeError as exc:
            self._set_fatal(exc)
        except OSError as exc:
            if is_disconnect(exc):
                self._on_disconnect(peer, link, exc)
            else:
                raise
        except Exception as exc:  # LinkClosed
            if is_disconnect(exc):
                self._on_disconnect(peer, link, exc)
            else:
                raise

    def _on_disconnect(self, peer: Peer, link: Link, exc: BaseException) -> None:
        if peer.closed_by_peer:
            self._drop_link(link)
            return
        peer.eof_rails.add(link.rail)
        self.link_down(link, Ev.SOCKET_ERROR, detail=f"{type(exc).__name__}: {exc}")
        # Every link ended with FIN/RST. A dead process also lost its listener:
        # the dialing side learns that at once (connection refused on every
        # rail); the accepting side waits briefly for a re-dial, which a live
        # peer that merely dropped a link it believed dead would make.
        if not peer.live_links() and peer.lost is None and peer.eof_since is None:
            peer.eof_since = time.monotonic()
            if self.rank > peer.rank:
                for st in peer.status:
                    if st.state is State.DOWN:
                        st.next_probe = time.monotonic()
                if self.on_redial is not None:
                    self.on_redial()

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

    def _on_control(self, peer: Peer, link: Link, hdr: Header) -> None:
        if hdr.kind == Kind.BYE:
            # The peer drained before saying BYE: whatever we still wait for
            # from it will never come.
            peer.closed_by_peer = True
            peer.lost = PeerLost(f"rank {peer.rank} closed its communicator", peer=peer.rank)
            self._fail_ops_needing(peer, peer.lost)
        elif hdr.kind == Kind.NOTIFY_DOWN:
            other = peer.links[hdr.arg] if hdr.arg < len(peer.links) else None
            peer.peer_carrier_down[hdr.arg] = True
            if other is not None:
                self.link_down(other, Ev.PEER_CARRIER_DOWN, detail="peer NIC lost carrier")
        elif hdr.kind == Kind.NOTIFY_UP:
            peer.peer_carrier_down[hdr.arg] = False
            if hdr.arg < len(peer.status) and peer.status[hdr.arg].state is State.DOWN:
                peer.status[hdr.arg].next_probe = time.monotonic()
                peer.status[hdr.arg].backoff = 0.0
                if self.on_redial is not None:
                    self.on_redial()
        # ACK and HEARTBEAT: the ack in the header and last_heard are all they carry

    def _bind(self, peer: Peer, link: Link) -> bool:
        """Decide where the current frame's payload goes; False to park."""
        hdr = link.hdr
        cls = peer.recv.classify(hdr.seq)
        if cls is DUPLICATE:
            # a replay of something we have: our ack may have died with a link
            link.binding = None
            link.sink = self._discard(hdr.length)
            peer.recv.ack_sent = 0
            peer.ack_urgent = True
        elif cls is AHEAD:
            return self._park(link)
        else:
            cur = peer.cur_in
            if cur is None:
                cur = self._match(peer, hdr)
                if cur is None:
                    return self._park(link)
                peer.cur_in = cur
            elif cur.msg != hdr.msg or cur.received != hdr.offset:
                raise ProtocolError(f"frame of message {hdr.msg:#x} at offset {hdr.offset} while "
                                    f"{cur.msg:#x} is at {cur.received}", peer=peer.rank, rail=link.rail)
            if hdr.offset + hdr.length > cur.nbytes:
                raise CollectiveMismatch(
                    f"rank {peer.rank} sent {hdr.offset + hdr.length} bytes where {cur.nbytes} were expected",
                    peer=peer.rank, op_seq=hdr.msg)
            link.binding = cur
            if isinstance(cur, Unexpected):
                link.sink = cur.buf[hdr.offset:hdr.offset + hdr.length]
            elif cur.reduce is not None:
                link.sink = link.staging_view(hdr.length)
            else:
                sink = cur.dst[hdr.offset:hdr.offset + hdr.length]
                self._protect_range(sink)
                link.sink = sink
        if link.parked:
            link.parked = False
            self._set_reading(link, True)
        link.sink_got = 0
        return True

    def _park(self, link: Link) -> bool:
        if not link.parked:
            link.parked = True
            self._set_reading(link, False)
        return False

    def _match(self, peer: Peer, hdr: Header):
        if hdr.offset != 0:
            raise ProtocolError(f"message {hdr.msg:#x} starts at offset {hdr.offset}", peer=peer.rank)
        if hdr.msg & P2P_FLAG:
            queue = peer.p2p_recvs.get(hdr.msg)
            if queue:
                m = queue.popleft()
                if m.nbytes != hdr.arg:
                    raise CollectiveMismatch(
                        f"recv of {m.nbytes} bytes from rank {peer.rank} matched a send of {hdr.arg} bytes",
                        peer=peer.rank, op_seq=m.op.seq)
                return m
            u = Unexpected(hdr.msg, hdr.sig, hdr.arg)
            peer.unexpected.setdefault(hdr.msg, __import__("collections").deque()).append(u)
            return u
        if not peer.coll_recvs or peer.coll_recvs[0].msg > hdr.msg:
            if hdr.msg <= self.coll_started:
                raise CollectiveMismatch(
                    f"rank {peer.rank} sent data for collective #{hdr.msg}, in which rank {self.rank} expects "
                    f"nothing from it (different operation, root or group)", peer=peer.rank, op_seq=hdr.msg)
            return None
        m = peer.coll_recvs[0]
        if m.msg != hdr.msg or m.sig != hdr.sig or m.nbytes != hdr.arg:
            raise CollectiveMismatch(_mismatch_text(self.rank, peer.rank, m, hdr), peer=peer.rank, op_seq=m.op.seq)
        peer.coll_recvs.popleft()
        return m

    def _discard(self, n: int) -> memoryview:
        if len(self.scratch) < n:
            self.scratch = memoryview(bytearray(n))
        return self.scratch[:n]

    def _deliver(self, peer: Peer, link: Link) -> None:
        hdr = link.hdr
        m = link.binding
        if m is not None and hdr.seq != peer.recv.expected:
            m = None  # another link delivered this frame first: a duplicate now
        if m is not None:
            peer.recv.applied(hdr.seq)
            if hdr.flags & FLAG_ACK_NOW:
                peer.ack_urgent = True  # the sender waits for it
            if isinstance(m, Unexpected):
                m.received += hdr.length
                if m.received == m.nbytes:
                    m.done = True
                    peer.cur_in = None
                    queue = peer.p2p_recvs.get(m.msg)
                    if queue:
                        peer.unexpected[m.msg].remove(m)
                        self._take_unexpected(peer, m, queue.popleft())
            else:
                if m.reduce is not None and hdr.length:
                    m.reduce(hdr.offset, link.sink)
                m.received += hdr.length
                if m.on_frame is not None:
                    m.on_frame(m.received)
                if m.received == m.nbytes:
                    peer.cur_in = None
                    self._recv_done(peer, m)
            # A copy of this frame half-read on another (failing) link must
            # never land in memory that may be reused from now on.
            for other in peer.links:
                if (other is not None and other is not link and other.binding is not None
                        and other.hdr is not None and other.hdr.seq < peer.recv.expected):
                    other.binding = None
                    other.sink = self._discard(len(other.sink))
        link.reset_read()
        # the next frame may be for a message that is posted now
        if peer.cur_in is None:
            self._resume_parked(peer, skip=link)

    def _recv_done(self, peer: Peer, m: InMessage) -> None:
        m.done = True
        op = m.op
        op.pending_recvs -= 1
        if op.pending_recvs == 0:
            self._check_op(op, time.monotonic())

    def _resume_parked(self, peer: Peer, skip: Optional[Link] = None) -> None:
        for link in peer.links:
            if link is not None and link.parked and link is not skip and link.hdr is not None:
                try:
                    if self._bind(peer, link):
                        pass  # reading resumes through poll
                except LinkEscapeError as exc:
                    self._set_fatal(exc)

    # ------------------------------------------------------------ memory safety
    def _protect_range(self, view: memoryview) -> None:
        """Before caller memory is overwritten, turn zero-copy frames that
        point into it into copies, so a replay sends the original bytes."""
        lo = None
        for peer in self.peers.values():
            if peer.send.zc:
                if lo is None:
                    if not len(view):
                        return
                    lo, hi = address_range(view)
                peer.send.materialize(lo, hi)

    def protect_buffer(self, view: memoryview) -> None:
        with self.lock:
            self._protect_range(view)

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
        self._complete(op)

    def _set_fatal(self, exc: BaseException) -> None:
        if self.fatal is None:
            self.fatal = exc
            log.error("communicator failed: %s", exc)
        for op in list(self.ops):
            self._fail_op(op, exc)

    # ------------------------------------------------------------ the loop
    def progress_once(self, timeout: float) -> None:
        """One round: poll, read, write, timers. Caller holds the lock."""
        try:
            events = self.poller.poll(max(0.0, timeout) * 1000.0)
        except InterruptedError:
            events = []
        if self._soon:
            self._run_soon()
        by_fd = self.by_fd
        for fd, ev in events:
            link = by_fd.get(fd)
            if link is None:
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                elif fd in self.extra_fds:
                    self.extra_fds[fd](ev)
                continue
            if link.parked and ev & POLLERR:
                # A parked link is not read, so an error would go unseen.
                import socket as _socket

                err = link.sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
                self._on_disconnect(self.peers[link.peer], link, ConnectionResetError(
                    err, f"error on a parked link: poll {ev:#x}, {os.strerror(err) if err else 'no error'}"))
                continue
            if ev & POLLIN or (ev & POLLERR and not ev & POLLOUT):
                self._on_readable(link)
                if by_fd.get(fd) is not link:
                    continue
            if ev & POLLOUT:
                self._flush(link)
            elif ev & POLLERR and by_fd.get(fd) is link:
                self._on_disconnect(self.peers[link.peer], link, ConnectionResetError("POLLERR/POLLHUP"))
        now = time.monotonic()
        for peer in self.peers.values():
            if peer.sendq or peer.replay:
                self._pump(peer)
            if peer.ack_urgent and peer.recv.ack_owed:
                self._send_ack(peer)
        if self.ops:
            for op in list(self.ops):
                if not op.done:
                    self._check_op(op, now)
                if not op.done and now > op.deadline:
                    self._timeout_op(op, now)
        if now >= self._next_timer:
            self._next_timer = now + min(0.01, self.config.heartbeat_interval / 2)
            self._timers(now)

    def _send_ack(self, peer: Peer) -> None:
        links = [peer.links[r] for r in peer.active if peer.links[r] is not None]
        if not links:
            return
        link = links[0]
        peer.ack_urgent = False
        ack = peer.recv.cumulative_ack
        link.queue_control(Kind.ACK, ack)
        peer.recv.ack_sent_upto(ack)
        self._flush(link)

    def _timers(self, now: float) -> None:
        hb = self.config.heartbeat_interval
        for peer in self.peers.values():
            for link in peer.links:
                if link is None or link.status.state is not State.UP:
                    continue
                if now - link.last_sent >= hb and not link.out:
                    link.queue_control(Kind.HEARTBEAT, peer.recv.cumulative_ack)
                    peer.recv.ack_sent_upto(peer.recv.cumulative_ack)
                    self._flush(link)
                    if peer.links[link.rail] is not link:
                        continue
                # Silent loss: our bytes (data or a heartbeat) stay unacknowledged
                # by the peer's kernel. Kernel acks keep coming while the peer
                # process is busy, so only the path can trip this.
                try:
                    silent = ack_silence(link.sock)
                except OSError:
                    silent = 0.0
                if silent > self.config.silent_timeout:
                    self.link_down(link, Ev.TIMEOUT, detail=f"no acknowledgement for {silent:.3f}s "
                                                            f"({tcp_info_summary(link.sock)})")
            if peer.no_path_since is not None and peer.lost is None:
                if peer.eof_since is not None and now - peer.eof_since > self.config.peer_lost_timeout * 0.75:
                    self._peer_lost(peer, f"rank {peer.rank} closed every link and did not come back")
                elif now - peer.no_path_since > self.config.no_path_timeout:
                    self._no_path_expired(peer, now)
                elif self._silent_everywhere(peer):
                    self._peer_lost(peer, f"rank {peer.rank} stopped answering on every rail at once", "timeout")
            elif peer.active:
                best = self.policy.choose(peer.status, now)
                if best != peer.active:
                    self._reroute(peer, now)
                    self._pump(peer)
            if peer.recv.ack_owed:
                self._send_ack(peer)
        for tick in self.tickers:
            tick(now)

    def _silent_everywhere(self, peer: Peer) -> bool:
        """Every rail went silent within a short window, with no carrier
        loss on either side: the peer (process or host), not the network."""
        sts = peer.status
        if len(sts) < 2:
            return False  # one rail: a silent peer and a dead rail look the same
        if any(st.down_cause is not Ev.TIMEOUT or st.state is State.UP for st in sts):
            return False
        if any(peer.peer_carrier_down.get(st.rail) for st in sts):
            return False
        times = [st.since for st in sts]
        return max(times) - min(times) <= self.config.peer_lost_timeout

    def _no_path_expired(self, peer: Peer, now: float) -> None:
        since = time.time() - (now - peer.no_path_since)
        err = LinkFailure(f"no path to rank {peer.rank} on any rail {list(range(self.nrails))} since "
                          f"{time.strftime('%H:%M:%S', time.localtime(since))}", peer=peer.rank,
                          rails=list(range(self.nrails)), since=since)
        peer.lost = err
        self._fail_ops_needing(peer, err)

    def _timeout_op(self, op: Op, now: float) -> None:
        waiting = sorted({m.peer for m in op.recvs if not m.done} |
                         {m.peer for m in op.sends if m.carved < m.nbytes})
        self._fail_op(op, CommTimeout(f"{op.name} (op {op.seq}) timed out waiting for ranks {waiting}",
                                      peers=waiting, op_seq=op.seq))

    # ------------------------------------------------------------ driving
    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def wait(self, op: Op, timeout: Optional[float] = None) -> bool:
        """Drive progress until ``op`` is done; False on timeout."""
        if op.done:
            return True
        with self._drivers_cv:
            self._drivers += 1
        try:
            self._acquire()
            try:
                return self._drive_locked(op, None if timeout is None else time.monotonic() + timeout)
            finally:
                self.lock.release()
        finally:
            self._driver_done()

    def _drive_locked(self, op: Op, end: Optional[float]) -> bool:
        while not op.done:
            if self._waiters:
                # Another thread wants the lock (to post, or to wait on its own
                # op): let it in between two rounds.
                self.lock.release()
                time.sleep(0.0002)
                self.lock.acquire()
                continue
            now = time.monotonic()
            left = 0.05 if end is None else min(0.05, end - now)
            if left <= 0:
                return False
            if op.settle_until is not None:
                left = min(left, max(0.0, op.settle_until - now))
            left = min(left, max(0.0, self._next_timer - now))
            if self.spin:
                # Poll without sleeping for a few microseconds first: a reply
                # usually comes within a round trip, and waking up from a
                # blocking poll costs more than that. Only when this rank has
                # a core to itself (see Communicator).
                spin_end = now + self.spin
                while not op.done and time.monotonic() < spin_end:
                    self.progress_once(0.0)
                if op.done:
                    break
            self.progress_once(left)
        return True

    def _driver_done(self) -> None:
        with self._drivers_cv:
            self._drivers -= 1
            if not self._drivers and self._async_work():
                self._drivers_cv.notify_all()  # hand async work back to the progress thread
        if not self._drivers and self._async_work():
            self.wake()

    def _async_work(self) -> bool:
        return bool(self.ops) or any(p.sendq or p.replay for p in self.peers.values())

    def start_background(self) -> None:
        self._thread = threading.Thread(target=self._background, name=f"linkescape-progress-{self.rank}",
                                        daemon=True)
        self._thread.start()

    def _background(self) -> None:
        """Drive async operations while nobody waits; otherwise tick timers.

        While a caller drives, this thread stays off the lock and off the
        links, so frames wake exactly one thread."""
        while not self.closed:
            if self._drivers:
                # A caller drives (and runs the timers): stay out of its way.
                with self._drivers_cv:
                    if self._drivers and not self.closed:
                        self._drivers_cv.wait(0.1)
                continue
            if not self._async_work():
                try:
                    ready = self.idle_poller.poll(max(0.0, self._next_timer - time.monotonic()) * 1000.0)
                except (InterruptedError, RuntimeError):
                    ready = []
                for fd, _ in ready:
                    if fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except OSError:
                            pass
                if self._drivers or self.closed:
                    continue
                if self.lock.acquire(blocking=False):
                    try:
                        if not self.closed and not self._drivers:
                            self.progress_once(0.0)
                    except Exception as exc:  # noqa: BLE001
                        log.exception("progress failed")
                        self._set_fatal(exc)
                    finally:
                        self.lock.release()
                continue
            if not self.lock.acquire(timeout=0.05):
                continue
            try:
                if not self.closed and not self._drivers:
                    self.progress_once(min(0.01, max(0.0, self._next_timer - time.monotonic())))
            except Exception as exc:  # noqa: BLE001 - never die silently: fail the ops instead
                log.exception("progress failed")
                self._set_fatal(exc)
            finally:
                self.lock.release()

    def close(self, graceful: bool = True, drain: float = 10.0) -> None:
        """Graceful: deliver everything still unacknowledged, say BYE on every
        link, half-close and wait for the peer's EOF, so no RST can destroy
        bytes the peer has not read yet."""
        self._acquire()
        try:
            if self.closed:
                return
            if graceful and self.fatal is None:
                self._drain(time.monotonic() + drain)
                self._goodbye(time.monotonic() + 2.0)
            self.closed = True
            for peer in self.peers.values():
                for link in peer.links:
                    if link is not None:
                        self._drop_link(link)
            for link in self.severed:
                link.close()
            for op in list(self.ops):
                self._fail_op(op, CommClosed("communicator closed while the operation was running"))
        finally:
            self.lock.release()
        self.wake()
        with self._drivers_cv:
            self._drivers_cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _drain(self, deadline: float) -> None:
        def pending() -> bool:
            return any((p.sendq or p.send.unacked) and p.lost is None and p.active for p in self.peers.values())
        for peer in self.peers.values():
            peer.ack_urgent = True
        while pending() and time.monotonic() < deadline:
            self.progress_once(0.01)

    def _goodbye(self, deadline: float) -> None:
        import socket as _socket

        links = []
        for peer in self.peers.values():
            for link in peer.links:
                if link is not None:
                    link.queue_control(Kind.BYE, peer.recv.cumulative_ack, arg=peer.send.last_seq)
                    links.append(link)
        for link in links:
            try:
                while not link.flush():
                    if time.monotonic() > deadline:
                        break
                    select.select([], [link.fd], [], 0.01)
                link.sock.shutdown(_socket.SHUT_WR)
            except OSError:
                pass
        # Read (and drop) until the peer's EOF, so closing sends a FIN, not a RST.
        for link in links:
            try:
                link.sock.setblocking(False)
                while time.monotonic() < deadline:
                    r, _, _ = select.select([link.fd], [], [], max(0.0, deadline - time.monotonic()))
                    if not r:
                        break
                    if not link.sock.recv(1 << 16):
                        break
            except OSError:
                pass


def _mismatch_text(rank: int, peer: int, m: InMessage, hdr: Header) -> str:
    if m.msg != hdr.msg:
        return (f"rank {peer} is at collective #{hdr.msg} while rank {rank} is at #{m.msg}: "
                f"the ranks called a different number or sequence of collectives")
    if m.sig != hdr.sig:
        return (f"collective #{m.msg} differs between rank {rank} and rank {peer} "
                f"(operation, dtype, reduce op, root or shape: signature {m.sig:#010x} vs {hdr.sig:#010x})")
    return f"collective #{m.msg}: rank {peer} sends {hdr.arg} bytes where rank {rank} expects {m.nbytes}"
